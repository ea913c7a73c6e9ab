"""Generalised advantage estimation, vectorised over batch AND time (docs/algorithms/core.md).

GAE (Schulman et al., arXiv 1506.02438, eq. 16): A_t = Σ_{l≥0} (γλ)^l δ_{t+l},  δ_t = r_t + γ V_{t+1} − V_t.

The usual implementation (verl's ``compute_gae_advantage_return``, CleanRL) loops over time steps in Python and is
vectorised over the batch only. Here the discounted reverse sum is a **blocked scan**: time is cut into blocks of
`block` steps; inside a block the sum is one matmul with the upper-triangular decay matrix D[j,u] = c^(u−j); the
carries between blocks are a second (much smaller) scan with decay c^block, done the same way. Every entry of both
matrices is a power c^k with k ≥ 0, so nothing overflows (unlike the c^(−t) cumsum trick).

Masked positions (env/user/tool tokens in concat mode, padding) are *skipped*: the next value and the running
advantage carry over them unchanged, exactly like verl's masked loop. We get that by compacting each row's valid
positions to the front (O(B·T) scatter), scanning with a constant decay and scattering back.

Turn-level GAE (MPO) is the same function applied to [B, K] turn tensors; `turn_gae` names it.
"""

from __future__ import annotations

import torch

__all__ = ["discounted_reverse_cumsum", "gae", "token_gae", "turn_gae", "gae_reference_loop", "place_at_turn_ends"]


def _decay_matrix(c: torch.Tensor, n: int) -> torch.Tensor:
    """D[..., j, u] = c^(u−j) for u ≥ j else 0; c is a scalar tensor or [B] (then D is [B, n, n])."""
    k = torch.arange(n, device=c.device, dtype=c.dtype)
    expo = k[None, :] - k[:, None]  # u - j
    tri = expo >= 0
    if c.dim() == 0:
        return torch.where(tri, torch.pow(c, expo.clamp_min(0)), torch.zeros((), dtype=c.dtype, device=c.device))
    pw = torch.pow(c[:, None, None], expo.clamp_min(0)[None])
    return pw * tri[None]


