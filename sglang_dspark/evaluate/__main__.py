import sys

from sglang_dspark.evaluate.cli import main

sys.exit(main())
