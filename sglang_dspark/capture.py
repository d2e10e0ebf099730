"""Per-step capture of DSpark confidences and verification outcomes (off by default).

Set ``SGLANG_DSPARK_CAPTURE=FILE`` in the environment of an SGLang process running
our worker (:class:`sglang_dspark.worker.DSparkControlledWorker`) and every decode
step appends one JSON line to ``FILE``::

    {"step": 7, "gamma": 4, "rids": [...], "temps": [...],
     "conf_raw": [[...gamma logits...], ...],    # confidence head, before STS
     "conf":     [[...gamma probs...], ...],     # what SGLang's planner saw (after STS)
     "accepted": [...],                          # accepted draft tokens (no bonus)
     "verified": [...],                          # draft tokens verified (no anchor)
     "prefix": [...],                            # tokens before each request's anchor
     "drafts": [[...gamma token ids...], ...],   # the drafted block
     "ctx": [...]}                               # fingerprint of the draft's context KV

No-draft steps (:mod:`sglang_dspark.no_draft`) draft nothing and are not captured.
``ctx`` is, per request, the float64 sum of the magnitudes of the draft's context KV (every
layer's keys and values) over the positions before its anchor: a fingerprint of the context
the draft read (on a CPU device whose draft pool shares the target's slots; null elsewhere).

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

Cost.  Only TP rank 0 captures, so a capture that waited for the device inside the
step would hold rank 0 back while the other ranks wait for it at the next collective
(the first version read each tensor with ``.cpu()``: one blocking device sync per
step).  Instead, when a step's tensors are on a device, the observer queues
``non_blocking`` copies of the few ``[bs, gamma]`` / ``[bs]`` tensors into pinned host
memory on the step's stream, records a CUDA event after them and hands them to a
background writer thread, which waits for that event and writes the line.  The step
itself only pays for queuing five small copies and an event (host microseconds) and
their bytes on the stream; the JSON work runs in the writer thread (it shares the GIL
with the scheduler).  Lines appear in step order, shortly after each step's copies
complete; lines still queued when the process is killed (not exited) are lost.  With
CPU tensors (the CPU engine) there is no device to wait for and the line is written in
the step, as before.  Verified on CPU only (the queue and writer thread run there with
``deferred=True``); benchmarks/gpu_kernel_bench.py checks the device copy on a GPU.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import threading
from typing import Optional

logger = logging.getLogger(__name__)

ENV_PATH = "SGLANG_DSPARK_CAPTURE"
ENV_MAX_ROWS = "SGLANG_DSPARK_CAPTURE_MAX_ROWS"
DEFAULT_MAX_ROWS = 1_000_000


def _host(t, bs: int, *, flat: bool, keep: bool):
    """``t[:bs]`` (``flat``: of ``t`` flattened) on the host, without waiting for a device.

    CPU tensors are used as they are (cloned when ``keep``: the record is written later
    and the caller may reuse its buffer).  A device tensor is copied with
    ``non_blocking=True`` into fresh pinned host memory; the copy is queued on the
    current stream behind the kernels that produce ``t``, and the values are valid once
    an event recorded after it has completed (:meth:`StepCapture._observe`)."""
    if t is None:
        return None
    if not hasattr(t, "detach"):    # a host list (SGLang's ``layout.verify_lens_cpu``)
        return list(t)[:bs]
    src = t.detach()
    src = src.reshape(-1)[:bs] if flat else src[:bs]
    if src.device.type == "cpu":
        return src.clone() if keep else src
    import torch

    out = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    out.copy_(src, non_blocking=True)
    return out


def _rows(t) -> Optional[list]:
    return None if t is None else t.float().tolist()


def _ints(t) -> Optional[list]:
    return None if t is None else [int(x) for x in (t.tolist() if hasattr(t, "tolist") else t)]


class StepCapture:
    """Appends one JSON line per decode step to ``path`` (see module docstring).

    ``deferred``: None (default) writes a step's line at once when its tensors are on
    the CPU and from a background thread when any is on a device (non-blocking copies,
    see the module docstring); True / False force either way (tests)."""

    def __init__(self, path: str, *, gamma: int, max_rows: int = DEFAULT_MAX_ROWS,
                 deferred: Optional[bool] = None) -> None:
        self.path = path
        self.gamma = int(gamma)
        self.max_rows = int(max_rows)
        self.deferred = deferred
        self.rows = 0
        self.steps = 0
        self.errors = 0
        self.enabled = True
        self._fh = None
        self._warned_missing = False
        self._lock = threading.Lock()
        self._queue: Optional[queue.Queue] = None     # (event, host tensors, host facts)
        self._writer: Optional[threading.Thread] = None

    def observe(self, kw: dict) -> None:
        if not self.enabled:
            return
        try:
            self._observe(kw)
        except Exception:  # capture must never fail a request
            self._fail()

    def _fail(self) -> None:
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
        layout = kw.get("layout")
        # the host copy SGLang keeps of a layout's lengths, when it has one: nothing to copy
        verify_lens = getattr(layout, "verify_lens_cpu", None) if layout is not None else None
        if verify_lens is None and layout is not None:
            verify_lens = getattr(layout, "verify_lens", None)
        sampling = kw.get("sampling_info")
        temps = getattr(sampling, "temperatures", None) if sampling is not None else None
        sources = {"conf_raw": (raw, False), "conf": (kw.get("confidence"), False),
                   "correct": (correct, True), "verify_lens": (verify_lens, True),
                   "temps": (temps, True), "prefix": (kw.get("prefix_lens"), True),
                   "drafts": (kw.get("draft_tokens"), False), "ctx": (kw.get("context_digest"), True)}
        on_device = any(getattr(t, "device", None) is not None and t.device.type != "cpu"
                        for t, _ in sources.values())
        deferred = on_device if self.deferred is None else bool(self.deferred)
        host = {k: _host(t, bs, flat=flat, keep=deferred) for k, (t, flat) in sources.items()}
        event = None
        if on_device:
            import torch

            event = torch.cuda.Event()
            event.record()      # after the copies, on the stream that queued them
        reqs = kw.get("reqs") or []
        facts = {"bs": bs, "rids": [str(getattr(r, "rid", "")) for r in list(reqs)[:bs]]}
        with self._lock:
            facts["step"] = self.steps
            self.steps += 1
            self.rows += bs
            full = self.rows >= self.max_rows
        if deferred:
            self._enqueue((event, host, facts))
        else:
            if event is not None:
                event.synchronize()
            self._write(self._line(host, facts))
        if full:
            logger.warning("sglang-dspark capture: %d rows reached (%s); capture stops",
                           self.rows, ENV_MAX_ROWS)
            self.enabled = False
            self.close()

    def _line(self, host: dict, facts: dict) -> str:
        bs, gamma = facts["bs"], self.gamma
        verified = ([max(v - 1, 0) for v in _ints(host["verify_lens"])]
                    if host["verify_lens"] is not None else [gamma] * bs)
        temps = host["temps"]
        rec = {
            "step": facts["step"], "gamma": gamma,
            "rids": facts["rids"],
            "temps": None if temps is None else [float(x) for x in temps.float().tolist()],
            "conf_raw": _rows(host["conf_raw"]),
            "conf": _rows(host["conf"]),
            # positions past a cap were not verified: never count them accepted
            "accepted": [min(a, v) for a, v in zip(_ints(host["correct"]), verified)],
            "verified": verified,
            "prefix": _ints(host.get("prefix")),
            "drafts": None if host.get("drafts") is None else host["drafts"].tolist(),
            "ctx": None if host.get("ctx") is None else [float(x) for x in host["ctx"].tolist()],
        }
        return json.dumps(rec, separators=(",", ":")) + "\n"

    def _write(self, line: str) -> None:
        with self._lock:
            if self._fh is None:
                d = os.path.dirname(os.path.abspath(self.path))
                os.makedirs(d, exist_ok=True)
                self._fh = open(self.path, "a", encoding="utf-8")
            self._fh.write(line)
            self._fh.flush()

    # ---- deferred lines: a background thread waits for each step's copies
    def _enqueue(self, item) -> None:
        if self._writer is None:
            self._queue = queue.Queue()
            self._writer = threading.Thread(target=self._drain, name="sglang-dspark-capture",
                                            daemon=True)
            self._writer.start()
            atexit.register(self.close)
        self._queue.put(item)

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                event, host, facts = item
                if event is not None:
                    event.synchronize()     # the step's copies; releases the GIL meanwhile
                if self.errors == 0:
                    self._write(self._line(host, facts))
            except Exception:
                self._fail()
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every observed step's line is written."""
        if self._queue is not None:
            self._queue.join()

    def close(self) -> None:
        """Write what is pending, stop the writer and close the file (idempotent)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            self._queue.put(None)
            writer.join(timeout=30)
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def context_digest(worker):
    """A function of (request slots, prefix lengths) giving, per request, the sum of the
    magnitudes of the draft's context KV (every layer's keys and values) over its first
    ``prefix`` positions, in float64: a fingerprint of the context the step's draft read
    (a context row written late, twice or not at all changes it); it gives None where the
    draft pool does not index by the target's slots or keeps no plain K/V buffers, and
    None is returned instead of the function off a CPU device (it reads the pool on the
    host every step).  The pool is looked up at the first step (it exists by then)."""
    import torch

    if torch.device(worker.device).type != "cpu":
        return None
    found: list = []

    def buffers():
        if not found:
            try:
                runner = worker._kv_injector.draft_model_runner
                pool = runner.token_to_kv_pool
                ok = not getattr(runner.kv_index_translator, "is_translating", True)
                bufs = list(getattr(pool, "k_buffer", None) or []) + list(getattr(pool, "v_buffer", None) or [])
                found.append((bufs if ok else [], worker.model_runner.req_to_token_pool.req_to_token))
            except Exception:  # noqa: BLE001 - a fingerprint is optional
                found.append(([], None))
        return found[0]

    def digest(rows, prefix):
        bufs, req_to_token = buffers()
        if not bufs or rows is None or prefix is None:
            return None
        out = []
        for r, n in zip(rows.tolist(), prefix.tolist()):
            slots = req_to_token[int(r), :int(n)].long()
            out.append(sum(float(b[slots].double().abs().sum()) for b in bufs))
        return torch.tensor(out, dtype=torch.float64)

    return digest


def install(worker, *, path: Optional[str], max_rows: int = DEFAULT_MAX_ROWS) -> Optional[StepCapture]:
    """Wrap ``worker._observers.observe_verify_step`` when ``path``
    (``SGLANG_DSPARK_CAPTURE``) is set; return the capture (or None).  Never raises."""
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
        cap = StepCapture(path, gamma=int(worker.verify_num_draft_tokens) - 1, max_rows=max_rows)
        original = observers.observe_verify_step

        digest = context_digest(worker)

        def observe_verify_step(*args, **kwargs):
            original(*args, **kwargs)
            if not getattr(worker._proposer, "is_null", False):   # a no-draft step drafts nothing
                if digest is not None:
                    kwargs["context_digest"] = digest(kwargs.get("req_pool_indices"), kwargs.get("prefix_lens"))
                cap.observe(kwargs)

        observers.observe_verify_step = observe_verify_step
        logger.info("sglang-dspark capture: writing per-step confidences to %s", path)
        return cap
    except Exception:
        logger.exception("sglang-dspark capture: install failed; capture disabled")
        return None
