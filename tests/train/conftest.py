import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def small_target(tmp_path_factory):
    """A genuinely trained (briefly) 3-layer Qwen3 target on stdlib text."""
    import torch

    from sglang_dspark.train.tiny_pair import TinyTargetConfig, train_target

    torch.set_num_threads(2)
    out = tmp_path_factory.mktemp("target")
    cfg = TinyTargetConfig(hidden_size=64, intermediate_size=128, num_layers=3, num_heads=2,
                           num_kv_heads=1, head_dim=32, seq_len=64, batch_size=8, steps=60,
                           warmup=10, max_train_chars=120_000)
    info = train_target(out, cfg, log=None)
    return {"dir": out, "info": info}


@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    from sglang_dspark.train.data import split_stdlib

    train, _ = split_stdlib()
    p = tmp_path_factory.mktemp("data") / "corpus.txt"
    p.write_text("\n".join(f.read_text(encoding="utf-8", errors="replace") for f in train[:6]))
    return p


@pytest.fixture(scope="session")
def trained_drafts(small_target, text_file, tmp_path_factory):
    """A DSpark and a DFlash-mode draft (short runs) plus the DFlash serving export."""
    from sglang_dspark.train.data import load_corpus
    from sglang_dspark.train.model import export_dflash_as_neutral_dspark
    from sglang_dspark.train.target import Target
    from sglang_dspark.train.trainer import DraftTrainConfig, train_draft

    target = Target(small_target["dir"])
    seqs = load_corpus(target.tokenizer, [text_file], 64, max_sequences=400)
    root = tmp_path_factory.mktemp("drafts")
    out = {"target": target}
    for mode in ("dspark", "dflash"):
        cfg = DraftTrainConfig(mode=mode, block_size=4, steps=60, batch_size=8,
                               anchors_per_seq=12, markov_rank=32, lr=3e-3, warmup=5)
        res = train_draft(target, seqs, cfg, root / mode, log=None)
        out[mode] = root / mode
        out[f"{mode}_history"] = res.history
    out["dflash_served"] = export_dflash_as_neutral_dspark(root / "dflash", root / "dflash-served")
    return out