def discounted_reverse_cumsum(x: torch.Tensor, c, block: int = 64) -> torch.Tensor:
    """y[b, t] = Σ_{u ≥ t} c^(u−t) · x[b, u] for x of shape [B, T]  (i.e. y_t = x_t + c·y_{t+1}).

    `c` is a float (shared decay), a tensor [B] (per-row decay, e.g. VAPO's length-adaptive λ) or a tensor [B, T]
    (per-step decay: y_t = x_t + c_t·y_{t+1}). No Python loop over time: blocked matmuls (module docstring).
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [B, T], got shape {tuple(x.shape)}")
    B, T = x.shape
    if T == 0:
        return x.clone()
    c_t = torch.as_tensor(c, dtype=x.dtype, device=x.device)
    if c_t.dim() == 2:
        if c_t.shape != x.shape:
            raise ValueError(f"per-step decay must have shape {tuple(x.shape)}, got {tuple(c_t.shape)}")
        return _per_step_scan(x, c_t, min(block, 16))
    per_row = c_t.dim() == 1
    if per_row and c_t.shape[0] != B:
        raise ValueError(f"per-row decay must have shape [{B}], got {tuple(c_t.shape)}")
    block = max(1, min(block, T))
    nb = -(-T // block)
    pad = nb * block - T
    xb = torch.nn.functional.pad(x, (0, pad)).view(B, nb, block)
    D = _decay_matrix(c_t, block)  # [L, L] or [B, L, L]
    # local (within-block) reverse discounted sums: L[b,n,j] = Σ_{u≥j} D[j,u] x[b,n,u]
    if per_row:
        local = torch.einsum("bnu,bju->bnj", xb, D)
    else:
        local = xb @ D.T
    if nb == 1:
        return local.reshape(B, -1)[:, :T]
    # value at each block start, then the scan across blocks with decay c^block
    starts = local[:, :, 0]  # [B, nb]
    cb = torch.pow(c_t, block)
    Db = _decay_matrix(cb, nb)
    full_starts = torch.einsum("bm,bnm->bn", starts, Db) if per_row else starts @ Db.T
    # carry into block n from block n+1: c^(block−j) · full_starts[n+1]
    nxt = torch.nn.functional.pad(full_starts[:, 1:], (0, 1))  # [B, nb]
    j = torch.arange(block, device=x.device, dtype=x.dtype)
    if per_row:
        carry_w = torch.pow(c_t[:, None], block - j[None])  # [B, L]
        out = local + nxt[:, :, None] * carry_w[:, None, :]
    else:
        carry_w = torch.pow(c_t, block - j)  # [L]
        out = local + nxt[:, :, None] * carry_w[None, None, :]
    return out.reshape(B, -1)[:, :T]


def _per_step_scan(x: torch.Tensor, c: torch.Tensor, block: int) -> torch.Tensor:
    """y_t = x_t + c_t·y_{t+1}: within blocks products of decays are exp(differences of log-cumsums); the block
    carries are the same scan one level up (recursion on T/block steps)."""
    B, T = x.shape
    block = max(2, min(block, T))
    nb = -(-T // block)
    pad = nb * block - T
    xb = torch.nn.functional.pad(x, (0, pad)).view(B, nb, block)
    logc = torch.log(c.clamp_min(1e-30))
    lb = torch.nn.functional.pad(logc, (0, pad)).view(B, nb, block)
    P = torch.cumsum(lb, -1) - lb  # exclusive prefix: P[j] = Σ_{w<j} log c_w
    diff = P[..., None, :] - P[..., :, None]  # [B, nb, j, u] = Σ_{w=j}^{u-1} log c_w
    tri = torch.ones(block, block, dtype=torch.bool, device=x.device).triu()
    E = torch.where(tri, torch.exp(diff.clamp_max(0.0) if bool((c <= 1).all()) else diff),
                    torch.zeros((), dtype=x.dtype))
    local = torch.einsum("bnju,bnu->bnj", E, xb)
    if nb == 1:
        return local.reshape(B, -1)[:, :T]
    Ptot = P[..., -1] + lb[..., -1]  # Σ over the block
    full_starts = _per_step_scan(local[:, :, 0], torch.exp(torch.nn.functional.pad(Ptot[:, :-1], (0, 1))) , block)
    # full_starts[n] = local0[n] + Π(block n)·full_starts[n+1]
    nxt = torch.nn.functional.pad(full_starts[:, 1:], (0, 1))
    carry_w = torch.exp(Ptot[..., None] - P)  # Π_{w=j}^{end} c_w
    out = local + nxt[:, :, None] * carry_w
    return out.reshape(B, -1)[:, :T]


def _compact(m: torch.Tensor):
    """Indices that move each row's valid positions to the front, in order (invalid ones go to a dummy column T),
    and the number of valid positions per row."""
    T = m.shape[1]
    pos = torch.cumsum(m, dim=1) - 1
    n = pos[:, -1] + 1
    idx = torch.where(m, pos, T)
    return idx, n


def _scatter_front(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Move valid entries of x [..., B, T] to the front of each row (idx from `_compact`); zeros after them."""
    T = x.shape[-1]
    out = torch.zeros(*x.shape[:-1], T + 1, dtype=x.dtype, device=x.device)
    out.scatter_(-1, idx.expand_as(x), x)
    return out[..., :T]


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam,
    last_value: torch.Tensor | None = None,
    block: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE over the time axis of [B, T] tensors. Returns (advantages, returns), both 0 where mask is 0.

    * Steps with ``mask == 0`` are skipped: the next value and the running advantage carry over them unchanged
      (verl's multi-turn rule for env tokens), so a row may interleave valid and invalid steps.
    * `last_value` [B] bootstraps after each row's last valid step (the value of the state after it: V(s_next)
      for a truncated episode, 0 — or None — for a terminated one).
    * `lam` is a float, a per-row tensor [B] (VAPO's length-adaptive λ) or per-step [B, T] (λ_t scales the
      carry from the next valid step into step t).
    * returns = advantages + values (the critic target; the λ-return).
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape or rewards.dim() != 2:
        raise ValueError(
            f"rewards, values and mask must all be [B, T]; got {tuple(rewards.shape)}, {tuple(values.shape)}, "
            f"{tuple(mask.shape)}"
        )
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    if not dtype.is_floating_point:
        dtype = torch.float32
    r = rewards.to(dtype)
    v = values.to(dtype)
    B, T = r.shape
    m = mask.bool()
    lam_t = torch.as_tensor(lam, dtype=dtype, device=r.device)
    # rows whose valid steps already form a prefix (padding only at the end) need no compaction
    prefix = T < 2 or bool((m[:, 1:] <= m[:, :-1]).all())
    if prefix:
        n = m.sum(1)
        rc, vc = r * m, v * m
        if lam_t.dim() == 2:
            lam_t = lam_t * m
    else:
        idx, n = _compact(m)
        if lam_t.dim() == 2:  # per-step λ: compact it like the rewards
            rc, vc, lam_t = _scatter_front(torch.stack([r, v, lam_t]), idx)
        else:
            rc, vc = _scatter_front(torch.stack([r, v]), idx)
    # next value in compact order: v_c shifted left (zeros after the last valid step); bootstrap there if asked
    next_v = torch.nn.functional.pad(vc[:, 1:], (0, 1))
    if last_value is not None:
        lv = torch.as_tensor(last_value, dtype=dtype, device=r.device).expand(B)
        is_last = torch.arange(T, device=r.device)[None, :] == (n - 1)[:, None]
        next_v = torch.where(is_last, lv[:, None], next_v)
    # after the last valid step rc = vc = next_v = 0, so δ is 0 there without masking
    delta = rc + gamma * next_v - vc
    adv_c = discounted_reverse_cumsum(delta, gamma * lam_t, block=block)
    if prefix:
        adv = adv_c * m
    else:
        adv = torch.gather(torch.nn.functional.pad(adv_c, (0, 1)), 1, idx) * m
    return adv, (adv + v) * m


