"""Fixtures for the controller tests (implementations live in dsc_helpers.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dsc_helpers import clients, controllers, short_tmp  # noqa: E402,F401
