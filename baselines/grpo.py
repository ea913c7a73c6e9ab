"""GRPO for the Shopping LM agent (docs/algorithms/grpo.md).

Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
arXiv 2402.03300, §4.1 (outcome supervision); Dr.GRPO (no std division): arXiv 2503.20783.

    A_i = (R_i − mean_g R) / (std_g R + ε_std)     broadcast to every generated token of every turn of trajectory i
    L   = −agg min(ρ·A_i, clip(ρ, 1−ε, 1+ε)·A_i) + β·agg k3        agg = seq-mean-token-mean

Statistics are computed once per trajectory (`stats_over="trajectory"`); `"rows"` weighs each trajectory by its
number of turns, as verl-agent's step rows do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from baselines.core.batch import Batch
from baselines.core.config import AggMode
from baselines.core.stats import group_normalize, group_stats
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded

Reward = Literal["return", "score", "success"]
REWARDS = get_args(Reward)


@dataclass
class GRPOConfig(LMConfig):
    """GRPO's options; the defaults follow DeepSeekMath's outcome supervision (§4.1)."""

    group_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_kind: Literal["k1", "k3"] = "k3"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide the group-centred rewards by the group's std ('group', GRPO), the batch's std ('batch') or by
    nothing ('none', Dr.GRPO)."""
    eps_std: float = bounded(1e-6, min=0)
    """ε added to the std before dividing (ε_std)."""
    loss_agg: AggMode = "seq-mean-token-mean"
    lr: float = 1e-6
    stats_over: Literal["trajectory", "rows"] = "trajectory"
    """Group statistics once per trajectory ('trajectory') or once per turn row, so that longer trajectories
    weigh more ('rows', verl-agent's step rows)."""
    singleton: Literal["zero", "raw"] = "zero"
    """Advantage of a group with a single rollout: 0 ('zero') or its raw reward ('raw', verl's mean 0 / std 1)."""
    reward: Reward = "return"
    """Trajectory reward R_i: the sum of env rewards ('return'), the final score, or the success flag."""


def trajectory_reward(batch: Batch, kind: str = "return") -> torch.Tensor:
    return {"return": batch.returns, "score": batch.score, "success": batch.success}[kind].float()


def grpo_advantages(R: torch.Tensor, group_ids, *, scale: str = "group", eps: float = 1e-6,
                    singleton: str = "zero", weights: torch.Tensor | None = None) -> torch.Tensor:
    """Group-relative outcome advantages [N]. `weights` (turn counts) reproduce verl-agent's row statistics."""
    if weights is None:
        if scale == "group":
            return group_normalize(R, group_ids, "mean_std", eps=eps, singleton=singleton)
        A = group_normalize(R, group_ids, "mean", singleton=singleton)
        if scale == "batch":
            A = A / (R.std() + eps) if R.numel() > 1 else A
        return A
    # rows: each trajectory repeated once per turn
    reps = weights.long().clamp_min(1)
    Rr = R.repeat_interleave(reps)
    gr = torch.as_tensor(group_ids).repeat_interleave(reps)
    mean, std, cnt = group_stats(Rr, gr)
    first = torch.cumsum(reps, 0) - reps
    mean, std, cnt = mean[first], std[first], cnt[first]
    A = R - mean
    if scale == "group":
        A = A / (std + eps)
    elif scale == "batch":
        A = A / (Rr.std() + eps)
    single = cnt <= reps.float()  # one trajectory in the group
    return torch.where(single, R if singleton == "raw" else torch.zeros_like(R), A)


def zero_variance_share(R: torch.Tensor, group_ids) -> float:
    """Share of groups whose rewards are all equal (singletons included): they give no learning signal."""
    if R.numel() == 0:
        return 0.0
    ids = torch.as_tensor(group_ids).long()
    _, std, _ = group_stats(R, ids)
    n = int(ids.max()) + 1
    flat = torch.zeros(n).scatter_(0, ids, (std == 0).float())  # every member carries its group's std
    present = torch.zeros(n).index_add_(0, ids, torch.ones_like(R)) > 0
    return float(flat[present].mean())


class GRPO(LMAlgorithm):
    """Group Relative Policy Optimization: outcome advantage normalised within each task's G rollouts."""

    name = "grpo"
    Config = GRPOConfig

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        R = trajectory_reward(batch, c.reward)
        w = batch.turn_mask.sum(1) if c.stats_over == "rows" else None
        A = grpo_advantages(R, batch.group_ids, scale=c.scale_rewards, eps=c.eps_std, singleton=c.singleton, weights=w)
        return Advantages(adv=batch.traj_to_tokens(A),
                          metrics={"zero_variance_groups": zero_variance_share(R, batch.group_ids)})
