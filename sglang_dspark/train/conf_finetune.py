"""Fine-tune ONLY a DSpark drafter's confidence head on the drafter's own rollouts.

Why.  The drafter trainer (:mod:`.loss`) teacher-forces the confidence head: its Markov
input ``x_{k-1}`` is the *corpus* token and its label is ``1 - TV`` between the draft
and the target given the *corpus* prefix.  Serving is different: SGLang feeds the head
``[h_k ; W1[x_{k-1}]]`` with ``x_{k-1}`` the token the draft itself *sampled*, and the
event a confidence stands for (STS multiplies them into the survival
``prod_{i<=k} c_i``) is position k's acceptance *given that positions < k were
accepted* by rejection sampling.  Teacher forcing trains the head on another
distribution of inputs and conditions.

How.
1. Contexts: windows of the drafter's training corpus (never held-out data), each
   ending at its anchor token; one window length per rollout batch, drawn in
   ``[min_context, max_context]``, so windows batch without padding.
2. Rollouts, exactly as SGLang 0.5.23 drafts at temperature T > 0
   (``dspark_draft.draft_markov_block`` / ``MarkovSampleStep``): one target forward
   over the window gives the draft's context features; the frozen backbone gives base
   logits ``U_k``; step k samples ``x_k`` by Gumbel-max from ``softmax((U_k +
   W2 W1[x_{k-1}]) / T)`` with ``x_0`` = anchor (that softmax is ``q_k``, the draft
   distribution SGLang's verifier is given).
3. The target continues from its KV cache over the drafted tokens, so ``p_k`` is the
   target's distribution at T given the context *and the drafted prefix*.  Per
   position: ``TV_k = TV(q_k, p_k)``, the acceptance probability
   ``a_k = min(1, p_k(x_k) / q_k(x_k))`` and a simulated chain rejection test
   ``u_k * q_k(x_k) < p_k(x_k)`` (SGLang's classic chain rule; the first rejection
   ends the block).
4. Loss: ``BCE(conf_logit_k, label_k)`` with label ``1 - TV_k`` (default; the paper's
   label, the expected acceptance of a fresh draft token, which the head cannot see)
   or the realised acceptance (``label="accept"``), restricted to blocks whose
   positions < k were accepted (``prefix="sampled"``) or weighted by the probability
   of that (``prefix="expected"``, same expectation, less noise), times the position
   weight ``exp(-(k-1)/decay)`` of :mod:`.loss` (or uniform).
   Nothing but the head is trained and the rollouts do not depend on the head, so
   they are collected once and the head (one linear layer: a logistic regression on
   fixed features) is fitted on them with Adam.
5. The output directory is the input draft with only ``confidence_head.proj.weight``
   and ``.bias`` replaced: every other tensor is byte-identical, ``config.json`` and
   the other files are copied unchanged, plus a ``conf_finetune.json`` report.

Lossless.  Drafting (backbone, Markov head, shared embedding / LM head) and
verification are untouched, so the served output distribution and the tokens each
drafted block proposes are unchanged.  The confidence only decides how many drafted
tokens SGLang verifies (its budget planner); verifying fewer or more tokens of the same
block never changes what rejection sampling outputs, only how many tokens a round
can accept.

Offline check: a fifth of the rollouts (``eval_frac``) is held out; SGLang-style STS
(:mod:`sglang_dspark.calibrate.sts`) is fitted on the rest with the old and the new
head, and per-position ECE / AUC of the survival ``prod c_i`` against the simulated
prefix acceptance are reported on the held-out rollouts (a proxy for
``python -m sglang_dspark.calibrate``, which measures it through the real engine).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from .data import Sequence
from .loss import position_weights
from .model import DSparkDraft, load_draft
from .target import Target

LABELS = ("tv", "accept", "survival")
PREFIX_MODES = ("sampled", "expected")
POSITION_WEIGHTS = ("decay", "uniform")
CONF_TENSORS = ("confidence_head.proj.weight", "confidence_head.proj.bias")


class ConfFinetuneError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class ConfFinetuneConfig:
    rollouts: int = 16384          # drafted blocks (one anchor each)
    rollout_batch: int = 64        # windows per target forward
    min_context: int = 48          # window length (tokens, anchor included) per batch
    max_context: int = 160
    generate: int = 0              # > 0: extend each window by 0..generate target-sampled
    #                                tokens (per batch), so anchors lie in generated text
    temperature: float = 1.0       # sampling temperature served (draft and verify)
    steps: int = 600               # Adam steps on the collected rollouts
    batch_size: int = 1024         # rollouts per step
    lr: float = 5e-3
    label: str = "tv"              # "tv": 1 - TV_k (soft); "accept": realised acceptance;
    #                                "survival": fit the product prod_{i<=k} c_i to the
    #                                block's survival prod_{i<=k} a_i (what STS scores)
    prefix: str = "sampled"        # "sampled": only blocks whose prefix was accepted;
    #                                "expected": weight = P(prefix accepted | drafts)
    position_weight: str = "decay"  # "decay": exp(-(k-1)/decay) as in the trainer; "uniform"
    decay: float = 4.0
    eval_frac: float = 0.2         # rollouts held out for the offline ECE report
    seed: int = 0
    device: str = "cpu"
    log_every: int = 100

    def validate(self) -> None:
        for name in ("rollouts", "rollout_batch", "steps", "batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ConfFinetuneError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.generate < 0:
            raise ConfFinetuneError(f"generate must be >= 0, got {self.generate}.")
        if self.min_context < 2 or self.max_context < self.min_context:
            raise ConfFinetuneError(
                f"need 2 <= min_context <= max_context, got {self.min_context}, "
                f"{self.max_context}.")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ConfFinetuneError(
                f"temperature must be > 0 (got {self.temperature}); at temperature 0 SGLang "
                "verifies greedily: train the head with `draft --conf-label greedy` instead.")
        if not self.lr > 0:
            raise ConfFinetuneError(f"lr must be > 0, got {self.lr}.")
        if self.label not in LABELS:
            raise ConfFinetuneError(f"label must be one of {LABELS}, got {self.label!r}.")
        if self.prefix not in PREFIX_MODES:
            raise ConfFinetuneError(f"prefix must be one of {PREFIX_MODES}, got {self.prefix!r}.")
        if self.position_weight not in POSITION_WEIGHTS:
            raise ConfFinetuneError(
                f"position_weight must be one of {POSITION_WEIGHTS}, got {self.position_weight!r}.")
        if not self.decay > 0:
            raise ConfFinetuneError(f"decay must be > 0, got {self.decay}.")
        if not 0 <= self.eval_frac < 1:
            raise ConfFinetuneError(f"eval_frac must be in [0, 1), got {self.eval_frac}.")


# ----------------------------------------------------------------- rollouts
@dataclass(frozen=True, kw_only=True)
class Rollouts:
    """N drafted blocks of gamma positions; all tensors [N, G] except ``hidden``."""

    hidden: torch.Tensor       # [N, G, H] the draft's final-normed hidden h_k
    prev: torch.Tensor         # x_{k-1}: Markov / confidence input (x_0 = anchor)
    drafts: torch.Tensor       # x_k, sampled from q_k
    tv: torch.Tensor           # TV(q_k, p_k)
    accept_prob: torch.Tensor  # min(1, p_k(x_k) / q_k(x_k))
    accepted: torch.Tensor     # bool, simulated test u_k * q_k(x_k) < p_k(x_k)

    @property
    def n(self) -> int:
        return int(self.prev.shape[0])

    @property
    def gamma(self) -> int:
        return int(self.prev.shape[1])

    @property
    def prefix_ok(self) -> torch.Tensor:
        return prefix_accepted(self.accepted)

    @property
    def prefix_prob(self) -> torch.Tensor:
        return prefix_probability(self.accept_prob)

    def select(self, idx: torch.Tensor) -> "Rollouts":
        return Rollouts(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @staticmethod
    def cat(parts: list["Rollouts"]) -> "Rollouts":
        return Rollouts(**{f.name: torch.cat([getattr(p, f.name) for p in parts])
                           for f in fields(Rollouts)})


def chain_accept(p_tok: torch.Tensor, q_tok: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """SGLang's classic chain test per position: accept iff ``u * q < p`` with q a valid
    probability (``0 < q <= 1``); whether earlier positions passed is not applied here."""
    return (q_tok > 0) & (q_tok <= 1) & (u * q_tok < p_tok)


def prefix_accepted(accepted: torch.Tensor) -> torch.Tensor:
    """[..., G] per-position test results -> [..., G] bool: every position < k accepted
    (position 1 always qualifies), i.e. position k is reached by the chain."""
    ok = torch.ones_like(accepted, dtype=torch.bool)
    ok[..., 1:] = torch.cumprod(accepted[..., :-1].long(), dim=-1).bool()
    return ok


def prefix_probability(accept_prob: torch.Tensor) -> torch.Tensor:
    """[..., G] -> P(positions < k all accepted | drafted tokens) = prod_{i<k} a_i."""
    out = torch.ones_like(accept_prob)
    out[..., 1:] = torch.cumprod(accept_prob[..., :-1], dim=-1)
    return out


def gumbel_argmax(logits: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One sample per row of ``softmax(logits)`` by SGLang's Gumbel-max: ``argmax(logits -
    log(-log1p(-u)))``; uniforms drawn on the CPU when ``gen`` (a CPU generator) is given."""
    u = torch.rand(logits.shape, generator=gen, device=logits.device if gen is None else "cpu"
                   ).to(logits.device).clamp_(1e-12, 1 - 1e-7)
    return (logits - torch.log(-torch.log1p(-u))).argmax(-1)


