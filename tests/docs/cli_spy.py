"""Run a command-line program up to its argument parsing and describe its parser (no side
effects past the parse: nothing is launched).

    python tests/docs/cli_spy.py KIND TARGET ARGSETS.json OUT.json

KIND is ``module`` (``python -m TARGET``), ``script`` (``python TARGET``) or ``entry``
(a console script named TARGET, looked up in this interpreter's entry points).  The
program runs as it would from a shell until its first ``ArgumentParser.parse_known_args``
call (what ``parse_args`` calls); that parser is captured and the program stops there.
ARGSETS.json is a list of argument lists (one per documented command line).  OUT.json then
holds the parser tree (option strings and subcommands), the outcome of ``--help`` for the
program and for every subcommand path named in any argument list, and for each argument
list the outcome of parsing it with the real parser (``code`` 0 = parsed, ``stderr``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import sys
from importlib import metadata

_REAL = argparse.ArgumentParser.parse_known_args


class _Captured(BaseException):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def _spy(self, args=None, namespace=None):
    raise _Captured(self)


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            out.update(a.choices)
    return out


def describe(p: argparse.ArgumentParser) -> dict:
    return {"prog": p.prog, "options": sorted(p._option_string_actions),
            "subcommands": {k: describe(v) for k, v in _subparsers(p).items()}}


def _run_parse(p: argparse.ArgumentParser, argv: list[str]) -> tuple[int, str, str]:
    """Parse ``argv`` with the real parser: (exit code, stdout, stderr); 0 when it parsed."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            p.parse_args(argv)      # parse_known_args restored: unknown arguments are errors
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def main() -> int:
    kind, target, argsets_path, out_path = sys.argv[1:]
    with open(argsets_path, encoding="utf-8") as fh:
        argsets: list[list[str]] = json.load(fh)
    argparse.ArgumentParser.parse_known_args = _spy
    parser = None
    try:
        if kind == "module":
            sys.argv = [target]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "script":
            sys.argv = [target]
            runpy.run_path(target, run_name="__main__")
        elif kind == "entry":
            eps = [e for e in metadata.entry_points(group="console_scripts") if e.name == target]
            if not eps:
                raise SystemExit(f"no console script named {target!r} is installed")
            sys.argv = [target]
            eps[0].load()()
        else:
            raise SystemExit(f"unknown kind {kind!r}")
    except _Captured as c:
        parser = c.parser
    finally:
        argparse.ArgumentParser.parse_known_args = _REAL
    if parser is None:
        raise SystemExit(f"{kind} {target} finished without parsing any arguments")
    info = describe(parser)
    paths: list[list[str]] = [[]]          # subcommand paths named in the argument lists
    for args in argsets:
        node, path = parser, []
        for a in args:
            children = _subparsers(node)
            if a in children:
                path.append(a)
                node = children[a]
                if path not in paths:
                    paths.append(list(path))
    info["help"] = {}
    for sp in paths:
        code, text, err = _run_parse(parser, sp + ["--help"])
        info["help"][" ".join(sp)] = {"code": code, "chars": len(text), "stderr": err[-2000:]}
    info["parsed"] = []
    for args in argsets:
        code, _, err = _run_parse(parser, list(args))
        info["parsed"].append({"args": args, "code": code, "stderr": err[-2000:]})
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(info, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
