"""REINFORCE for the Shopping LM agent (docs/algorithms/reinforce.md).

Williams, "Simple statistical gradient-following algorithms for connectionist reinforcement learning", Machine
Learning 8, 1992; leave-one-out baseline: Kool, van Hoof & Welling, "Buy 4 REINFORCE samples, get a baseline for
free!" (ICLR DeepRLStructPred workshop 2019); whitening option after REINFORCE++ (arXiv 2501.03262).

    G_{i,k} = Σ_{j≥k} γ^{j−k} r_{i,j};   A_{i,k} = G_{i,k} − b_{i,k}
    L = −(1/N_traj) Σ_i Σ_k A_{i,k} · Σ_t log π_θ(y_{k,t} | ·)      (seq-mean-token-sum, no ratio: on-policy)

Baselines: none | batch_mean (mean G over the batch at the same turn index) | ema (EMA of batch_mean) |
rloo (outcome form: mean return of the other group members, every turn, γ = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from baselines.core.advantages import turn_returns_to_go
from baselines.core.batch import Batch
from baselines.core.stats import leave_one_out_mean
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.errors import ConfigError

BASELINES = ("none", "batch_mean", "ema", "rloo")


@dataclass
class ReinforceConfig(LMConfig):
    baseline: str = "batch_mean"
    ema_decay: float = 0.99
    gamma: float = 1.0
    group_size: int = 0
    """Rollouts per task; 0 picks the card's default (1, or 4 with baseline='rloo')."""
    loss_agg: str = "seq-mean-token-sum"
    lr: float = 1e-6

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ConfigError(f"baseline={self.baseline!r}; choose one of {', '.join(BASELINES)}")
        if self.group_size == 0:
            self.group_size = 4 if self.baseline == "rloo" else 1
        if self.baseline == "rloo" and self.group_size < 2:
            raise ConfigError("baseline='rloo' needs group_size >= 2 (the other rollouts of a task are the baseline)")
        if not 0 < self.ema_decay < 1:
            raise ConfigError(f"ema_decay must be in (0, 1), got {self.ema_decay}")
        super().__post_init__()


def reinforce_advantages(batch: Batch, baseline: str, gamma: float, ema: torch.Tensor | None = None,
                         ema_decay: float = 0.99) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-turn advantages [N, K] and the updated EMA state ([K] or None)."""
    tm = batch.turn_mask.float()
    if baseline == "rloo":
        R = batch.returns
        A = (R - leave_one_out_mean(R, batch.group_ids))[:, None] * tm
        return A, ema
    G = turn_returns_to_go(batch, gamma)
    if baseline == "none":
        return G * tm, ema
    bm = (G * tm).sum(0) / tm.sum(0).clamp_min(1.0)  # [K] batch mean per turn index
    if baseline == "batch_mean":
        return (G - bm[None]) * tm, ema
    K = G.shape[1]
    if ema is None:
        ema = bm.clone()
    elif ema.shape[0] < K:
        ema = torch.cat([ema, bm[ema.shape[0]:]])
    b = ema[:K]
    A = (G - b[None]) * tm
    seen = tm.sum(0) > 0
    ema = ema.clone()
    ema[:K] = torch.where(seen, ema_decay * b + (1 - ema_decay) * bm, b)
    return A, ema


class Reinforce(LMAlgorithm):
    """REINFORCE with a baseline (batch mean, EMA or leave-one-out); one on-policy gradient step per batch."""

    name = "reinforce"
    Config = ReinforceConfig

    def __init__(self, **overrides) -> None:
        super().__init__(**overrides)
        self._ema: torch.Tensor | None = None

    def algo_state(self) -> dict:
        return {"ema": self._ema}

    def load_algo_state(self, state: dict) -> None:
        self._ema = state.get("ema")

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        A, self._ema = reinforce_advantages(batch, c.baseline, c.gamma, self._ema, c.ema_decay)
        return Advantages(adv=batch.turn_to_tokens(A), metrics={"turn_adv_abs": float(A.abs().sum() / batch.turn_mask.sum().clamp_min(1))})

    def policy_loss_tok(self, mb, logp, adv, mask):
        # score-function estimator, no importance ratio (strictly on-policy)
        return -adv * logp, {}
