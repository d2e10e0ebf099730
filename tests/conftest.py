import json

import pytest


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """Sharp tiny pair: greedy margins far above bf16 rounding."""
    from sglang_dspark.tiny_models import TinySpec, build_pair

    out = tmp_path_factory.mktemp("tiny")
    manifest = build_pair(out, TinySpec(seed=0))
    return {"target": str(out / "target"), "draft": str(out / "draft"), "manifest": manifest}


@pytest.fixture(scope="session")
def sps_table(tmp_path_factory):
    """A steep SGLang SpsCostTable: every extra verify token costs, so budgets fall."""
    p = tmp_path_factory.mktemp("sps") / "table.json"
    bt = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]
    p.write_text(json.dumps({"sample_batch_tokens": bt,
                             "sample_steps_per_sec": [400.0 / b for b in bt],
                             "max_batch_tokens": 256}))
    return str(p)
