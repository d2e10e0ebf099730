"""Our DSpark worker: SGLang's DSparkWorkerV2, extended (never copied)."""

from __future__ import annotations

import logging

from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

logger = logging.getLogger(__name__)


class DSparkControlledWorker(DSparkWorkerV2):
    """DSparkWorkerV2 plus live step telemetry and controller-driven budgets."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        logger.info("sglang-dspark: DSparkControlledWorker active")
