import sys

from sglang_dspark.calibrate.cli import main

sys.exit(main())
