"""Profiling and the profiles library: ``dspark-controller profile | show | diff | validate | schema |
export | import``.

Active profiling runs the real CLI in a subprocess against ``FakeSGLang``, an in-process
HTTP server that speaks the few SGLang endpoints the profiler uses (``/server_info`` with
DSpark step records, ``/generate`` with ``rid``, ``/set_internal_state``,
``/abort_request``, ``/health``) and decodes with a known step-time curve, so the
measured profile can be checked against the truth, and requests can be failed and the
server restarted on purpose. Passive profiling runs against a real controller process.
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from dsc_helpers import fingerprint, free_port, replay, run_cli, wait_for
from dspark_controller.core.profile_file import EngineFingerprint, load_profile, save_profile
from dspark_controller.profiling.tools import build_profile, load_any, schema_text
from dspark_controller.sim.synthetic import CURVES

REPO = Path(__file__).resolve().parents[2]
GAMMA = 4


def true_step_s(r: int, b: int) -> float:
    """The fake engine's curve: 3 ms + 0.12 ms per verified token + 0.2 ms per request, a step at B=24."""
    return 0.003 + 0.00012 * b + 0.0002 * r + (0.002 if b >= 24 else 0.0)


# ------------------------------------------------------------------ a fake SGLang DSPARK server
class FakeSGLang:
    def __init__(self, *, port: Optional[int] = None, mode: str = "compact", records: bool = True,
                 max_running: int = 8, model_path: str = "/models/tiny-target", noise: float = 0.02,
                 null_ok: bool = False, unpin_ok: bool = False) -> None:
        self.port = port or free_port()
        self.mode = mode
        self.records_on = records
        self.max_running = max_running
        self.model_path = model_path
        self.noise = noise
        self.null_ok = null_ok               # SGLang 0.5.23's HTTP schema refuses null (HTTP 400)
        self.unpin_ok = unpin_ok             # sglang-dspark's dspark_unpin_budget key (plugin installed)
        self.cleared = 0
        self.fail_generates = 0             # the next N /generate calls answer HTTP 500
        self.restart_after_generates: Optional[int] = None
        self.restart_downtime_s = 1.5
        self.forced_history: list[Optional[float]] = []
        self.generate_calls = 0
        self.aborted_rids: list[str] = []
        self._lock = threading.Lock()
        self._reset_engine()
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._decode_loop, daemon=True)

    # -- engine state
    def _reset_engine(self) -> None:
        self.seed = random.randrange(1 << 30)
        self.forward_ct = 0
        self.records: list[dict] = []
        self.queue: list[dict] = []
        self.running: list[dict] = []
        self.forced: Optional[float] = None
        self.after_prefill = True
        self.rng = random.Random(self.seed)

    def _decode_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self.queue and len(self.running) < self.max_running:
                    n = self.max_running - len(self.running)
                    self.running += self.queue[:n]
                    del self.queue[:n]
                    self.forward_ct += 1               # a prefill
                    self.after_prefill = True
                    continue
                act = list(self.running)
            if not act:
                time.sleep(0.002)
                continue
            r = len(act)
            if self.mode == "compact":
                budget = int((self.forced if self.forced is not None else 1.0) * r * GAMMA)
            else:
                budget = r * GAMMA
            b = r + budget
            t = true_step_s(r, b) * math.exp(self.rng.gauss(0.0, self.noise))
            time.sleep(t)
            with self._lock:
                self.forward_ct += 1
                if self.records_on:
                    self.records.append({"forward_ct": self.forward_ct, "bs": r, "mode": self.mode, "budget": budget,
                                         "num_running_reqs": r, "num_verify_tokens": b,
                                         "step_cpu_ms": None if self.after_prefill else round(1e3 * t, 4)})
                self.after_prefill = False
                per = budget // r
                for q in act:
                    if q in self.running:
                        q["left"] -= 1 + min(per, self.rng.randint(0, GAMMA))
                        if q["left"] <= 0:
                            self.running.remove(q)
                            q["done"].set()

    # -- HTTP
    def info(self) -> dict:
        with self._lock:
            rec = {"mode": self.mode, "gamma": GAMMA, "verify_num_draft_tokens": GAMMA + 1,
                   "components": ["core", "step_cpu_time"] if self.records_on else [],
                   "records": list(self.records),
                   "sglang_dspark": {"worker": "fake", "device_name": "FakeGPU 9000"}}
            return {"speculative_algorithm": "DSPARK", "model_path": self.model_path,
                    "speculative_draft_model_path": "/models/tiny-draft", "tp_size": 1, "dp_size": 1,
                    "dtype": "float32", "attention_backend": "fake", "version": "0.5.23", "device": "cuda",
                    "random_seed": self.seed, "port": self.port, "max_running_requests": self.max_running,
                    "internal_states": [{"effective_max_running_requests_per_dp": self.max_running,
                                         "dspark_info_record": rec if self.records_on else None}]}

    def _generate(self, body: dict) -> tuple[int, dict]:
        with self._lock:
            self.generate_calls += 1
            if self.fail_generates > 0:
                self.fail_generates -= 1
                return 500, {"error": "injected failure"}
            restart = (self.restart_after_generates is not None
                       and self.generate_calls >= self.restart_after_generates)
            if restart:
                self.restart_after_generates = None
            q = {"rid": body.get("rid"), "left": int(body["sampling_params"]["max_new_tokens"]) - 1,
                 "done": threading.Event()}
            self.queue.append(q)
        if restart:
            threading.Thread(target=self.restart, args=(self.restart_downtime_s,), daemon=True).start()
        if not q["done"].wait(60):
            return 500, {"error": "timeout"}
        if q.get("aborted"):
            return 200, {"text": "", "meta_info": {"finish_reason": {"type": "abort"}}}
        return 200, {"text": "x", "meta_info": {"finish_reason": {"type": "length"}}}

    def _handler(self) -> type:
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/server_info":
                    self._send(200, fake.info())
                else:
                    self._send(404, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/generate":
                    self._send(*fake._generate(body))
                elif self.path == "/set_internal_state":
                    args = body.get("server_args", {})
                    if not fake.null_ok and any(v is None for v in args.values()):
                        self._send(400, {"object": "error", "message": "Input should be an instance of "
                                                                      "SetInternalStateReq"})
                        return
                    if "dspark_unpin_budget" in args:   # unknown to plain SGLang: not updated
                        if not fake.unpin_ok or args["dspark_unpin_budget"] != 1:
                            self._send(200, {"updated": False})
                            return
                        with fake._lock:
                            fake.forced = None
                            fake.forced_history.append(None)
                    if args.get("dspark_clear_info_records"):
                        with fake._lock:
                            fake.records.clear()
                            fake.cleared += 1
                    if "dspark_force_budget_frac" in args:
                        v = args["dspark_force_budget_frac"]
                        if fake.mode not in ("compact", "cap-accept") or (v is not None and not 0 < v <= 1):
                            self._send(200, {"updated": False})
                            return
                        with fake._lock:
                            fake.forced = v
                            fake.forced_history.append(v)
                    self._send(200, {"updated": True})
                elif self.path == "/abort_request":
                    with fake._lock:
                        for q in fake.running + fake.queue:
                            if q["rid"] == body.get("rid"):
                                q["aborted"] = True
                                fake.aborted_rids.append(q["rid"])
                                if q in fake.running:
                                    fake.running.remove(q)
                                else:
                                    fake.queue.remove(q)
                                q["done"].set()
                    self._send(200, {})
                else:
                    self._send(404, {})

        return H

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def start(self) -> "FakeSGLang":
        self._serve()
        self._loop.start()
        return self

    def down(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            for q in self.running + self.queue:
                q["aborted"] = True
                q["done"].set()
            self._reset_engine()

    def up(self) -> None:
        self._serve()

    def restart(self, downtime: float) -> None:
        self.down()
        time.sleep(downtime)
        self.up()

    def stop(self) -> None:
        self.down()
        self._stop.set()


@pytest.fixture
def fake():
    made: list[FakeSGLang] = []

    def make(**kw: Any) -> FakeSGLang:
        f = FakeSGLang(**kw).start()
        made.append(f)
        return f

    yield make
    for f in made:
        f.stop()


FAST = ["--concurrency", "1,2,4,8", "--fractions", "1,0.75,0.5,0.25,0", "--steps-per-round", "6", "--precision", "0.05",
        "--max-time", "150", "--heldout", "0.15"]


def profile_cli(url: str, out: Path, *extra: str, timeout: float = 240.0) -> Any:
    return run_cli("profile", "--url", url, "-o", str(out), *FAST, *extra, timeout=timeout)


def rel_err_vs_truth(path: Path) -> float:
    lp = load_any(str(path))
    pts = [(r, r + int(f * r * GAMMA)) for r in (1, 2, 4, 8) for f in (1.0, 0.75, 0.5, 0.25, 0.0)]
    errs = [abs(float(lp.model.predict_step_time(r, b)) - true_step_s(r, b)) / true_step_s(r, b) for r, b in pts]
    return float(np.max(errs))


# ------------------------------------------------------------------ active profiling
def test_active_profile_measures_the_true_curve_and_releases_the_server(fake, tmp_path):
    srv = fake(null_ok=True)
    out = tmp_path / "p.json"
    r = profile_cli(srv.url, out)
    assert r.returncode == 0, r.stderr[-3000:]
    pf = load_profile(out)
    assert pf.fingerprint.device_name == "FakeGPU 9000" and pf.fingerprint.gamma == GAMMA
    assert pf.fingerprint.target_model == "/models/tiny-target" and pf.profile_key == pf.fingerprint.profile_key()
    assert pf.provenance.command.startswith("dspark-controller profile --url " + srv.url)
    assert pf.samples_seen >= 100 and pf.heldout_error.n > 0 and pf.heldout_error.mape < 0.05
    assert rel_err_vs_truth(out) < 0.06
    # how the sweep ended is recorded, and validate reports it
    m = pf.measurement
    assert m is not None and m.method == "active" and m.precision == 0.05 and m.passes >= 2 and m.rounds >= 20
    assert ("NOT converged" in r.stdout) == (not m.converged)
    v = run_cli("validate", str(out))
    assert v.returncode == 0 and (("convergence: converged at 5% precision" in v.stdout) == m.converged), v.stdout
    # every fraction was pinned, and the server got its own decisions back at the end
    assert {0.5, 1.0} <= set(srv.forced_history) and min(x for x in srv.forced_history if x) < 1e-3
    assert srv.forced_history[-1] is None and srv.forced is None and "Restart the server" not in r.stderr
    assert srv.cleared >= 20                  # records cleared before each round: /server_info stays small
    # progress is plain text with an ETA when stderr is not a TTY; the summary says converged
    assert "ETA" in r.stderr and "\r" not in r.stderr
    assert "converged" in r.stdout and "NOT converged" not in r.stdout
    assert not Path(str(out) + ".partial.json").exists()
    # rounds end by aborting the profiler's own requests only
    assert all(x.startswith("dspark-profile-") for x in srv.aborted_rids)


def test_active_profile_survives_failed_requests_and_a_server_restart(fake, tmp_path):
    srv = fake()
    srv.fail_generates = 3                   # the first requests fail with HTTP 500
    srv.restart_after_generates = 40         # later the server goes away for 1.5 s and comes back fresh
    out = tmp_path / "p.json"
    r = profile_cli(srv.url, out, "--restart-wait", "30")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "requests failed" in r.stderr
    assert "server unavailable" in r.stderr or "restarted" in r.stderr
    pf = load_profile(out)
    assert pf.samples_seen >= 100 and rel_err_vs_truth(out) < 0.08
    # like SGLang 0.5.23 this server refuses null: the fraction is left at verify-all, and the user is told
    assert srv.forced == 1.0 and "Restart the server" in r.stderr


def test_a_server_with_our_plugin_gets_its_budget_decisions_back(fake, tmp_path):
    # null is refused (SGLang 0.5.23's schema), but sglang-dspark's dspark_unpin_budget key
    # lifts the pin: no fallback to 1.0, no "restart the server"
    srv = fake(unpin_ok=True)
    out = tmp_path / "p.json"
    r = profile_cli(srv.url, out, "--max-passes", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert srv.forced is None and srv.forced_history[-1] is None, srv.forced_history[-3:]
    assert "Restart the server" not in r.stderr and 1.0 not in srv.forced_history[-2:]


def test_server_gone_for_good_gives_a_clear_error_and_resume_finishes(fake, tmp_path):
    srv = fake()
    srv.restart_after_generates = 25
    srv.restart_downtime_s = 6.0             # longer than --restart-wait
    out = tmp_path / "p.json"
    r = profile_cli(srv.url, out, "--restart-wait", "2")
    assert r.returncode == 1
    assert "did not come back" in r.stderr and "--resume" in r.stderr and "no profile was written" in r.stderr
    ck = Path(str(out) + ".partial.json")
    assert ck.is_file() and not out.exists()
    kept = len(json.loads(ck.read_text())["rounds"])
    assert kept >= 1
    wait_for(lambda: srv._httpd is not None, 15, what="the fake server to come back")
    r2 = profile_cli(srv.url, out, "--resume")
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert f"resuming from {ck}: {kept} rounds" in r2.stderr
    assert out.is_file() and not ck.exists()
    assert rel_err_vs_truth(out) < 0.08


def test_resume_refuses_a_checkpoint_from_another_engine(fake, tmp_path):
    a = fake()
    out = tmp_path / "p.json"
    a.restart_after_generates = 15
    a.restart_downtime_s = 5.0
    r = profile_cli(a.url, out, "--restart-wait", "1")
    assert r.returncode == 1 and Path(str(out) + ".partial.json").is_file()
    b = fake(model_path="/models/another-target")
    r2 = profile_cli(b.url, out, "--resume")
    assert r2.returncode == 1 and "different engine" in r2.stderr and not out.exists()


LAUNCH_FAKE = ("import sys, time; sys.path.insert(0, {dir!r}); from test_profile_cli import FakeSGLang; "
               "f = FakeSGLang(port=int(sys.argv[sys.argv.index('--port') + 1])).start(); time.sleep(600)")


def test_launch_starts_profiles_and_stops_the_server(tmp_path):
    import shlex

    code = LAUNCH_FAKE.format(dir=str(Path(__file__).resolve().parent))
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    out = tmp_path / "p.json"
    r = run_cli("profile", "--launch", cmd, "-o", str(out), *FAST, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "launching:" in r.stderr and "server up at http://127.0.0.1:" in r.stderr
    pf = load_profile(out)
    assert pf.provenance.command.startswith("dspark-controller profile --launch") and rel_err_vs_truth(out) < 0.06
    port = int(r.stderr.split("server up at http://127.0.0.1:")[1].split()[0])
    import socket

    with pytest.raises(ConnectionRefusedError):      # the launched server is gone
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    r = run_cli("profile", "--launch", f"{shlex.quote(sys.executable)} -c 'raise SystemExit(3)'", "-o",
                str(tmp_path / "q.json"), timeout=60)
    assert r.returncode == 1 and "exited with code 3 while starting" in r.stderr and "no profile was written" in r.stderr


def test_server_without_step_records_is_refused_with_the_fix(fake, tmp_path):
    srv = fake(records=False)
    r = profile_cli(srv.url, tmp_path / "p.json")
    assert r.returncode == 1 and "SGLANG_DSPARK_ENABLE_SPS_RECORD=1" in r.stderr
    assert not (tmp_path / "p.json").exists()


def test_static_mode_degrades_to_verify_all_with_a_warning(fake, tmp_path):
    srv = fake(mode="static")
    out = tmp_path / "p.json"
    r = profile_cli(srv.url, out)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SGLANG_RAGGED_VERIFY_MODE=compact" in r.stderr and srv.forced_history == []
    raw = np.asarray(load_profile(out).model.raw_samples)
    assert np.all(raw[:, 1] == raw[:, 0] * (GAMMA + 1))           # only B = R (gamma + 1) was measured


def test_time_limit_before_every_cell_is_measured_writes_nothing(fake, tmp_path):
    srv = fake()
    out = tmp_path / "p.json"
    r = profile_cli(srv.url, out, "--max-time", "0.5")
    assert r.returncode == 1 and "never measured" in r.stderr and not out.exists()
    assert Path(str(out) + ".partial.json").is_file()


def test_bad_arguments_are_usage_errors():
    r = run_cli("profile", "-o", "x.json")
    assert r.returncode == 2 and "exactly one source" in r.stderr
    r = run_cli("profile", "--url", "localhost:3000", "-o", "x.json")
    assert r.returncode == 2 and "http://HOST:PORT" in r.stderr
    r = run_cli("profile", "--url", "http://127.0.0.1:9", "-o", "x.json", "--fractions", "1.5")
    assert r.returncode == 2 and "--fractions" in r.stderr
    r = run_cli("profile", "--from-controller", "ipc:///nope", "-o", "x.json", "--concurrency", "1,2")
    assert r.returncode == 2 and "only apply to --url" in r.stderr


def test_unreachable_server_is_a_clear_failure(tmp_path):
    r = run_cli("profile", "--url", f"http://127.0.0.1:{free_port()}", "-o", str(tmp_path / "p.json"))
    assert r.returncode == 1 and "cannot reach the server" in r.stderr


def test_progress_bar_on_a_tty_and_plain_lines_otherwise():
    import io

    from dspark_controller.profiling.live import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    t = Tty()
    p = Progress(t)
    p.update(0.5, "pass 1", elapsed=65, eta=125)
    p.message("hello")
    p.update(1.0, "pass 2", elapsed=70, eta=0)
    p.close()
    out = t.getvalue()
    assert out.startswith("\r[##############--------------]  50% pass 1 | 1:05 elapsed, ETA 2:05")
    assert "\nprofile: hello\n" in out and out.endswith("\n")
    plain = io.StringIO()
    Progress(plain).update(0.25, "pass 1", elapsed=5, eta=3725)
    assert plain.getvalue() == "profile:  25% pass 1 | elapsed 0:05, ETA 1:02:05\n"


# ------------------------------------------------------------------ passive profiling
def test_passive_profile_from_a_running_controller(controllers, clients, tmp_path):
    ctl = controllers("--persist-interval-s", "600")
    c = clients(address=ctl.bind, fingerprint=fingerprint(), engine_id="w1")
    wait_for(lambda: c.link_state == "connected", 15)
    replay(c, CURVES["jagged"], steps=600, seed=3)
    wait_for(lambda: (ctl.status().profiles or [None])[0] is not None
             and ctl.status().profiles[0].samples_seen >= 600, 20, what="600 learned steps")
    out = tmp_path / "passive.json"
    r = run_cli("profile", "--from-controller", ctl.cli, "-o", str(out))
    assert r.returncode == 0, r.stderr
    pf = load_profile(out)
    assert pf.samples_seen == 600 and pf.fingerprint == fingerprint()
    assert pf.provenance.command.startswith("dspark-controller profile --from-controller")
    assert pf.heldout_error.n > 0 and pf.heldout_error.mape < 0.1
    assert len(pf.model.raw_samples) == 600
    curve = CURVES["jagged"]
    m = load_any(str(out)).model
    for rr, b in ((4, 20), (16, 64), (32, 200)):
        assert float(m.predict_step_time(rr, b)) == pytest.approx(curve.step_time(rr, b), rel=0.06)
    # what the controller persists and what the CLI fetched agree
    r = run_cli("profile", "--from-controller", ctl.cli, "-o", str(tmp_path / "x.json"), "--profile-key", "nope")
    assert r.returncode == 1 and "no profile 'nope'" in r.stderr
    r = run_cli("profile", "--from-controller", ctl.cli, "-o", str(tmp_path / "y.json"), "--min-samples", "100000")
    assert r.returncode == 1 and "--min-samples" in r.stderr


def test_passive_profile_needs_a_controller(short_tmp, tmp_path):
    r = run_cli("profile", "--from-controller", f"ipc://{short_tmp}/none.cli", "-o", str(tmp_path / "p.json"),
                "--timeout", "0.5")
    assert r.returncode == 1 and "no reply from the controller" in r.stderr


# ------------------------------------------------------------------ the library
def synthetic_profile(path: Path, *, curve: Any = None, seed: int = 0, scale: float = 1.0, n: int = 2500) -> Path:
    rng = np.random.default_rng(seed)
    curve = curve or true_step_s
    samples = []
    for _ in range(n):
        r = int(rng.choice([1, 2, 4, 8, 16]))
        b = r + int(rng.integers(0, r * GAMMA + 1))
        samples.append([r, b, scale * curve(r, b) * float(np.exp(rng.normal(0, 0.02)))])
    fp = EngineFingerprint(target_model="/m/t", draft_model="/m/d", gamma=GAMMA, device_name="FakeGPU 9000")
    pf, _, _ = build_profile(samples, fingerprint=fp, command=f"synthetic seed={seed}")
    save_profile(path, pf)
    return path


def test_schema_file_is_up_to_date():
    path = REPO / "profiles" / "schema" / "profile.schema.json"
    assert path.read_text(encoding="utf-8") == schema_text(), \
        "regenerate with: dspark-controller schema -o profiles/schema/profile.schema.json"
    r = run_cli("schema", "--check", str(path))
    assert r.returncode == 0, r.stderr


def test_schema_check_detects_a_stale_file(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(schema_text().replace("samples_seen", "samples"))
    r = run_cli("schema", "--check", str(p))
    assert r.returncode == 1 and "out of date" in r.stderr
    assert run_cli("schema", "-o", str(p)).returncode == 0 and p.read_text() == schema_text()


def test_committed_profiles_are_valid_and_measured():
    files = sorted((REPO / "profiles").glob("*.profile.json"))
    assert files, "profiles/ has no measured profile"
    for f in files:
        r = run_cli("validate", "--strict", str(f))
        assert r.returncode == 0, r.stdout
        pf = load_profile(f)
        assert pf.samples_seen >= 200 and pf.provenance.command.startswith("dspark-controller profile --url")


def test_exports_load_in_sglang_and_agree_with_the_model(tmp_path):
    pytest.importorskip("msgspec")
    try:
        from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path
    except Exception as exc:  # pragma: no cover - SGLang missing
        pytest.skip(f"SGLang not importable: {exc}")
    prof = synthetic_profile(tmp_path / "a.json")
    m = load_any(str(prof)).model
    add, cost = tmp_path / "add.json", tmp_path / "cost.json"
    r = run_cli("export", str(prof), "--format", "additive", "-o", str(add))
    assert r.returncode == 0 and "load_sps_table_from_path accepts it" in r.stdout, r.stderr
    r = run_cli("export", str(prof), "--format", "cost", "--num-requests", "8", "-o", str(cost))
    assert r.returncode == 0, r.stderr
    ta, tc = load_sps_table_from_path(str(add)), load_sps_table_from_path(str(cost))
    assert type(ta).__name__ == "SpsAdditiveCostTable" and type(tc).__name__ == "SpsCostTable"
    for rr in (1, 2, 4, 8, 16):
        for k in range(0, rr * GAMMA + 1):
            # the additive format holds the additive part of the fit (no per-row corrections)
            assert ta.step_time(num_reqs=rr, budget=k) == pytest.approx(m.additive_step_time(rr, rr + k), rel=1e-9)
    for b in range(8, 8 * (GAMMA + 1) + 1):
        assert tc.lookup(b) == pytest.approx(1.0 / float(m.predict_step_time(8, b)), rel=1e-9)
    assert tc.sample_batch_tokens[-1] <= 8 * (GAMMA + 1)
    r = run_cli("export", str(prof), "--format", "additive", "--num-requests", "4", "-o", str(add))
    assert r.returncode == 2 and "only apply to --format cost" in r.stderr


def test_import_makes_a_profile_that_predicts_the_table(tmp_path):
    prof = synthetic_profile(tmp_path / "a.json")
    add = tmp_path / "add.json"
    assert run_cli("export", str(prof), "--format", "additive", "-o", str(add)).returncode == 0
    imp = tmp_path / "imp.json"
    r = run_cli("import", str(add), "-o", str(imp), "--target-model", "/m/t", "--gamma", str(GAMMA),
                "--device-name", "FakeGPU 9000")
    assert r.returncode == 0, r.stderr
    pf = load_profile(imp)
    assert pf.samples_seen == 0 and pf.provenance.command.startswith("dspark-controller import")
    a, b = load_any(str(prof)).model, load_any(str(imp)).model
    for rr in (1, 4, 16):
        for bb in (rr, rr * 3, rr * (GAMMA + 1)):
            assert float(b.predict_step_time(rr, bb)) == pytest.approx(float(a.predict_step_time(rr, bb)), rel=0.02)
    r = run_cli("import", str(prof), "-o", str(tmp_path / "bad.json"))
    assert r.returncode == 2 and "not an SGLang" in r.stderr


def test_validate_accepts_good_files_and_names_the_problem_in_bad_ones(tmp_path):
    prof = synthetic_profile(tmp_path / "a.json")
    assert run_cli("validate", str(prof)).returncode == 0
    data = json.loads(prof.read_text())
    data["profile_key"] = "0000000000000000"
    (tmp_path / "key.json").write_text(json.dumps(data))
    r = run_cli("validate", str(tmp_path / "key.json"))
    assert r.returncode == 1 and "does not match its fingerprint" in r.stdout
    data = json.loads(prof.read_text())
    data["model"]["raw_samples"][0] = [4, 2, 0.01]
    (tmp_path / "raw.json").write_text(json.dumps(data))
    r = run_cli("validate", str(tmp_path / "raw.json"))
    assert r.returncode == 1 and "raw samples are invalid" in r.stdout
    data = json.loads(prof.read_text())
    del data["fingerprint"]["gamma"]
    (tmp_path / "schema.json").write_text(json.dumps(data))
    r = run_cli("validate", str(tmp_path / "schema.json"))
    assert r.returncode == 1 and "gamma" in r.stdout
    (tmp_path / "junk.json").write_text("{not json")
    assert run_cli("validate", str(tmp_path / "junk.json")).returncode == 1


def _noisy_unconverged_profile(path: Path) -> Path:
    """A profile like one measured on a busy machine: steps scattered over a factor of ~20 (the
    fit misses held-out steps by several hundred percent) and a sweep that hit --max-passes."""
    from dspark_controller.core.profile_file import Measurement

    rng = np.random.default_rng(4)
    samples = []
    for _ in range(600):
        r = int(rng.choice([1, 2, 4]))
        b = r + int(rng.integers(0, r * GAMMA + 1))
        samples.append([r, b, true_step_s(r, b) * float(np.exp(rng.normal(0, 1.6)))])
    fp = EngineFingerprint(target_model="/m/t", draft_model="/m/d", gamma=GAMMA, device_name="FakeGPU 9000")
    pf, _, err = build_profile(samples, fingerprint=fp, command="dspark-controller profile --url http://h:1 -o x",
                               measurement=Measurement(converged=False, precision=0.05, passes=8, rounds=60,
                                                       wall_s=97.0))
    assert err.mape > 1.0            # several hundred percent
    save_profile(path, pf)
    return path


def test_validate_reports_error_and_convergence_and_strict_fails_on_them(tmp_path):
    bad = _noisy_unconverged_profile(tmp_path / "noisy.json")
    mape = load_profile(bad).heldout_error.mape
    r = run_cli("validate", str(bad))
    assert r.returncode == 0, r.stdout                               # usable, but say why not to trust it
    assert f"{bad}: OK, with 2 warnings" in r.stdout
    assert f"warning: held-out step-time error {100 * mape:.1f}%" in r.stdout and "above the 25% limit" in r.stdout
    assert "warning: the measurement did not converge" in r.stdout and "8 passes" in r.stdout
    r = run_cli("validate", "--strict", str(bad))
    assert r.returncode == 1 and f"{bad}: FAILS --strict (2 warnings)" in r.stdout
    r = run_cli("validate", "--strict", "--max-error", str(2 * mape), str(bad))
    assert r.returncode == 1 and "FAILS --strict (1 warning)" in r.stdout and "did not converge" in r.stdout
    good = synthetic_profile(tmp_path / "good.json")
    r = run_cli("validate", "--strict", str(good))
    assert r.returncode == 0 and f"{good}: OK\n" in r.stdout and "warning" not in r.stdout
    assert "held-out step-time error" in r.stdout and "convergence: not recorded" in r.stdout
    r = run_cli("validate", "--strict", str(good), str(bad))           # one bad file fails the run
    assert r.returncode == 1
    r = run_cli("validate", "--max-error", "0", str(good))
    assert r.returncode == 2 and "--max-error" in r.stderr


def test_validate_strict_threshold_is_one_number():
    from dspark_controller.profiling import cli as profile_cli, tools as profile_tools

    assert profile_cli.STRICT_MAX_HELDOUT_ERROR == profile_tools.STRICT_MAX_HELDOUT_ERROR == 0.25


def test_export_beyond_the_measured_range_warns(tmp_path):
    prof = synthetic_profile(tmp_path / "a.json")            # measured at R = 1, 2, 4, 8, 16
    out = tmp_path / "t.json"
    r = run_cli("export", str(prof), "--format", "cost", "--num-requests", "999", "-o", str(out))
    assert r.returncode == 0 and out.is_file(), r.stderr
    assert "warning: --num-requests 999 is outside the range this profile measured (R = 1..16)" in r.stderr
    assert "extrapolated" in r.stderr and "wrote" in r.stdout and "warning" not in r.stdout
    r = run_cli("export", str(prof), "--format", "cost", "--num-requests", "8", "-o", str(out))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    r = run_cli("export", str(prof), "--format", "cost", "--num-requests", "8", "--b-max", "5000", "-o", str(out))
    assert r.returncode == 0 and "warning: --b-max 5000 is beyond the largest batch" in r.stderr
    r = run_cli("export", str(prof), "--format", "cost", "-o", "-")      # default R: the largest measured
    assert r.returncode == 0 and "warning" not in r.stderr


def test_show_prints_tables_and_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    prof = synthetic_profile(tmp_path / "a.json")
    png = tmp_path / "a.png"
    r = run_cli("show", str(prof), "--png", str(png), "--confidence", "0.8")
    assert r.returncode == 0, r.stderr
    assert "measured ms" in r.stdout and "fit ms" in r.stdout and "budget the scheduler would pick" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 30_000
    r = run_cli("show", str(prof), "--json", "--confidence", "0.5,0.95")
    out = json.loads(r.stdout)
    assert {c["R"] for c in out["cells"]} == {1, 2, 4, 8, 16}
    k = {(d["confidence"], d["R"]): d["K"] for d in out["budgets"]}
    # confident drafts are worth verifying: the budget grows with the confidence
    assert all(k[(0.95, rr)] >= k[(0.5, rr)] for rr in (1, 2, 4, 8, 16))
    assert any(k[(0.95, rr)] > k[(0.5, rr)] for rr in (1, 2, 4, 8, 16))


def test_show_budget_follows_the_cost_of_verifying(tmp_path):
    flat = synthetic_profile(tmp_path / "flat.json", curve=lambda r, b: 0.01)
    steep = synthetic_profile(tmp_path / "steep.json", curve=lambda r, b: 0.001 * b)
    kf = {d["R"]: d["K"] for d in json.loads(run_cli("show", str(flat), "--json", "--confidence", "0.7").stdout)
          ["budgets"]}
    ks = {d["R"]: d["K"] for d in json.loads(run_cli("show", str(steep), "--json", "--confidence", "0.7").stdout)
          ["budgets"]}
    assert all(kf[r] == r * GAMMA for r in kf)        # free tokens: verify every draft token
    assert all(ks[r] < r * GAMMA for r in ks)          # cost proportional to B: only the likely ones


def test_diff_reports_per_bin_differences(tmp_path):
    a = synthetic_profile(tmp_path / "a.json", seed=1)
    b = synthetic_profile(tmp_path / "b.json", seed=2, scale=1.10)
    r = run_cli("diff", str(a), str(a), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["summary"]["max_abs_rel_diff"] == 0.0
    r = run_cli("diff", str(a), str(b), "--json")
    d = json.loads(r.stdout)
    assert d["summary"]["median_rel_diff"] == pytest.approx(0.10, abs=0.02)
    assert d["summary"]["points_measured_in_both"] > 10
    assert all(abs(x["rel_diff"] - 0.10) < 0.05 for x in d["rows"])
    r = run_cli("diff", str(a), str(b), "--fail-above", "0.05")
    assert r.returncode == 1 and "exceeds --fail-above" in r.stderr and "(B-A)/A" in r.stdout
