"""Build ``stdlib-heldout.jsonl``: plain-text prompts for the trained tiny pair
(``python -m sglang_dspark.train tiny-pair``) from the standard-library files its target
and drafters were NOT trained on (``sglang_dspark.train.data.split_stdlib``: every 8th file).

    python examples/prompts/build_stdlib_heldout.py [--per-file 40] [--lines 6] [--out FILE]

Each line is DeepSpec-format ``{"turns": ["<6 source lines>"]}``; use it with
``--no-chat-template`` (the tiny target is a plain code LM, it has never seen a chat).
Deterministic for a given CPython version: fixed files, evenly spaced line windows.
Many short, independent prompts matter for calibration: acceptance varies from file to
file, and ECE on a held-out half is only meaningful when both halves mix many files.

Committed sets: ``stdlib-heldout.jsonl`` (default, 600 prompts) and
``stdlib-heldout-large.jsonl`` (``--per-file 160 --out stdlib-heldout-large.jsonl``,
2386 prompts; what the ECE target is measured on, docs/evaluation.md).
"""

import argparse
from pathlib import Path

from build_tiny_heldout import write_prompts  # this script's directory is on sys.path


def build(per_file: int = 40, lines_per_prompt: int = 6) -> list[dict]:
    from sglang_dspark.train.data import split_stdlib

    _, held = split_stdlib()
    out = []
    for f in held:
        lines = [ln for ln in f.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        if len(lines) < lines_per_prompt:
            continue
        step = max((len(lines) - lines_per_prompt) // per_file, 1)
        for j in range(per_file):
            s = j * step
            if s + lines_per_prompt > len(lines):
                break
            out.append({"id": f"{f.name}:{s}", "turns": ["\n".join(lines[s:s + lines_per_prompt]) + "\n"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-file", type=int, default=40)
    ap.add_argument("--lines", type=int, default=6)
    ap.add_argument("--out", default=str(Path(__file__).with_name("stdlib-heldout.jsonl")))
    args = ap.parse_args()
    if args.per_file < 1 or args.lines < 1:
        ap.error("--per-file and --lines must be >= 1")
    write_prompts(build(args.per_file, args.lines), args.out)


if __name__ == "__main__":
    main()
