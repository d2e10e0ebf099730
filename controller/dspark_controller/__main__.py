import sys

from dspark_controller.cli import main

sys.exit(main())
