"""cpu/pool.py: the KV pool a CPU server gets when no size is set."""

import json

from sglang_dspark.cpu.pool import FALLBACK_TOKENS, MAX_TOKENS, default_cpu_pool_tokens, kv_bytes_per_token


def _cfg(tmp_path, **cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_kv_bytes_per_token_from_config(tmp_path):
    p = _cfg(tmp_path, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
             hidden_size=3584, torch_dtype="bfloat16")
    assert kv_bytes_per_token(p) == 2 * 28 * 4 * 128 * 2
    assert kv_bytes_per_token(p, "float32") == 2 * 28 * 4 * 128 * 4


def test_small_models_are_capped_by_count_large_ones_by_ram(tmp_path):
    tiny = _cfg(tmp_path, num_hidden_layers=4, num_attention_heads=4, head_dim=16, torch_dtype="float32")
    assert default_cpu_pool_tokens(tiny, ram_bytes=24 << 30)[0] == MAX_TOKENS
    big = tmp_path / "big"
    big.mkdir()
    p = _cfg(big, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
             torch_dtype="bfloat16")
    tokens, how = default_cpu_pool_tokens(p, ram_bytes=24 << 30)
    assert tokens == int(0.1 * (24 << 30)) // (2 * 80 * 8 * 128 * 2) and "10% of 24.0 GiB" in how


def test_unreadable_config_falls_back(tmp_path):
    assert default_cpu_pool_tokens(str(tmp_path / "nope"))[0] == FALLBACK_TOKENS
