"""An SGLang frontend program against a running DSPARK server.

    python examples/frontend_program.py --url http://127.0.0.1:30000 [--concurrency 6]

Runs a small multi-step program (a code completion, then a follow-up) for several
prompts concurrently with ``run_batch`` and prints what each produced.
"""

import argparse

import sglang as sgl

PROMPTS = [
    "def fibonacci(n):",
    "import heapq\n\ndef top_k(items, k):",
    "class Stack:\n    def __init__(self):",
    "The quick brown fox",
    "for line in open(path):",
    "# Parse a CSV file\nimport csv\n",
]


@sgl.function
def complete_then_explain(s, prompt):
    s += prompt
    s += sgl.gen("body", max_tokens=48, temperature=0.0)
    s += "\n# Next:"
    s += sgl.gen("next", max_tokens=24, temperature=0.0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--concurrency", type=int, default=len(PROMPTS))
    args = ap.parse_args(argv)
    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    states = complete_then_explain.run_batch(
        [{"prompt": p} for p in PROMPTS], num_threads=args.concurrency)
    for p, st in zip(PROMPTS, states):
        print(f"--- {p!r}\n    body: {st['body']!r}\n    next: {st['next']!r}")
    return states


if __name__ == "__main__":
    main()
