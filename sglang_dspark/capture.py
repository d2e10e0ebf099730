"""Per-step capture of DSpark confidences and verification outcomes (off by default).

Set ``SGLANG_DSPARK_CAPTURE=FILE`` in the environment of an SGLang process running
our worker (:class:`sglang_dspark.worker.DSparkControlledWorker`) and every decode
step appends one JSON line to ``FILE``::

    {"step": 7, "gamma": 4, "rids": [...], "temps": [...],
     "conf_raw": [[...gamma logits...], ...],    # confidence head, before STS
     "conf":     [[...gamma probs...], ...],     # what SGLang's planner saw (after STS)
     "accepted": [...],                          # accepted draft tokens (no bonus)
     "verified": [...]}                          # draft tokens verified (no anchor)

Alignment: the row is taken from SGLang's own per-step observer call
(``DsparkStepObservers.observe_verify_step``), which receives the block's
confidences (``proposal.confidence_raw``) and *that same block's* verification
result (``accept.correct_len``) from one ``_forward_decode``.  SGLang builds no
confidence head in ``static`` verify mode; there ``conf_raw`` / ``conf`` are null.  The draft of a block
and its verification happen in the same step in ``DSparkWorkerV2``; the planner's
lag (budgets from confidences of earlier steps) does not affect this pairing, and
overlap scheduling only changes when the step runs, not what it pairs.

``accepted`` is the realised acceptance (greedy match at temperature 0, rejection
sampling otherwise).  In ``compact`` / ``cap-accept`` modes ``verified`` may be
below gamma: positions past it were never verified (censored), so consumers must
ignore them (:mod:`sglang_dspark.evaluate` and :mod:`sglang_dspark.calibrate` do).

Bounded: at most ``SGLANG_DSPARK_CAPTURE_MAX_ROWS`` request rows (default 1,000,000),
then capture stops with one log line.  It never fails a step: any error is logged
(a few times) and capture turns itself off.  Only TP rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Optional

logger = logging.getLogger(__name__)

ENV_PATH = "SGLANG_DSPARK_CAPTURE"
ENV_MAX_ROWS = "SGLANG_DSPARK_CAPTURE_MAX_ROWS"
DEFAULT_MAX_ROWS = 1_000_000


def _rows(t, bs: int) -> Optional[list]:
    if t is None:
        return None
    return t.detach()[:bs].float().cpu().tolist()


def _ints(t, bs: int) -> Optional[list]:
    if t is None:
        return None
    return [int(x) for x in t.detach().reshape(-1)[:bs].cpu().tolist()]


class StepCapture:
    """Appends one JSON line per decode step to ``path`` (see module docstring)."""

    def __init__(self, path: str, *, gamma: int, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        self.path = path
        self.gamma = int(gamma)
        self.max_rows = int(max_rows)
        self.rows = 0
        self.steps = 0
        self.errors = 0
        self.enabled = True
        self._fh = None
        self._warned_missing = False
        self._lock = threading.Lock()

    def observe(self, kw: dict) -> None:
        if not self.enabled:
            return
        try:
            self._observe(kw)
        except Exception:  # capture must never fail a request
            self.errors += 1
            logger.exception("sglang-dspark capture: step capture failed (%d); "
                             "capture is now off", self.errors)
            self.enabled = False

    def _observe(self, kw: dict) -> None:
        raw = kw.get("confidence_raw")
        correct = kw.get("correct_len")
        if correct is None:
            if not self._warned_missing:
                self._warned_missing = True
                logger.warning("sglang-dspark capture: a step without accept lengths; such "
                               "steps are not captured")
            return
        if raw is None and not self._warned_missing:
            # SGLang builds no confidence head in static mode: rounds only
            self._warned_missing = True
            logger.warning("sglang-dspark capture: no confidences (static verify mode builds "
                           "no confidence head); capturing accept lengths only")
        ref = raw if raw is not None else correct
        bs = int(kw.get("bs") or ref.shape[0])
        gamma = self.gamma
        layout = kw.get("layout")
        verify_lens = getattr(layout, "verify_lens", None) if layout is not None else None
        verified = ([max(v - 1, 0) for v in _ints(verify_lens, bs)] if verify_lens is not None
                    else [gamma] * bs)
        reqs = kw.get("reqs") or []
        sampling = kw.get("sampling_info")
        temps = None
        if sampling is not None and getattr(sampling, "temperatures", None) is not None:
            temps = [float(x) for x in sampling.temperatures.reshape(-1)[:bs].cpu().tolist()]
        rec = {
            "step": self.steps, "gamma": gamma,
            "rids": [str(getattr(r, "rid", "")) for r in list(reqs)[:bs]],
            "temps": temps,
            "conf_raw": _rows(raw, bs),
            "conf": _rows(kw.get("confidence"), bs),
            # positions past a cap were not verified: never count them accepted
            "accepted": [min(a, v) for a, v in zip(_ints(correct, bs), verified)],
            "verified": verified,
        }
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self._lock:
            if self._fh is None:
                d = os.path.dirname(os.path.abspath(self.path))
                os.makedirs(d, exist_ok=True)
                self._fh = open(self.path, "a", encoding="utf-8")
            self._fh.write(line)
            self._fh.flush()
            self.steps += 1
            self.rows += bs
            if self.rows >= self.max_rows:
                logger.warning("sglang-dspark capture: %d rows reached (%s); capture stops",
                               self.rows, ENV_MAX_ROWS)
                self.enabled = False
                self._fh.close()


def install(worker) -> Optional[StepCapture]:
    """Wrap ``worker._observers.observe_verify_step`` when ``SGLANG_DSPARK_CAPTURE`` is
    set; return the capture (or None).  Never raises."""
    path = os.environ.get(ENV_PATH)
    if not path:
        return None
    try:
        if int(getattr(worker, "tp_rank", 0) or 0) != 0:
            return None
        observers = getattr(worker, "_observers", None)
        if observers is None or not hasattr(observers, "observe_verify_step"):
            logger.warning("sglang-dspark capture: SGLang worker has no step observers; "
                           "capture disabled")
            return None
        try:
            max_rows = int(os.environ.get(ENV_MAX_ROWS, DEFAULT_MAX_ROWS))
        except ValueError:
            logger.warning("sglang-dspark capture: %s is not an integer; using %d",
                           ENV_MAX_ROWS, DEFAULT_MAX_ROWS)
            max_rows = DEFAULT_MAX_ROWS
        cap = StepCapture(path, gamma=int(worker.verify_num_draft_tokens) - 1, max_rows=max_rows)
        original = observers.observe_verify_step

        def observe_verify_step(*args, **kwargs):
            original(*args, **kwargs)
            cap.observe(kwargs)

        observers.observe_verify_step = observe_verify_step
        logger.info("sglang-dspark capture: writing per-step confidences to %s", path)
        return cap
    except Exception:
        logger.exception("sglang-dspark capture: install failed; capture disabled")
        return None
