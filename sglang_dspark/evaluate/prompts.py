"""Prompt sets in DeepSpec's JSONL format: one ``{"turns": ["user msg", ...]}`` per line.

Validated with pydantic at the boundary; every error names the file and line and
says what to fix.  Extra keys (``question_id``, ``category``, ...) are allowed and kept.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class PromptSetError(ValueError):
    """A prompt file that cannot be used; the message tells the user what to fix."""


class PromptRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    turns: list[str] = Field(min_length=1)

    @field_validator("turns")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if any(not t.strip() for t in v):
            raise ValueError("every turn must be a non-empty string")
        return v


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[PromptRecord]:
    p = Path(path)
    if not p.is_file():
        raise PromptSetError(f"prompt file {p} does not exist (pass a JSONL file with one "
                             '{"turns": ["..."]} object per line)')
    out: list[PromptRecord] = []
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PromptSetError(f"{p}:{n}: not valid JSON ({e.msg}); each line must be one "
                                     'JSON object like {"turns": ["user message"]}') from None
            if not isinstance(obj, dict):
                raise PromptSetError(f"{p}:{n}: expected a JSON object with a 'turns' list, got "
                                     f"{type(obj).__name__}")
            try:
                out.append(PromptRecord.model_validate(obj))
            except ValidationError as e:
                errs = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'record'}: {x['msg']}"
                                 for x in e.errors())
                raise PromptSetError(f"{p}:{n}: invalid prompt record ({errs}); expected "
                                     '{"turns": ["non-empty user message", ...]}') from None
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise PromptSetError(f"{p} holds no prompts (empty file?)")
    return out
