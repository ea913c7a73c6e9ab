"""Loss pieces shared by the clipped policy-gradient family (docs/algorithms/core.md).

Per-token tensors are [B, S] with a mask of policy-generated tokens. Every function returns per-token terms; the
caller reduces them with `aggregate` in the mode its paper uses, so that algorithms differ only where papers do.

Normalisers: the whole optimizer step must share one normaliser (verl-project/verl#5625) — pass `num_tokens` /
`num_seqs` computed over the full step when a step is split into micro-batches.
"""

from __future__ import annotations

import torch

__all__ = [
    "AGG_MODES", "aggregate", "aggregation_weights", "clipped_surrogate", "kl_term", "entropy_from_logits",
    "collision_from_logits", "token_logprobs", "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _seq_reduce(x: torch.Tensor, seq_index: torch.Tensor | None) -> torch.Tensor:
    """Per-row sums [B] -> per-sequence sums [N] (rows of one trajectory share a seq id in window mode)."""
    if seq_index is None:
        return x
    n = int(seq_index.max().item()) + 1 if seq_index.numel() else 0
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, seq_index.long(), x)


def aggregate(
    loss_tok: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    seq_index: torch.Tensor | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | None = None,
    const_len: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [B, S] to a scalar.

    token-mean:              Σ m·ℓ / Σ m
    seq-mean-token-mean:     mean_i [Σ_t m·ℓ / Σ_t m]      (original GRPO; length bias)
    seq-mean-token-sum:      mean_i Σ_t m·ℓ                 (textbook REINFORCE)
    seq-mean-token-sum-norm: Σ m·ℓ / (N_seq · const_len)    (Dr.GRPO; const_len defaults to S)

    A "sequence" is a row, or the rows that share `seq_index` (window mode: the turns of one trajectory).
    `num_tokens` / `num_seqs` override the normalisers (use the optimizer step's totals with micro-batching).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGG_MODES)}")
    m = mask.to(loss_tok.dtype)
    ml = loss_tok * m
    if mode == "token-mean":
        denom = m.sum().clamp_min(1.0) if num_tokens is None else num_tokens
        return ml.sum() / denom
    row_sum = _seq_reduce(ml.sum(-1), seq_index)
    n_seq = row_sum.shape[0] if num_seqs is None else num_seqs
    n_seq = max(float(n_seq), 1.0)
    if mode == "seq-mean-token-mean":
        row_len = _seq_reduce(m.sum(-1), seq_index)
        per_seq = row_sum / row_len.clamp_min(1.0)
        # sequences with no generated token contribute 0 but still count (a fixed normaliser)
        return per_seq.sum() / n_seq
    if mode == "seq-mean-token-sum":
        return row_sum.sum() / n_seq
    L = float(loss_tok.shape[-1] if const_len is None else const_len)
    return row_sum.sum() / (n_seq * L)


def aggregation_weights(mask: torch.Tensor, mode: str = "token-mean", *, seq_index: torch.Tensor | None = None,
                        const_len: float | None = None) -> torch.Tensor:
    """Per-token weights w with ``aggregate(ℓ, mask, mode) == Σ w·ℓ`` for any ℓ.

    Computing w once over the whole optimizer step and summing ``w·ℓ`` over micro-batches keeps the step's
    normalisers exact whatever the micro-batch split (verl-project/verl#5625).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGG_MODES)}")
    m = mask.float()
    if mode == "token-mean":
        return m / m.sum().clamp_min(1.0)
    idx = torch.arange(m.shape[0], device=m.device) if seq_index is None else seq_index.long()
    n_seq = max(int(idx.max().item()) + 1 if idx.numel() else 0, 1)
    if mode == "seq-mean-token-mean":
        seq_len = torch.zeros(n_seq, device=m.device).index_add_(0, idx, m.sum(-1))
        return m / (seq_len[idx].clamp_min(1.0)[:, None] * n_seq)
    if mode == "seq-mean-token-sum":
        return m / n_seq
    L = float(m.shape[-1] if const_len is None else const_len)
    return m / (n_seq * L)


def group_mean_weights(mask: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per-token weights w with ``Σ w·ℓ`` = the mean over the non-empty groups of each group's token-mean of ℓ.

    `groups` holds a group id ≥ 0 for every token (ignored where `mask` is 0). MPO's critic loss is this with two
    groups, turn-start tokens and the other generated tokens: ½·[mean over turn starts + mean over the rest].
    """
    m = mask.float() * (groups >= 0).float()
    g = groups.clamp_min(0).long()
    n = int(g.max().item()) + 1 if g.numel() else 1
    counts = torch.zeros(n, device=m.device).index_add_(0, g.reshape(-1), m.reshape(-1))
    present = float((counts > 0).sum().clamp_min(1))
    return m / (counts[g].clamp_min(1.0) * present)


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    *,
    ratio: torch.Tensor | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate per token (Schulman et al. 2017, eq. 7) with clip-higher and the dual clip.

    s = min(ρ·A, clip(ρ, 1−eps_low, 1+eps_high)·A);  dual clip (A < 0): s = max(s, c·A)   [code: verl].
    Returns (loss_tok = −s, stats) where stats holds masked means: clipfrac, clipfrac_dual, approx_kl (k3 of
    old vs new), ratio. `ratio` may be given pre-built (MPO's turn ratio with per-token gradient routing); else
    ρ = exp(clamp(logp − old_logp, ±log_ratio_clamp)).
    """
    if ratio is None:
        log_ratio = (logp - old_logp).clamp(-log_ratio_clamp, log_ratio_clamp)
        ratio = torch.exp(log_ratio)
    else:
        log_ratio = torch.log(ratio.detach().clamp_min(1e-30))
    s1 = ratio * adv
    s2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    s = torch.minimum(s1, s2)
    dual_hit = torch.zeros_like(s, dtype=torch.bool)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (verl uses 3.0), got {dual_clip}")
        s3 = dual_clip * adv
        dual_hit = (adv < 0) & (s3 > s)
        s = torch.where(adv < 0, torch.maximum(s, s3), s)
    with torch.no_grad():
        m = mask.to(s.dtype)
        n = m.sum().clamp_min(1.0)
        clipped = (s2 < s1).to(s.dtype)
        stats = {
            "clipfrac": (clipped * m).sum() / n,
            "clipfrac_dual": (dual_hit.to(s.dtype) * m).sum() / n,
            "approx_kl": ((torch.exp(-log_ratio) - 1 + log_ratio) * m).sum() / n,
            "ratio": (ratio.detach() * m).sum() / n,
        }
    return -s, stats


def kl_term(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate on sampled tokens (Schulman's k1/k3 estimators).

    k1 = log π_θ − log π_ref;  k3 = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1  (≥ 0, low variance).
    """
    if kind == "k1":
        return logp - ref_logp
    if kind == "k3":
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        return torch.exp(d) - d - 1.0
    raise ValueError(f"kl kind must be 'k1' or 'k3', got {kind!r}")


def entropy_from_logits(logits: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Entropy of the full next-token distribution at each position: logsumexp(z) − Σ softmax(z)·z.

    Computed in chunks over positions to bound the memory of the [.., V] softmax.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out = []
    for i in range(0, flat.shape[0], chunk):
        z = flat[i : i + chunk].to(torch.promote_types(flat.dtype, torch.float32))
        lse = torch.logsumexp(z, dim=-1)
        out.append(lse - (torch.softmax(z, dim=-1) * z).sum(-1))
    if not out:
        return logits.new_zeros(logits.shape[:-1])
    return torch.cat(out).reshape(logits.shape[:-1])


def collision_from_logits(logits: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Collision probability Σ_v p_v² of the full next-token distribution at each position (WAPO's peak/valley
    threshold: a sampled token is a peak when its probability is at least this).

    Computed in chunks over positions, like `entropy_from_logits`, so no full [.., V] probability tensor is kept.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out = []
    for i in range(0, flat.shape[0], chunk):
        z = flat[i : i + chunk].to(torch.promote_types(flat.dtype, torch.float32))
        out.append(torch.softmax(z, dim=-1).square().sum(-1))
    if not out:
        return logits.new_zeros(logits.shape[:-1])
    return torch.cat(out).reshape(logits.shape[:-1])


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log π(label_t) at each position from logits [.., V] (no full log-softmax tensor kept)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    picked = torch.gather(z, -1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def nucleus_token_logprobs(logits: torch.Tensor, labels: torch.Tensor, top_p: float) -> torch.Tensor:
    """log π_p(label_t): the label's log-prob under softmax(logits) restricted to its top-p nucleus and renormalised
    (the nucleus as `agents.lm.generation` samples from it: a token is dropped when the mass of the tokens before it
    already reaches top_p). The label is always counted in (float differences at the nucleus edge between decoding
    and this recomputation must not give −∞). The nucleus is piecewise constant in the logits, so the gradient is
    that of a log-softmax over the kept tokens; a label that is its whole nucleus gets 0 and no gradient."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if top_p >= 1.0:
        return token_logprobs(z, labels)
    with torch.no_grad():
        probs, order = torch.sort(z.softmax(-1), descending=True, dim=-1)
        keep_sorted = probs.cumsum(-1) - probs < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        keep.scatter_(-1, labels.long().unsqueeze(-1), True)
    picked = torch.gather(z, -1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z.masked_fill(~keep, float("-inf")), dim=-1)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor | None, returns: torch.Tensor, clip: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token critic loss ½·max((V − R)², (clip(V, V_old ± clip) − R)²) (verl/CleanRL). Returns (loss, clipped?)."""
    l1 = (values - returns) ** 2
    if clip is None or old_values is None:
        return 0.5 * l1, torch.zeros_like(l1, dtype=torch.bool)
    vc = old_values + (values - old_values).clamp(-clip, clip)
    l2 = (vc - returns) ** 2
    return 0.5 * torch.maximum(l1, l2), l2 > l1
