"""Masked statistics and group statistics (docs/algorithms/core.md).

All functions are torch, work on any device and never loop in Python over elements. Group keys may be anything
hashable (task ids, ``(task, strategy)`` tuples, anchor-state hashes); `group_index` turns them into dense ints.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

__all__ = [
    "masked_sum", "masked_mean", "masked_var", "masked_whiten", "group_index", "group_stats", "group_normalize",
    "leave_one_out_mean", "explained_variance",
]


def _as_mask(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(x)
    return mask.to(x.dtype)


def masked_sum(x: torch.Tensor, mask: torch.Tensor | None, dim=None) -> torch.Tensor:
    m = _as_mask(x, mask)
    return (x * m).sum() if dim is None else (x * m).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None, dim=None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is true (over all positions, or along `dim`). Empty -> 0."""
    m = _as_mask(x, mask)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor | None, dim=None, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked positions; `unbiased` applies Bessel's correction (as torch.var and verl do)."""
    m = _as_mask(x, mask)
    mean = masked_mean(x, m, dim)
    if dim is not None:
        mean = mean.unsqueeze(dim)
    sq = ((x - mean) ** 2) * m
    n = m.sum() if dim is None else m.sum(dim)
    s = sq.sum() if dim is None else sq.sum(dim)
    denom = (n - 1.0).clamp_min(1.0) if unbiased else n.clamp_min(1.0)
    return s / denom


def masked_whiten(x: torch.Tensor, mask: torch.Tensor | None, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked positions (global); masked-out positions are returned as 0.

    With ``shift_mean=False`` only the scale changes (the mean is added back), as in TRL/verl's option.
    """
    m = _as_mask(x, mask)
    mean = masked_mean(x, m)
    var = masked_var(x, m)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


def group_index(keys: Sequence[Hashable] | torch.Tensor) -> tuple[torch.Tensor, list]:
    """Dense integer ids for arbitrary hashable keys, in order of first appearance. Returns (ids[N], unique_keys)."""
    if isinstance(keys, torch.Tensor):
        uniq, inv = torch.unique(keys, return_inverse=True)
        return inv.long(), uniq.tolist()
    table: dict = {}
    ids = [table.setdefault(k, len(table)) for k in keys]
    return torch.tensor(ids, dtype=torch.long), list(table)


def _ids(group_ids) -> torch.Tensor:
    if isinstance(group_ids, torch.Tensor) and group_ids.dtype in (torch.int64, torch.int32, torch.int16):
        ids = group_ids.long()
        if ids.numel() and ids.min() < 0:
            raise ValueError("group ids must be non-negative integers (use group_index for arbitrary keys)")
        return ids
    return group_index(group_ids)[0]


def group_stats(values: torch.Tensor, group_ids, weights: torch.Tensor | None = None, unbiased: bool = True):
    """Per-element (mean, std, count) of the element's group. `values` is 1-D; `weights` (0/1) excludes elements.

    std uses Bessel's correction (torch.std / verl); a group of one has std 0 here (callers decide what a
    singleton means, see `group_normalize`). A group whose (included) values are all equal gets exactly its value
    as mean and std 0: the float sum/count of e.g. six rewards of 0.3 is not exactly 0.3, and dividing that rounding
    error by a tiny std would hand every member the same spurious advantage.
    """
    ids = _ids(group_ids).to(values.device)
    w = torch.ones_like(values) if weights is None else weights.to(values.dtype)
    n_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    cnt = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, w)
    s = torch.zeros_like(cnt).index_add_(0, ids, values * w)
    mean = s / cnt.clamp_min(1.0)
    dev = (values - mean[ids]) ** 2 * w
    ss = torch.zeros_like(cnt).index_add_(0, ids, dev)
    denom = (cnt - 1.0).clamp_min(1.0) if unbiased else cnt.clamp_min(1.0)
    std = torch.sqrt(ss / denom)
    big = torch.finfo(values.dtype).max
    lo = torch.full_like(cnt, big).scatter_reduce(0, ids, torch.where(w > 0, values, big), "amin")
    hi = torch.full_like(cnt, -big).scatter_reduce(0, ids, torch.where(w > 0, values, -big), "amax")
    tied = (lo == hi) & (cnt > 0)
    mean = torch.where(tied, lo, mean)
    std = torch.where(tied, torch.zeros_like(std), std)
    return mean[ids], std[ids], cnt[ids]


def group_normalize(
    values: torch.Tensor,
    group_ids,
    mode: str = "mean_std",
    eps: float = 1e-6,
    singleton: str = "zero",
    unbiased: bool = True,
) -> torch.Tensor:
    """Group-relative advantages (GRPO / GiGPO / ARC).

    ``mean``:     A = R - mean_g R
    ``mean_std``: A = (R - mean_g R) / (std_g R + eps)
    A singleton group gives A = 0 (``singleton="zero"``, [derived]) or A = R (``"raw"``: verl's mean 0 / std 1).
    """
    if mode not in ("mean", "mean_std"):
        raise ValueError(f"mode must be 'mean' or 'mean_std', got {mode!r}")
    if singleton not in ("zero", "raw"):
        raise ValueError(f"singleton must be 'zero' or 'raw', got {singleton!r}")
    values = values.float() if not values.is_floating_point() else values
    mean, std, cnt = group_stats(values, group_ids, unbiased=unbiased)
    adv = values - mean
    if mode == "mean_std":
        adv = adv / (std + eps)
    single = cnt <= 1
    return torch.where(single, values if singleton == "raw" else torch.zeros_like(values), adv)


def leave_one_out_mean(values: torch.Tensor, group_ids) -> torch.Tensor:
    """RLOO baseline b_i = mean of the other members of i's group (0 for a singleton)."""
    mean, _, cnt = group_stats(values, group_ids)
    total = mean * cnt
    return torch.where(cnt > 1, (total - values) / (cnt - 1.0).clamp_min(1.0), torch.zeros_like(values))


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """1 - Var[target - pred] / Var[target] over masked positions (nan when the target is constant)."""
    var_t = masked_var(target, mask)
    if var_t.item() == 0:
        return float("nan")
    return float(1.0 - masked_var(target - pred, mask) / var_t)