#: token-level GAE over generated tokens, skipping env tokens (mask = generated-token mask); LM PPO
token_gae = gae


def turn_gae(turn_rewards, turn_values, turn_mask, *, gamma: float, lam: float, last_value=None, block: int = 64):
    """Turn-level GAE (MPO): δ_k = r_k + γ V_{k+1} − V_k over turns k, A_k = Σ_j (γλ)^j δ_{k+j}. [B, K] inputs."""
    return gae(turn_rewards, turn_values, turn_mask, gamma=gamma, lam=lam, last_value=last_value, block=block)


def gae_reference_loop(rewards, values, mask, *, gamma: float, lam: float, last_value=None):
    """The usual loop over time steps, vectorised over the batch (verl ``compute_gae_advantage_return`` rule for
    masked tokens). Kept as the reference for tests and the benchmark; use `gae` in code."""
    B, T = rewards.shape
    m = mask.to(rewards.dtype)
    next_v = (torch.zeros(B, dtype=rewards.dtype) if last_value is None
              else torch.as_tensor(last_value, dtype=rewards.dtype).expand(B).clone())
    last = torch.zeros(B, dtype=rewards.dtype)
    adv = torch.zeros_like(rewards)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        new = delta + gamma * lam * last
        next_v = values[:, t] * m[:, t] + (1 - m[:, t]) * next_v
        last = new * m[:, t] + (1 - m[:, t]) * last
        adv[:, t] = last
    adv = adv * m
    return adv, (adv + values) * m


def place_at_turn_ends(turn_rewards: torch.Tensor, turn_index: torch.Tensor, gen_mask: torch.Tensor) -> torch.Tensor:
    """Token rewards [B, S]: r_k at the last generated token of turn k, 0 elsewhere (verl's placement).

    `turn_rewards` [B, K]; `turn_index` [B, S] turn of each generated token (any value where gen_mask is 0).
    """
    B, S = gen_mask.shape
    g = gen_mask.bool()
    ti = torch.where(g, turn_index.long(), torch.full_like(turn_index.long(), -1))
    # a turn ends where the next generated token (skipping env tokens) belongs to another turn (or none follows)
    pos = torch.arange(S, device=gen_mask.device).expand(B, S)
    gen_pos = torch.where(g, pos, torch.full_like(pos, S))
    # next generated position after t: reverse cummin over positions
    nxt_pos = torch.flip(torch.cummin(torch.flip(gen_pos, [1]), dim=1).values, [1])
    nxt_pos = torch.nn.functional.pad(nxt_pos[:, 1:], (0, 1), value=S)
    ti_pad = torch.nn.functional.pad(ti, (0, 1), value=-2)
    nxt_turn = torch.gather(ti_pad, 1, nxt_pos)
    is_end = g & (nxt_turn != ti)
    r = torch.gather(turn_rewards, 1, ti.clamp_min(0))
    return torch.where(is_end, r, torch.zeros_like(r))
