"""Training data: plain-text corpora, chat JSONL with assistant masks, anchor sampling.

* Plain text (``.txt``, ``.py``, ``.md``, ...): the token stream of each file is cut
  into windows of ``seq_len``; every position is trainable.
* Chat JSONL: one ``{"messages": [{"role": ..., "content": ...}, ...]}`` per line,
  rendered with the target tokenizer's chat template; only tokens inside assistant
  messages are trainable, and anchors are drawn from assistant tokens only.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ValidationError, field_validator

TEXT_SUFFIXES = (".txt", ".py", ".md", ".rst", ".text")


class DataError(ValueError):
    pass


@dataclass(frozen=True)
class Sequence:
    tokens: tuple[int, ...]
    loss_mask: tuple[bool, ...]   # True where a token may be predicted / be an anchor


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class ChatRecord(BaseModel):
    messages: list[ChatMessage]

    @field_validator("messages")
    @classmethod
    def _has_assistant(cls, v):
        if not v:
            raise ValueError("messages is empty")
        if not any(m.role == "assistant" for m in v):
            raise ValueError("no assistant message (nothing to train on)")
        return v


# ------------------------------------------------------------------ corpora
def stdlib_files(min_bytes: int = 4000, max_bytes: int = 80000) -> list[Path]:
    """Deterministic list of top-level standard-library modules (sorted by name)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.glob("*.py"))
             if min_bytes <= p.stat().st_size <= max_bytes and not p.name.startswith("_")]
    if not files:
        raise DataError(f"no standard-library sources found under {root}.")
    return files


def split_stdlib(heldout_every: int = 8) -> tuple[list[Path], list[Path]]:
    """(train, held-out): every ``heldout_every``-th file (by sorted name) is held out."""
    files = stdlib_files()
    held = [f for i, f in enumerate(files) if i % heldout_every == heldout_every // 2]
    train = [f for f in files if f not in held]
    return train, held


def text_sequences(tokenizer, texts: list[str], seq_len: int, stride: int | None = None,
                   max_sequences: int | None = None) -> list[Sequence]:
    stride = stride or seq_len
    out: list[Sequence] = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for s in range(0, max(1, len(ids) - seq_len + 1), stride):
            chunk = ids[s:s + seq_len]
            if len(chunk) < seq_len // 2:
                continue
            out.append(Sequence(tuple(chunk), tuple([True] * len(chunk))))
            if max_sequences and len(out) >= max_sequences:
                return out
    return out


def chat_sequences(tokenizer, path: Path, seq_len: int,
                   max_sequences: int | None = None) -> list[Sequence]:
    """Parse chat JSONL; assistant-content tokens (plus their end-of-turn token) are trainable."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError("the target tokenizer has no chat_template; use a plain-text corpus "
                        "or add a chat template to the tokenizer.")
    out: list[Sequence] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = ChatRecord.model_validate(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be "
                                '{"messages": [{"role": ..., "content": ...}]}.') from None
            except ValidationError as e:
                first = e.errors()[0]
                loc = ".".join(str(x) for x in first["loc"])
                raise DataError(f"{path}:{lineno}: bad chat record at {loc or 'top level'}: "
                                f"{first['msg']}; each line must be "
                                '{"messages": [{"role": "user"|"assistant"|..., "content": str}]}.'
                                ) from None
            msgs = [m.model_dump() for m in rec.messages]
            text = tokenizer.apply_chat_template(msgs, tokenize=False)
            spans = []
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                upto = tokenizer.apply_chat_template(msgs[:i + 1], tokenize=False)
                # the turn ends the rendering; its content is the last occurrence
                start, end = upto.rfind(m["content"]), len(upto)
                if start < 0:
                    raise DataError(f"{path}:{lineno}: the chat template does not render "
                                    "assistant content verbatim; cannot locate its tokens.")
                spans.append((start, end))
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, offs = enc["input_ids"], enc["offset_mapping"]
            mask = [any(s <= a < e for s, e in spans) for a, _ in offs]
            ids, mask = ids[:seq_len], mask[:seq_len]
            if sum(mask) >= 2:
                out.append(Sequence(tuple(ids), tuple(mask)))
            if max_sequences and len(out) >= max_sequences:
                break
    if not out:
        raise DataError(f"{path}: no usable chat records (need assistant tokens within "
                        f"the first {seq_len} tokens).")
    return out


def load_corpus(tokenizer, paths: list[Path], seq_len: int,
                max_sequences: int | None = None) -> list[Sequence]:
    """Dispatch on file type: ``*.jsonl`` -> chat, text suffixes -> plain text."""
    seqs: list[Sequence] = []
    texts: list[str] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise DataError(f"data file {p} does not exist.")
        if p.is_dir():
            raise DataError(f"{p} is a directory; pass files (e.g. {p}/*.txt).")
        if p.suffix == ".jsonl":
            seqs += chat_sequences(tokenizer, p, seq_len, max_sequences)
        elif p.suffix in TEXT_SUFFIXES:
            texts.append(p.read_text(encoding="utf-8", errors="replace"))
        else:
            raise DataError(f"{p}: unsupported data file type {p.suffix!r}; use .jsonl (chat) "
                            f"or one of {', '.join(TEXT_SUFFIXES)} (plain text).")
    if texts:
        seqs += text_sequences(tokenizer, texts, seq_len, max_sequences=max_sequences)
    if not seqs:
        raise DataError("the data files produced no training sequences (too short?).")
    return seqs


# ------------------------------------------------------------------ batching
def pad_batch(seqs: list[Sequence], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(s.tokens) for s in seqs)
    tok = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    msk = torch.zeros((len(seqs), T), dtype=torch.bool)
    for i, s in enumerate(seqs):
        tok[i, :len(s.tokens)] = torch.tensor(s.tokens)
        msk[i, :len(s.tokens)] = torch.tensor(s.loss_mask)
    return tok, msk


def eligible_anchors(loss_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: p is an anchor candidate when p >= 1 (some context precedes it), the
    anchor token itself and the first token it predicts (p+1) are trainable."""
    ok = torch.zeros_like(loss_mask)
    ok[:, 1:-1] = loss_mask[:, 1:-1] & loss_mask[:, 2:]
    return ok


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, gen: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``num_anchors`` distinct anchors per row, uniformly among eligible positions.

    Returns (anchors [B, A] long, anchor_ok [B, A] bool); rows with fewer candidates
    repeat position 1 and mark the surplus not ok."""
    elig = eligible_anchors(loss_mask)
    B, T = elig.shape
    scores = torch.rand((B, T), generator=gen)
    scores = torch.where(elig, scores, torch.full_like(scores, -1.0))
    A = min(num_anchors, T)
    top = scores.topk(A, dim=1)
    ok = top.values >= 0
    anchors = torch.where(ok, top.indices, torch.ones_like(top.indices))
    order = anchors.argsort(dim=1)
    return torch.gather(anchors, 1, order), torch.gather(ok, 1, order)
