"""Evaluation of a DSpark target/draft pair through the real SGLang engine.

``python -m sglang_dspark.evaluate --target T --draft D --prompts FILE.jsonl --out DIR``;
see :mod:`sglang_dspark.evaluate.cli` and docs/evaluation.md.
"""

from sglang_dspark.evaluate.metrics import acceptance_summary, served_summary  # noqa: F401
from sglang_dspark.evaluate.prompts import PromptRecord, PromptSetError, load_prompts  # noqa: F401
