"""The KV pool size a CPU server gets when the user sets none.

On CPU, SGLang sizes the KV pool from free RAM: for the 5 MB tiny pair that is 11.7M
tokens (5.6 GB each for K and V), 44 s to allocate and 94 s to start on a 23 GB machine.
When ``--device cpu`` is given without ``--max-total-tokens``, the plugin declares

    max_total_tokens = min(MAX_TOKENS, RAM_SHARE * physical RAM / KV bytes per token)

with the target's KV bytes per token = 2 (K and V) x layers x KV heads x head dim x
element size, read from its ``config.json`` (``num_hidden_layers``,
``num_key_value_heads`` or ``num_attention_heads``, ``head_dim`` or hidden size / heads,
``torch_dtype``); a config it cannot read gives ``FALLBACK_TOKENS``.  The draft's own
KV is a few layers more and is not counted.  ``--max-total-tokens`` overrides it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

MAX_TOKENS = 131072          # 32 requests x 4096 tokens: plenty for a CPU server
RAM_SHARE = 0.10             # at most a tenth of physical RAM for the target's KV
FALLBACK_TOKENS = 32768
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def kv_bytes_per_token(model_path: str, dtype: Optional[str] = None) -> Optional[int]:
    """K+V bytes per token of the target at ``model_path`` (None: unreadable config)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    name = dtype if dtype not in (None, "auto") else cfg.get("torch_dtype", "bfloat16")
    elem = _DTYPE_BYTES.get(str(name).replace("torch.", ""), 2)
    return 2 * layers * kv_heads * head_dim * elem


def physical_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_cpu_pool_tokens(model_path: str, dtype: Optional[str] = None,
                            ram_bytes: Optional[int] = None) -> tuple[int, str]:
    """(tokens, how they were derived) for a CPU server with no pool size set."""
    per_token = kv_bytes_per_token(model_path, dtype)
    if per_token is None:
        return FALLBACK_TOKENS, f"{FALLBACK_TOKENS} tokens (the target's config.json gives no KV size)"
    ram = physical_ram_bytes() if ram_bytes is None else int(ram_bytes)
    by_ram = int(RAM_SHARE * ram) // per_token
    tokens = max(1024, min(MAX_TOKENS, by_ram))
    return tokens, (f"min({MAX_TOKENS} tokens, {RAM_SHARE:.0%} of {ram / 2**30:.1f} GiB RAM / "
                    f"{per_token} KV bytes per token = {by_ram})")
