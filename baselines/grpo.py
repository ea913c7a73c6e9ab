"""GRPO for the Shopping LM agent (docs/algorithms/grpo.md).

Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
arXiv 2402.03300, §4.1 (outcome supervision); Dr.GRPO (no std division): arXiv 2503.20783.

    A_i = (R_i − mean_g R) / (std_g R + ε_std)     broadcast to every generated token of every turn of trajectory i
    L   = −agg min(ρ·A_i, clip(ρ, 1−ε, 1+ε)·A_i) + β·agg k3        agg = seq-mean-token-mean

Statistics are computed once per trajectory (`stats_over="trajectory"`); `"rows"` weighs each trajectory by its
number of turns, as verl-agent's step rows do. The estimator is the shared ``"group_outcome"`` of
`baselines.core.advantages` (with its options, `GroupOutcomeConfig`), which ARC and midtrain use too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from baselines.core.advantages import (
    REWARDS,
    GroupOutcomeConfig,
    Reward,
    trajectory_reward,
    zero_variance_share,
)
from baselines.core.advantages import group_advantages as grpo_advantages
from baselines.core.trainer import LMAlgorithm

__all__ = ["GRPO", "GRPOConfig", "Reward", "REWARDS", "trajectory_reward", "grpo_advantages", "zero_variance_share"]


@dataclass
class GRPOConfig(GroupOutcomeConfig):
    """GRPO's options; the defaults follow DeepSeekMath's outcome supervision (§4.1)."""

    group_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_kind: Literal["k1", "k3"] = "k3"
    lr: float = 1e-6


class GRPO(LMAlgorithm):
    """Group Relative Policy Optimization: outcome advantage normalised within each task's G rollouts."""

    name = "grpo"
    Config = GRPOConfig
    advantage_estimator = "group_outcome"
