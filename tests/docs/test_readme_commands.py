"""The commands README.md shows run as written.

Every command line of README's fenced ``bash`` blocks, and every inline code span of its
prose that starts a program (``python ...``, ``dspark-controller ...``, ``make ...``), is
parsed and checked against the real program:

* the module, script or console script exists and reaches its argument parser;
* ``--help`` succeeds for it and for every subcommand the README names;
* every flag the README uses is an option of that (sub)command's parser (so renaming a flag
  fails here), and a bash-block command line without elided parts (``...``) parses as a
  whole with the real parser (required options, choices and types included; inline spans
  in the prose often name a command without its required options, so only their flags and
  subcommands are checked);
* ``make`` targets exist (``make -n``);
* the engine-free commands run for real: ``dspark-controller plan`` (and the result its
  comment states), the controller's ``serve`` / ``status`` / ``set`` against each other
  (on free ports instead of the README's 7150 / 7152), ``python -m sglang_dspark.tiny_models``.

Programs are run up to their parse by ``cli_spy.py`` (nothing is launched); commands that
start an engine or run for minutes (``sglang.launch_server``, ``evaluate``, ``calibrate``,
``train``, ``demo``, benchmarks, ``simulate`` on the full scenario) are checked this way only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SPY = Path(__file__).resolve().parent / "cli_spy.py"
BIN = Path(sys.executable).parent
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```", re.M | re.S)


class Cmd:
    """One documented command line: ``kind`` module | script | entry | make | pip."""

    def __init__(self, source: str, text: str, kind: str, target: str, args: list[str], elided: bool):
        self.source, self.text, self.kind, self.target = source, text, kind, target
        self.args, self.elided = args, elided

    def __repr__(self) -> str:
        return f"README {self.source}: {self.text}"


def _tokens(text: str) -> tuple[list[str], bool]:
    """Shell words without comments, optional-part brackets (``[--device cpu]``) and ``...``."""
    words = shlex.split(text, comments=True)
    out, elided, in_opt = [], False, False
    for w in words:
        if w.startswith("[-"):
            w, in_opt = w[1:], True
        if in_opt and w.endswith("]"):
            w, in_opt = w[:-1], False
        if w in ("...", ""):
            elided = True
            continue
        out.append(w)
    return out, elided


def _classify(source: str, text: str) -> Cmd | None:
    words, elided = _tokens(text)
    while words and _ENV_ASSIGN.match(words[0]):
        words = words[1:]
    if not words:
        return None
    head = words[0]
    if head in ("python", "python3") or head.endswith("/python"):
        if len(words) >= 3 and words[1] == "-m":
            return Cmd(source, text, "module", words[2], words[3:], elided)
        if len(words) >= 2 and words[1].endswith(".py"):
            return Cmd(source, text, "script", words[1], words[2:], elided)
        raise AssertionError(f"README {source}: cannot tell which program {text!r} runs")
    if head == "dspark-controller":
        return Cmd(source, text, "entry", head, words[1:], elided)
    if head == "make":
        return Cmd(source, text, "make", words[1] if len(words) > 1 else "", [], elided)
    if head == "pip":
        return Cmd(source, text, "pip", "pip", words[1:], elided)
    return None


def readme_commands() -> list[Cmd]:
    text = README.read_text(encoding="utf-8")
    cmds: list[Cmd] = []
    for m in _FENCE.finditer(text):
        lang, body = m.group(1), m.group(2)
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        line_no = text[:m.start()].count("\n") + 2
        for i, line in enumerate(body.replace("\\\n", " ").splitlines()):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            c = _classify(f"line ~{line_no + i}", line)
            if c is None:
                raise AssertionError(f"README line ~{line_no + i}: unknown program in a bash block: {line!r} "
                                     "(teach tests/docs/test_readme_commands.py how to check it)")
            cmds.append(c)
    prose = _FENCE.sub("", text)
    for span in re.findall(r"`([^`\n]+)`", prose):
        first = span.split()[0] if span.split() else ""
        if first in ("python", "python3", "dspark-controller", "make") or first.endswith("/python"):
            c = _classify("inline", span)
            if c is not None:
                c.elided = True     # prose names a command, often without its required options
                cmds.append(c)
    return cmds


CMDS = readme_commands()


def test_readme_has_the_commands_this_test_expects():
    """The parser above finds README's commands (an empty list would make every check pass)."""
    kinds = {(c.kind, c.target) for c in CMDS}
    for want in [("entry", "dspark-controller"), ("module", "sglang.launch_server"),
                 ("module", "sglang_dspark.evaluate"), ("module", "sglang_dspark.train"), ("make", "demo")]:
        assert want in kinds, want
    assert len(CMDS) >= 20


