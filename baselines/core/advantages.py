"""Batch-aware advantage helpers shared by several algorithms (docs/algorithms/core.md).

They work in the batch's trajectory-token layout (each trajectory's generated tokens in order, see
`baselines.core.batch`), so the same code serves the concat and window context modes.

Truncated episodes: GAE should bootstrap from V(s_next), the value of the observation after the last action. The
rollout does not record that final observation, so ``truncation="last_value"`` uses the value at the start of the
last turn as a proxy ([derived]) and ``"terminal"`` (default) treats the cut as terminal (CleanRL's choice).
"""

from __future__ import annotations

import torch

from .batch import Batch
from .gae import discounted_reverse_cumsum, gae

__all__ = ["turn_returns_to_go", "token_rewards_tt", "token_gae_for_batch", "bootstrap_values", "turn_end_mask_tt"]


def turn_returns_to_go(batch: Batch, gamma: float) -> torch.Tensor:
    """G_{i,k} = Σ_{j≥k} γ^{j−k} r_{i,j}  [N, K] (0 on padded turns)."""
    return discounted_reverse_cumsum(batch.turn_rewards * batch.turn_mask, gamma) * batch.turn_mask


def turn_end_mask_tt(batch: Batch) -> torch.Tensor:
    """[N, L] True at the last generated token of each turn (trajectory-token layout)."""
    tt = batch.traj_tok_turn
    nxt = torch.nn.functional.pad(tt[:, 1:], (0, 1), value=-1)
    return batch.traj_tok_mask & (nxt != tt)


def token_rewards_tt(batch: Batch) -> torch.Tensor:
    """[N, L] r_k at the last generated token of turn k, 0 elsewhere (verl's placement)."""
    k = batch.traj_tok_turn.clamp_min(0)
    r = torch.gather(batch.turn_rewards, 1, k)
    return torch.where(turn_end_mask_tt(batch), r, torch.zeros_like(r))


def bootstrap_values(batch: Batch, values_tt: torch.Tensor, truncation: str) -> torch.Tensor | None:
    """[N] value after each trajectory's last action: 0 when terminated; on truncation see module docstring."""
    if truncation == "terminal":
        return None
    if truncation != "last_value":
        raise ValueError(f"truncation must be 'terminal' or 'last_value', got {truncation!r}")
    starts = batch.turn_starts()  # [N, K] flat index into R*S
    n_turns = batch.turn_mask.sum(1).clamp_min(1) - 1
    idx = torch.gather(starts, 1, n_turns[:, None]).squeeze(1)
    # position of that flat index inside the trajectory-token layout
    hit = batch.traj_tok_index == idx[:, None]
    v = (values_tt * hit).sum(1)
    return torch.where(batch.truncated & ~batch.terminated, v, torch.zeros_like(v))


def token_gae_for_batch(batch: Batch, values: torch.Tensor, *, gamma: float, lam, truncation: str = "terminal",
                        extra_rewards: torch.Tensor | None = None):
    """Token-level GAE over generated tokens, skipping env tokens (LM PPO). values [R, S] -> (adv [R,S], ret [R,S]).

    `extra_rewards` [R, S] are added to the per-token rewards (e.g. verl's in-reward KL penalty −β·k1_t).
    `lam` may be a float or a per-trajectory tensor [N] (VAPO's length-adaptive λ).
    """
    v_tt = batch.to_traj_tokens(values)
    r_tt = token_rewards_tt(batch)
    if extra_rewards is not None:
        r_tt = r_tt + batch.to_traj_tokens(extra_rewards)
    last = bootstrap_values(batch, v_tt, truncation)
    adv_tt, ret_tt = gae(r_tt, v_tt, batch.traj_tok_mask, gamma=gamma, lam=lam, last_value=last)
    return batch.from_traj_tokens(adv_tt), batch.from_traj_tokens(ret_tt)