def sample_block(draft: DSparkDraft, base: torch.Tensor, anchor: torch.Tensor,
                 temperature: float, gen: torch.Generator | None):
    """SGLang's sampled Markov draft of one block per row.

    base [B, G, V] backbone logits U_k; anchor [B].  Step k: ``logits = U_k +
    W2 W1[x_{k-1}]``, ``x_k = argmax(logits / T + Gumbel)`` (SGLang's Gumbel-max,
    ``MarkovSampleStep``), i.e. a sample of ``q_k = softmax(logits / T)``.
    Returns (drafts [B, G], prev [B, G], q [B, G, V])."""
    B, G, V = base.shape
    prev = anchor.long()
    drafts, prevs, qs = [], [], []
    for k in range(G):
        logits = (base[:, k] + draft.markov_head(prev)).float() / temperature
        prevs.append(prev)
        prev = gumbel_argmax(logits, gen)
        drafts.append(prev)
        qs.append(F.softmax(logits, dim=-1))
    return torch.stack(drafts, 1), torch.stack(prevs, 1), torch.stack(qs, 1)


@torch.no_grad()
def collect_batch(target: Target, draft: DSparkDraft, windows: torch.Tensor, temperature: float,
                  gen: torch.Generator | None) -> Rollouts:
    """Roll out one block per window; windows [B, L] end at their anchor (row L-1)."""
    dev = draft.fc.weight.device
    windows = windows.to(dev)
    B, L = windows.shape
    G = draft.arch.block_size
    out = target.model(input_ids=windows, use_cache=True, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[k + 1] for k in draft.arch.target_layer_ids], -1).float()
    anchors = torch.full((B, 1), L - 1, dtype=torch.long, device=dev)
    h = draft.backbone(feats, windows, anchors)[:, 0]                     # [B, G, H]
    base = h @ draft.lm_head.to(h.dtype).T
    drafts, prev, q = sample_block(draft, base, windows[:, -1], temperature, gen)
    t_logits = [out.logits[:, -1:].float()]                               # predicts x_1
    if G > 1:   # the target continues over x_1..x_{G-1}: p_k given the drafted prefix
        nxt = target.model(input_ids=drafts[:, :G - 1], past_key_values=out.past_key_values,
                           use_cache=True)
        t_logits.append(nxt.logits.float())
    p = F.softmax(torch.cat(t_logits, 1) / temperature, dim=-1)           # [B, G, V]
    tv = 0.5 * (p - q).abs().sum(-1)
    p_tok = p.gather(-1, drafts[..., None]).squeeze(-1)
    q_tok = q.gather(-1, drafts[..., None]).squeeze(-1)
    a = torch.where(q_tok > 0, (p_tok / q_tok).clamp(max=1.0), torch.zeros_like(q_tok))
    u = torch.rand((B, G), generator=gen).to(dev)
    return Rollouts(hidden=h.float().cpu(), prev=prev.cpu(), drafts=drafts.cpu(),
                    tv=tv.cpu(), accept_prob=a.cpu(), accepted=chain_accept(p_tok, q_tok, u).cpu())