def _spy_all() -> dict[tuple[str, str], dict]:
    groups: dict[tuple[str, str], list[list[str]]] = defaultdict(list)
    for c in CMDS:
        if c.kind in ("module", "script", "entry") and c.args not in groups[(c.kind, c.target)]:
            groups[(c.kind, c.target)].append(c.args)
    out = {}
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    for (kind, target), argsets in groups.items():
        tag = re.sub(r"\W", "_", f"{kind}-{target}")
        a, o = tmp / f"readme-spy-{os.getpid()}-{tag}-args.json", tmp / f"readme-spy-{os.getpid()}-{tag}.json"
        a.write_text(json.dumps(argsets))
        r = subprocess.run([sys.executable, str(SPY), kind, target, str(a), str(o)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
        out[(kind, target)] = {"rc": r.returncode, "stderr": r.stderr[-3000:],
                               "info": json.loads(o.read_text()) if r.returncode == 0 and o.is_file() else None}
        for f in (a, o):
            f.unlink(missing_ok=True)
    return out


@pytest.fixture(scope="module")
def spied():
    return _spy_all()


def _flags(args: list[str], info: dict) -> list[tuple[str, dict, str]]:
    """(flag, parser node it must belong to, subcommand path) for every flag in ``args``."""
    node, path, out = info, [], []
    for a in args:
        if a.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", a):
            out.append((a.split("=", 1)[0], node, " ".join(path)))
        elif a in node["subcommands"]:
            path.append(a)
            node = node["subcommands"][a]
    return out


@pytest.mark.parametrize("cmd", [c for c in CMDS if c.kind in ("module", "script", "entry")], ids=repr)
def test_readme_command_matches_its_parser(cmd, spied):
    if cmd.kind == "entry":
        assert (BIN / cmd.target).is_file(), f"{cmd}: console script {cmd.target} is not installed in {BIN}"
    if cmd.kind == "script":
        assert (REPO / cmd.target).is_file(), f"{cmd}: no such file {cmd.target}"
    res = spied[(cmd.kind, cmd.target)]
    assert res["rc"] == 0 and res["info"], f"{cmd}: the program does not reach its parser:\n{res['stderr']}"
    info = res["info"]
    for flag, node, path in _flags(cmd.args, info):
        assert flag in node["options"], (f"{cmd}: {flag} is not an option of {node['prog']} "
                                         f"(it has {', '.join(o for o in node['options'] if o.startswith('--'))})")
    names = [a for a in cmd.args if not a.startswith("-")]
    node, path = info, []
    for a in names:
        if a in node["subcommands"]:
            path.append(a)
            node = node["subcommands"][a]
            h = info["help"][" ".join(path)]
            assert h["code"] == 0 and h["chars"] > 100, f"{cmd}: `{' '.join(path)} --help` failed: {h['stderr']}"
    assert info["help"][""]["code"] == 0, f"{cmd}: --help failed: {info['help']['']['stderr']}"
    if info["subcommands"] and not path and cmd.args:     # (a bare program name is a reference)
        pytest.fail(f"{cmd}: names no subcommand of {info['prog']} ({', '.join(info['subcommands'])})")
    if not cmd.elided:
        parsed = next(p for p in info["parsed"] if p["args"] == cmd.args)
        assert parsed["code"] == 0, f"{cmd}: the real parser refuses it:\n{parsed['stderr']}"


@pytest.mark.parametrize("cmd", [c for c in CMDS if c.kind == "make"], ids=repr)
def test_readme_make_targets_exist(cmd):
    r = subprocess.run(["make", "-n", cmd.target], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{cmd}: {r.stderr}"


def test_readme_pip_lines_install_this_projects_distributions():
    lines = [c for c in CMDS if c.kind == "pip"]
    assert lines
    makefile = (REPO / "Makefile").read_text()
    for c in lines:
        assert c.args[0] == "install", c
        path = [a for a in c.args[1:] if not a.startswith("-")][-1]
        assert (REPO / path / "pyproject.toml").is_file(), c
        # make install (CI, make demo) installs the same distribution
        assert path == "." or path in makefile, c


# ------------------------------------------------------------------ engine-free commands, run for real
def _one(pred) -> Cmd:
    found = [c for c in CMDS if pred(c)]
    assert found, "README no longer shows this command; update the test with it"
    return found[0]


def _run(args: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kw)


def test_readme_plan_command_gives_the_result_its_comment_states():
    cmd = _one(lambda c: c.kind == "entry" and c.args[:1] == ["plan"])
    m = re.search(r"lengths (\[[\d, ]*\])", cmd.text)
    assert m, f"{cmd}: its comment should state the lengths it prints"
    r = _run([str(BIN / "dspark-controller"), *cmd.args])
    assert r.returncode == 0, r.stderr
    assert f"lengths: {m.group(1)}" in r.stdout, r.stdout


def _free_base_port() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + 2 < 65536 and all(_port_free(p + i) for i in range(3)):
            return p
    raise RuntimeError("no three free consecutive ports")


def _port_free(p: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            return False
    return True


def test_readme_controller_serve_status_and_set_work_together(tmp_path):
    """README's serve, status and set commands, on free ports instead of 7150 / 7152 (the
    CLI endpoint is the base port + 2), with the per-user state folder in tmp_path."""
    serve = _one(lambda c: c.kind == "entry" and c.args[:1] == ["serve"])
    status = _one(lambda c: c.kind == "entry" and c.args[:1] == ["status"])
    set_ = _one(lambda c: c.kind == "entry" and c.args[:1] == ["set"])
    base = _free_base_port()

    def ports(args: list[str]) -> list[str]:
        return [a.replace(":7150", f":{base}").replace(":7152", f":{base + 2}") for a in args]
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), HOME=str(tmp_path))
    exe = str(BIN / "dspark-controller")
    proc = subprocess.Popen([exe, *ports(serve.args)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            r = _run([exe, *ports(status.args)], env=env)
            if r.returncode == 0 or time.monotonic() > deadline or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert r.returncode == 0, (r.stdout, r.stderr)
        connect = [] if "--connect" in set_.args else ["--connect", f"tcp://127.0.0.1:{base + 2}"]
        r = _run([exe, *ports(set_.args), *connect], env=env)
        assert r.returncode == 0, (r.stdout, r.stderr)
        r = _run([exe, *ports(status.args), "--json"], env=env)
        assert r.returncode == 0 and '"sla"' in r.stdout, r.stdout
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_readme_tiny_models_command_builds_a_pair(tmp_path):
    cmd = _one(lambda c: c.kind == "module" and c.target == "sglang_dspark.tiny_models")
    args = [str(tmp_path / "pair") if a == "DIR" else a for a in cmd.args]
    r = _run([sys.executable, "-m", cmd.target, *args], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for sub in ("target", "draft"):
        assert (tmp_path / "pair" / sub / "config.json").is_file()


def test_launch_cpu_example_runs_sglang_with_flags_it_accepts(tmp_path):
    """``examples/launch_cpu.sh`` as a fresh clone runs it (from any folder), with ``PYTHON``
    pointed at a stand-in that hands the server command line to SGLang's real parser instead
    of starting a server: the script finds the committed pair and every flag it passes
    parses."""
    args_json, out_json = tmp_path / "args.json", tmp_path / "out.json"
    shim = tmp_path / "python"
    shim.write_text(
        f"#!{sys.executable}\n"
        "import json, subprocess, sys\n"
        "assert sys.argv[1] == '-m', sys.argv\n"
        f"json.dump([sys.argv[3:]], open({str(args_json)!r}, 'w'))\n"
        f"sys.exit(subprocess.call([{sys.executable!r}, {str(SPY)!r}, 'module', sys.argv[2], "
        f"{str(args_json)!r}, {str(out_json)!r}]))\n")
    shim.chmod(0o755)
    for extra in ({}, {"TABLE": str(REPO / "profiles" / "tiny-cpu-2core.sglang-sps-table.json")}):
        r = subprocess.run(["bash", str(REPO / "examples" / "launch_cpu.sh")], cwd=tmp_path,
                           env=dict(os.environ, PYTHON=str(shim), **extra), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        info = json.loads(out_json.read_text())
        argv = json.loads(args_json.read_text())[0]
        assert info["prog"] == "sglang serve" and info["parsed"][0]["code"] == 0, info["parsed"]
        assert argv[argv.index("--model-path") + 1] == "models/tiny-stdlib/target"
        assert argv[argv.index("--speculative-draft-model-path") + 1] == "models/tiny-stdlib/draft"
        assert (REPO / argv[argv.index("--model-path") + 1] / "config.json").is_file()
        assert ("--speculative-dspark-sps-table-path" in argv) == bool(extra)
    r = subprocess.run(["bash", str(REPO / "examples" / "launch_cpu.sh")], cwd=tmp_path,
                       env=dict(os.environ, PYTHON=str(tmp_path / "no-such-python")), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "make install" in r.stderr
