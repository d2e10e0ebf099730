"""Our DSpark worker: SGLang's DSparkWorkerV2, extended (never copied).

Installed through ``HookRegistry`` (class REPLACE of ``DSparkWorkerV2``, see
:mod:`sglang_dspark.seams`), so ``--speculative-algorithm DSPARK`` runs it on every
device.  It reports itself in SGLang's ``/server_info`` internal state under
``dspark_info_record.sglang_dspark``.
"""

from __future__ import annotations

import logging

from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

import sglang_dspark

logger = logging.getLogger(__name__)


class DSparkControlledWorker(DSparkWorkerV2):
    """DSparkWorkerV2 plus live step telemetry and controller-driven budgets."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        logger.info("sglang-dspark %s: DSparkControlledWorker active", sglang_dspark.__version__)

    def plugin_state(self) -> dict:
        return {"worker": f"{type(self).__module__}.{type(self).__qualname__}",
                "version": sglang_dspark.__version__}

    def dump_info_records(self):
        dumped = super().dump_info_records() or {}
        dumped["sglang_dspark"] = self.plugin_state()
        return dumped