@torch.no_grad()
def generate(target: Target, prompts: torch.Tensor, n: int, temperature: float,
             gen: torch.Generator | None) -> torch.Tensor:
    """prompts [B, L] followed by n tokens the target samples at ``temperature``."""
    if n == 0:
        return prompts
    dev = target.model.device
    seq = prompts.to(dev)
    out = target.model(input_ids=seq, use_cache=True)
    new = []
    for i in range(n):
        tok = gumbel_argmax(out.logits[:, -1].float() / temperature, gen)[:, None]
        new.append(tok)
        if i + 1 < n:
            out = target.model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
    return torch.cat([seq] + new, dim=1).cpu()


class WindowSampler:
    """Corpus windows ending at a trainable anchor (``Sequence.loss_mask``)."""

    def __init__(self, seqs: list[Sequence], pad_id: int = 0):
        if not seqs:
            raise ConfFinetuneError("the corpus is empty.")
        T = max(len(s.tokens) for s in seqs)
        self.tokens = torch.full((len(seqs), T), pad_id, dtype=torch.long)
        self.ok = torch.zeros((len(seqs), T), dtype=torch.bool)
        for i, s in enumerate(seqs):
            self.tokens[i, :len(s.tokens)] = torch.tensor(s.tokens)
            self.ok[i, :len(s.tokens)] = torch.tensor(s.loss_mask, dtype=torch.bool)

    def sample(self, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
        """n windows [n, length]; row i is tokens[p-length+1 .. p] for a random anchor p."""
        ok = self.ok.clone()
        ok[:, :length - 1] = False
        cand = ok.nonzero()
        if not len(cand):
            raise ConfFinetuneError(f"no corpus sequence has a trainable anchor after "
                                    f"{length - 1} tokens of context; lower --max-context or "
                                    "pass longer data.")
        pick = cand[torch.randint(len(cand), (n,), generator=gen)]
        cols = pick[:, 1:2] - length + 1 + torch.arange(length)
        return self.tokens[pick[:, :1], cols]


def collect_rollouts(target: Target, draft: DSparkDraft, seqs: list[Sequence],
                     cfg: ConfFinetuneConfig, gen: torch.Generator, log=print) -> Rollouts:
    parts, t0, done = [], time.time(), 0
    windows = WindowSampler(seqs, target.tokenizer.pad_token_id or 0)
    windows.sample(1, cfg.max_context, gen)   # fail early when the corpus is too short
    while done < cfg.rollouts:
        b = min(cfg.rollout_batch, cfg.rollouts - done)
        L = int(torch.randint(cfg.min_context, cfg.max_context + 1, (1,), generator=gen))
        w = windows.sample(b, L, gen)
        if cfg.generate:
            n = int(torch.randint(0, cfg.generate + 1, (1,), generator=gen))
            w = generate(target, w, n, cfg.temperature, gen)
        parts.append(collect_batch(target, draft, w, cfg.temperature, gen))
        done += b
        if log and (len(parts) % 50 == 0 or done == cfg.rollouts):
            log(f"[conf-finetune] rollouts {done}/{cfg.rollouts} ({time.time() - t0:.0f}s)")
    return Rollouts.cat(parts)


# ----------------------------------------------------------------- fitting
def loss_weights(r: Rollouts, cfg: ConfFinetuneConfig) -> torch.Tensor:
    """[N, G] per-position weights: prefix condition x position weight (the survival label
    is an unconditional event: no prefix condition)."""
    if cfg.label == "survival":
        w = torch.ones_like(r.accept_prob, dtype=torch.float32)
    else:
        w = r.prefix_ok.float() if cfg.prefix == "sampled" else r.prefix_prob.float()
    if cfg.position_weight == "decay":
        w = w * position_weights(r.gamma, cfg.decay)
    return w


def labels(r: Rollouts, cfg: ConfFinetuneConfig) -> torch.Tensor:
    return (1.0 - r.tv).clamp(0.0, 1.0) if cfg.label == "tv" else r.accepted.float()


def conf_logits(head: torch.nn.Module, markov_w1: torch.Tensor, r: Rollouts) -> torch.Tensor:
    """The served confidence logit: proj([h_k ; W1[x_{k-1}]])."""
    feats = torch.cat([r.hidden, markov_w1[r.prev]], dim=-1)
    return head(feats).squeeze(-1)


def survival_loss(logits: torch.Tensor, survival: torch.Tensor,
                  weights: torch.Tensor) -> torch.Tensor:
    """BCE between the served survival ``prod_{i<=k} sigmoid(z_i)`` and the block's exact
    survival probability ``prod_{i<=k} a_i`` (given its drafted tokens, the chain test
    accepts positions 1..k with that probability), weighted per position; computed in
    log space so long blocks of confident positions stay finite."""
    log_s = torch.cumsum(F.logsigmoid(logits), dim=-1)                 # log S_hat <= 0
    near_one = log_s > -0.693        # log(1 - S_hat): expm1 near S_hat = 1, log1p below;
    #                                  each branch gets inputs where it is finite (no NaN grads)
    log_1ms = torch.where(near_one, torch.log(-torch.expm1(log_s.clamp(max=-1e-30))),
                          torch.log1p(-torch.exp(log_s.clamp(max=-0.693))))
    bce = -(survival * log_s + (1.0 - survival) * log_1ms)
    return (bce * weights).sum() / weights.sum().clamp(min=1e-6)


def head_loss(head, markov_w1, r: Rollouts, cfg: ConfFinetuneConfig) -> torch.Tensor:
    w = loss_weights(r, cfg)
    if cfg.label == "survival":
        return survival_loss(conf_logits(head, markov_w1, r),
                             torch.cumprod(r.accept_prob.float(), dim=-1), w)
    bce = F.binary_cross_entropy_with_logits(conf_logits(head, markov_w1, r), labels(r, cfg),
                                             reduction="none")
    return (bce * w).sum() / w.sum().clamp(min=1e-6)


def _head_copy(draft: DSparkDraft) -> torch.nn.Linear:
    """A float32 CPU copy of the confidence head's ``proj``."""
    src = draft.confidence_head.proj
    head = torch.nn.Linear(src.in_features, 1, bias=True)
    head.load_state_dict({k: v.detach().float().cpu() for k, v in src.state_dict().items()})
    return head


def fit_head(draft: DSparkDraft, r: Rollouts, cfg: ConfFinetuneConfig, gen: torch.Generator,
             log=print) -> list[dict]:
    """Adam on the confidence head only (a copy is trained, then written back)."""
    src = draft.confidence_head.proj
    head = _head_copy(draft)
    w1 = draft.markov_head.markov_w1.weight.detach().float().cpu()
    opt = torch.optim.Adam(head.parameters(), lr=cfg.lr)
    hist = []
    t0 = time.time()
    for step in range(cfg.steps):
        lr = cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / cfg.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(r.n, (min(cfg.batch_size, r.n),), generator=gen)
        loss = head_loss(head, w1, r.select(idx), cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        hist.append({"step": step, "loss": round(loss.item(), 6)})
        if log and (step % cfg.log_every == 0 or step == cfg.steps - 1):
            log(f"[conf-finetune] step {step:4d} loss={loss.item():.5f} ({time.time() - t0:.0f}s)")
    with torch.no_grad():
        src.weight.copy_(head.weight.to(src.weight))
        src.bias.copy_(head.bias.to(src.bias))
    return hist


# ----------------------------------------------------------------- report
@torch.no_grad()
def offline_metrics(draft: DSparkDraft, fit: Rollouts, held: Rollouts, bins: int = 20) -> dict:
    """STS fitted on ``fit`` rollouts, ECE / AUC of the survival on ``held`` ones."""
    import numpy as np

    from sglang_dspark.calibrate.sts import StsData, fit_sts, position_metrics

    w1 = draft.markov_head.markov_w1.weight.float().cpu()
    head = _head_copy(draft)

    def data(r):
        z = conf_logits(head, w1, r).double().numpy()
        y = torch.cumprod(r.accepted.long(), dim=-1).double().numpy()
        return StsData(logits=z, prefix=y, observed=np.ones(y.shape, dtype=bool))

    fd, hd = data(fit), data(held)
    temps = fit_sts(fd, bins=bins)
    keep = ("position", "prefix_acceptance", "temperature", "ece_before", "ece_after",
            "auc_before", "auc_after", "mean_pred_before", "mean_pred_after")
    return {"temperatures": temps, "fit_rounds": fd.n, "heldout_rounds": hd.n,
            "heldout": [{k: m[k] for k in keep} for m in position_metrics(hd, temps, bins)],
            "fit": [{k: m[k] for k in keep} for m in position_metrics(fd, temps, bins)]}


# ----------------------------------------------------------------- checkpoint
def write_draft_with_head(src: Path, out: Path, head: dict[str, torch.Tensor]) -> Path:
    """Copy draft ``src`` to ``out`` with only the confidence-head tensors replaced."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out)
    state = load_file(str(src / "model.safetensors"))
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    for name in CONF_TENSORS:
        old = state[name]
        state[name] = head[name].detach().cpu().to(old.dtype).reshape(old.shape).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name == "model.safetensors":
            continue
        if f.is_dir():
            shutil.copytree(f, out / f.name, dirs_exist_ok=True)
        else:
            shutil.copy2(f, out / f.name)
    save_file(dict(sorted(state.items())), str(out / "model.safetensors"), metadata=meta)
    return out


def check_draft(draft_dir: Path) -> dict:
    cfg_path = Path(draft_dir) / "config.json"
    if not cfg_path.is_file() or not (Path(draft_dir) / "model.safetensors").is_file():
        raise ConfFinetuneError(f"{draft_dir} is not a draft directory (needs config.json "
                                "and model.safetensors).")
    cfg = json.loads(cfg_path.read_text())
    if not cfg.get("enable_confidence_head", False):
        raise ConfFinetuneError(f"{draft_dir} has no confidence head (enable_confidence_head "
                                "is not true): nothing to fine-tune.")
    if not cfg.get("confidence_head_with_markov", False):
        raise ConfFinetuneError(f"{draft_dir}: only confidence heads with the Markov input "
                                "(confidence_head_with_markov: true) are supported.")
    return cfg


def run_conf_finetune(*, target_dir: Path, draft_dir: Path, out_dir: Path,
                      seqs: list[Sequence], cfg: ConfFinetuneConfig, data_desc: str = "",
                      log=print) -> dict:
    """Rollouts -> fit the head -> write ``out_dir``; returns the report."""
    from sglang_dspark.checkpoint import validate_draft

    cfg.validate()
    target_dir, draft_dir, out_dir = Path(target_dir), Path(draft_dir), Path(out_dir)
    if out_dir.resolve() == draft_dir.resolve():
        raise ConfFinetuneError("--out must differ from --draft (the input draft is kept).")
    check_draft(draft_dir)
    validate_draft(draft_dir, target_dir)
    t0 = time.time()
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    target = Target(target_dir, device=cfg.device)
    draft = load_draft(draft_dir, target.embed.float(), target.lm_head.float()).to(cfg.device)
    draft.eval()
    if cfg.max_context + cfg.generate + draft.arch.block_size > draft.arch.max_position_embeddings:
        raise ConfFinetuneError("max_context + generate + block_size exceeds the draft's "
                                "max_position_embeddings.")
    before = {k: v.detach().clone() for k, v in draft.state_dict().items()}

    r = collect_rollouts(target, draft, seqs, cfg, gen, log)
    t_roll = time.time() - t0
    perm = torch.randperm(r.n, generator=gen)
    n_eval = int(round(cfg.eval_frac * r.n))
    fit, held = r.select(perm[n_eval:]), r.select(perm[:n_eval])
    report = {"config": asdict(cfg), "target": str(target_dir), "draft": str(draft_dir),
              "data": data_desc, "rollouts": r.n, "fit_rollouts": fit.n,
              "eval_rollouts": held.n, "rollout_wall_s": round(t_roll, 1),
              "rollout_stats": {
                  "mean_tv": r.tv.mean(0).tolist(),
                  "prefix_acceptance":
                      torch.cumprod(r.accepted.long(), -1).float().mean(0).tolist(),
                  "expected_accepted_per_block":
                      float(torch.cumprod(r.accept_prob, -1).sum(-1).mean())}}
    if held.n and fit.n:
        report["offline_before"] = offline_metrics(draft, fit, held)
    w1 = draft.markov_head.markov_w1.weight.detach().float().cpu()
    with torch.no_grad():
        report["loss_before"] = float(head_loss(_head_copy(draft), w1, fit, cfg))
    hist = fit_head(draft, fit, cfg, gen, log)
    with torch.no_grad():
        report["loss_after"] = float(head_loss(_head_copy(draft), w1, fit, cfg))
    if held.n and fit.n:
        report["offline_after"] = offline_metrics(draft, fit, held)
    after = draft.state_dict()
    changed = [k for k in before if not torch.equal(before[k].cpu(), after[k].cpu())]
    if any(k not in CONF_TENSORS for k in changed):
        raise RuntimeError(f"tensors other than the confidence head changed: {changed}")
    write_draft_with_head(draft_dir, out_dir, {k: after[k] for k in CONF_TENSORS})
    validate_draft(out_dir, target_dir)
    report["history"] = hist[:: max(1, len(hist) // 50)] + hist[-1:]
    report["wall_s"] = round(time.time() - t0, 1)
    (out_dir / "conf_finetune.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def stdlib_draft_corpus(tokenizer, seq_len: int = 512) -> tuple[list[Sequence], str]:
    """The tiny pair's drafter corpus (``tiny_pair``: every other *training* stdlib file;
    the held-out files of ``split_stdlib`` are never used)."""
    from .data import split_stdlib, text_sequences

    train, held = split_stdlib()
    files = train[::2]
    assert not set(files) & set(held)
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    return (text_sequences(tokenizer, texts, seq_len),
            f"stdlib drafter corpus: {len(files)} training files (split_stdlib()[0][::2])")
