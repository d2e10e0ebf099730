"""The ``dspark_cpu`` attention backend: SGLang's IntelAMXAttnBackend, taught
DSpark's verify layouts.

SGLang's AMX backend derives TARGET_VERIFY extend metadata assuming a token tree
(``spec_info.tree_topk``) and uniform ``draft_token_num`` tokens per request.
DSpark verifies chains (no tree mask) and, in ``compact`` ragged mode, a
*different* number of tokens per request (``ragged_verify_layout.verify_lens``).
This subclass supplies exactly that metadata; the attention maths stays SGLang's
(running on :mod:`sglang_dspark.cpu.ops` where ``sgl_kernel`` has no CPU build).
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend


class DSparkCpuAttnBackend(IntelAMXAttnBackend):
    def _build_extend_metadata(self, forward_batch):
        spec = forward_batch.spec_info
        if not forward_batch.forward_mode.is_target_verify() or hasattr(spec, "tree_topk"):
            return super()._build_extend_metadata(forward_batch)
        if spec is None:
            raise RuntimeError("spec_info is unset in TARGET_VERIFY mode.")
        bs = forward_batch.batch_size
        layout = getattr(spec, "ragged_verify_layout", None)
        if layout is not None:
            lens = layout.verify_lens[:bs].to(device=self.device, dtype=torch.int32)
            start = layout.extend_start_loc[:bs].to(device=self.device, dtype=torch.int32)
        else:
            n = int(spec.draft_token_num)
            lens = torch.full((bs,), n, dtype=torch.int32, device=self.device)
            start = torch.arange(0, bs * n, n, dtype=torch.int32, device=self.device)
        seq_lens = forward_batch.seq_lens + lens
        return seq_lens, lens, start, None
