"""The worker's side of the controller: configuration, fingerprint, telemetry.

Configured by environment variables (SGLang's public seam for plugins; every
SGLang process inherits them):

``SGLANG_DSPARK_CONTROLLER``
    the controller's worker endpoint, e.g. ``tcp://127.0.0.1:7150`` or
    ``ipc:///run/dspark/c``.  Unset: no controller, the local model decides.
``SGLANG_DSPARK_CONTROLLER_SERVER_KEY`` / ``SGLANG_DSPARK_CONTROLLER_CLIENT_KEY``
    CurveZMQ: the controller's public key (Z85 text or key file) and this client's
    secret key file; required for a controller on a non-loopback interface.
``SGLANG_DSPARK_ENGINE_ID``
    engine id prefix (default ``<host>:<port>``); ranks are appended.
``SGLANG_DSPARK_DECISION_MAX_AGE_S``
    decisions older than this (default 2 s) are ignored; the local model decides.

The decode step never waits on a socket: :class:`~dspark_controller.service.client.
ControllerClient` owns its sockets in one background thread and hands telemetry
over through a bounded queue that drops the oldest (counted).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Optional

from dspark_controller.core.sps_model import PriorCurve, SpsModel, SpsModelConfig

logger = logging.getLogger(__name__)


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def local_model_for(*, max_requests: int, max_batch_tokens: int,
                    table_path: Optional[str] = None, profile: Optional[str] = None) -> SpsModel:
    """The worker's own online model, seeded by ``profile`` (``SGLANG_DSPARK_PROFILE``, a
    profile file) or else SGLang's ``--speculative-dspark-sps-table-path`` table, if given;
    ``profile="none"`` seeds nothing even when SGLang has a table (an A/B of ours without
    a table against SGLang's planner with one, :mod:`sglang_dspark.ab`)."""
    cfg = SpsModelConfig(max_batch_tokens=max(2 * max_batch_tokens, 64),
                         max_requests=max(max_requests, 1))
    prior = None
    if profile and profile.strip().lower() == "none":
        pass
    elif profile:
        from dspark_controller.core.profile_file import load_profile

        prior = PriorCurve.from_model(load_profile(profile).model.to_model())
    elif table_path:
        try:
            prior = PriorCurve.from_sglang_table(json.loads(Path(table_path).read_text()))
        except (OSError, ValueError) as e:
            logger.warning("sglang-dspark: cannot seed the local profile from %s: %s", table_path, e)
    return SpsModel(config=cfg, prior=prior)


def _device_name(device) -> str:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"{dev.type}:{platform.machine()}:{os.cpu_count()}cores"


def engine_ranks() -> tuple[int, int]:
    """``(tp_rank, dp_rank)`` of this scheduler process, as SGLang published them
    (``sglang.srt.runtime_context.get_parallel()``).  ``dp_rank`` is the replica index
    SGLang's data-parallel controller launched the scheduler with (``--dp-size N``: 0..N-1;
    the attention-DP rank under ``--enable-dp-attention``), None without a DP controller
    (-> 0).  Neither the worker nor its model runner carries these attributes
    (``DSparkWorkerV2.__getattr__`` forwards unknown names to the target worker, which has
    none), so the engine id must come from here or every replica would be ``dp0``."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    dp_rank = parallel.dp_rank
    return int(parallel.tp_rank), 0 if dp_rank is None else int(dp_rank)


class ControllerLink:
    def __init__(self, *, client, address: str) -> None:
        self.client = client
        self.address = address
        self._seq = 0

    @classmethod
    def from_settings(cls, settings, *, worker) -> Optional["ControllerLink"]:
        """The link to ``settings.controller`` (None when unset)."""
        address = settings.controller
        if not address:
            return None
        from dspark_controller.service.client import ControllerClient
        from dspark_controller.core.profile_file import EngineFingerprint

        sa = worker.server_args
        tp_rank, dp_rank = engine_ranks()   # the engine id: <prefix>/tp<tp_rank>/dp<dp_rank>
        try:
            from importlib.metadata import version

            sgl_version = version("sglang")
        except Exception:
            sgl_version = ""
        fp = EngineFingerprint(
            target_model=str(sa.model_path), draft_model=str(sa.speculative_draft_model_path or ""),
            gamma=int(worker.verify_num_draft_tokens) - 1, device_name=_device_name(worker.device),
            tp_rank=tp_rank, tp_size=int(getattr(sa, "tp_size", 1) or 1),
            dp_rank=dp_rank, dp_size=int(getattr(sa, "dp_size", 1) or 1),
            dtype=str(getattr(sa, "dtype", "")),
            attention_backend=str(getattr(sa, "attention_backend", "") or ""),
            sglang_version=sgl_version)
        prefix = settings.engine_id or \
            f"{socket.gethostname()}:{getattr(sa, 'port', 0)}"
        engine_id = f"{prefix}/tp{tp_rank}/dp{dp_rank}"
        kw = {}
        server_key, client_key = settings.controller_server_key, settings.controller_client_key
        if server_key or client_key:
            kw = {"curve_server_key": server_key, "curve_keys": client_key}
        client = ControllerClient(address=address, fingerprint=fp, engine_id=engine_id, **kw)
        client.start()
        logger.info("sglang-dspark: controller link to %s as %s", address, engine_id)
        return cls(client=client, address=address)

    def latest_decision(self, max_age_s: float):
        return self.client.latest_decision(max_age_s)

    def fleet_model(self):
        """The controller's profile for this engine (an ``SpsModel``), or None."""
        return self.client.fleet_model()

    def publish(self, rec) -> None:
        self._seq += 1
        if not rec.step_time_s > 0:
            return
        msg = {
            "type": "step", "seq": self._seq, "num_running_requests": rec.num_requests,
            "verify_tokens": rec.verify_tokens, "step_time_s": float(rec.step_time_s),
            "context_len": {"min": rec.context_min, "mean": rec.context_mean,
                            "max": rec.context_max},
            "timestamp": rec.timestamp,
        }
        if rec.accepted_lens is not None:
            msg["accepted_lens"] = [min(int(x), 1024) for x in rec.accepted_lens]
        if rec.verify_lens is not None:
            # without them the controller would count budget truncation as rejection
            msg["verify_lens"] = [min(int(x), 1024) for x in rec.verify_lens]
        if rec.budget_tokens is not None:
            msg["budget_tokens"] = int(rec.budget_tokens)
        if rec.predicted_step_s:
            msg["predicted_step_time_s"] = float(rec.predicted_step_s)
        if getattr(rec, "uniform", False):
            msg["uniform"] = True
        self.client.publish_step(msg)

    def state(self) -> dict:
        c = self.client
        return {"address": self.address, "link_state": c.link_state,
                "controller_id": c.controller_id, "counters": dict(c.counters)}
