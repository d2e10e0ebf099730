"""Sequential Temperature Scaling (STS) calibration of DSpark confidences.

``python -m sglang_dspark.calibrate ...`` (see :mod:`sglang_dspark.calibrate.cli`,
docs/evaluation.md); the fit and metrics live in :mod:`sglang_dspark.calibrate.sts`.
"""

from sglang_dspark.calibrate.sts import (StsData, auc, ece, fit_sts,  # noqa: F401
                                         position_metrics, reliability_bins, survival)
