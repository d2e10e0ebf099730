"""The frozen Hugging Face target: load it, capture its hidden states and logits online."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch


class TargetError(ValueError):
    pass


@dataclass
class TargetBatch:
    feats: torch.Tensor     # [B, T, K*H] hidden states of target_layer_ids, concatenated
    logits: torch.Tensor    # [B, T, V] next-token logits (row t predicts token t+1)


class Target:
    """A local HF causal LM (``AutoModelForCausalLM``), frozen, in eval mode."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: str = "float32"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        if not (path / "config.json").is_file():
            raise TargetError(f"target {path} has no config.json: pass a local Hugging Face "
                              "model directory (hub ids are not downloaded).")
        self.path = path
        self.config = json.loads((path / "config.json").read_text())
        self.config = self.config.get("text_config", self.config)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=getattr(torch, dtype), local_files_only=True).to(device)
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.device = device
        self.num_layers = int(self.config["num_hidden_layers"])

    @property
    def embed(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    @property
    def lm_head(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @torch.no_grad()
    def run(self, tokens: torch.Tensor, layer_ids: tuple[int, ...]) -> TargetBatch:
        """One forward pass; ``layer_ids`` use SGLang's convention: id k is the output of
        decoder layer k, i.e. HF ``hidden_states[k + 1]`` (the residual stream that enters
        layer k+1)."""
        bad = [k for k in layer_ids if not 0 <= k < self.num_layers - 1]
        if bad:
            raise TargetError(f"target_layer_ids {bad} invalid for a {self.num_layers}-layer target; "
                              f"use ids in [0, {self.num_layers - 2}].")
        out = self.model(input_ids=tokens.to(self.device), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[k + 1] for k in layer_ids], dim=-1)
        return TargetBatch(feats=feats.float(), logits=out.logits.float())
