"""Rebuild ``tiny-heldout.jsonl``: prompts from standard-library files that the tiny
pair's tokenizer was NOT trained on (see ``sglang_dspark.tiny_models._CORPUS_FILES``).

    python examples/prompts/build_tiny_heldout.py [--out examples/prompts/tiny-heldout.jsonl]

Deterministic for a given CPython version: fixed files, fixed line windows.  Each
line is DeepSpec-format ``{"turns": [...]}``; every fourth prompt has a second turn.
"""

import argparse
import json
import sysconfig
from pathlib import Path

FILES = ("queue.py", "pprint.py", "base64.py", "getopt.py", "sched.py", "netrc.py",
         "graphlib.py", "statistics.py")
PER_FILE = 8
WINDOW = 12  # lines per snippet
ASKS = ("Continue this Python code:\n", "Explain what this code does:\n",
        "Rewrite this code more clearly:\n", "Write a test for this code:\n")


def build() -> list[dict]:
    from sglang_dspark.tiny_models import _CORPUS_FILES

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert not set(FILES) & set(_CORPUS_FILES), "held-out files overlap the tokenizer corpus"
    out = []
    for name in FILES:
        lines = (stdlib / name).read_text(encoding="utf-8").splitlines()
        lines = [ln for ln in lines if ln.strip()]
        step = max((len(lines) - WINDOW) // PER_FILE, 1)
        for j in range(PER_FILE):
            snippet = "\n".join(lines[j * step: j * step + WINDOW])
            n = len(out)
            turns = [ASKS[n % len(ASKS)] + snippet]
            if n % 4 == 3:
                turns.append("Now make it shorter.")
            out.append({"id": f"{name}:{j}", "turns": turns})
    return out


def write_prompts(recs: list[dict], out: str) -> None:
    """One DeepSpec-format JSON object per line (shared with build_stdlib_heldout.py)."""
    with open(out, "w", encoding="utf-8") as fh:
        for r in recs:
            fh.write(json.dumps(r) + "\n")
    print(f"wrote {len(recs)} prompts to {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).with_name("tiny-heldout.jsonl")))
    args = ap.parse_args()
    write_prompts(build(), args.out)


if __name__ == "__main__":
    main()
