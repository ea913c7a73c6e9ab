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
from typing import Literal, get_args

import torch

from baselines.core.advantages import turn_returns_to_go
from baselines.core.batch import Batch
from baselines.core.config import AggMode
from baselines.core.stats import leave_one_out_mean
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded
from shopsim.errors import ConfigError

Baseline = Literal["none", "batch_mean", "ema", "rloo"]
BASELINES = get_args(Baseline)


@dataclass
class ReinforceConfig(LMConfig):
    """REINFORCE's options (Williams 1992; RLOO: Kool et al. 2019)."""

    baseline: Baseline = "batch_mean"
    """b: none, the batch mean of G at the same turn index, an EMA of that mean, or the leave-one-out mean return
    of the other rollouts of the task ('rloo', needs group_size >= 2)."""
    ema_decay: float = bounded(0.99, gt=0, lt=1)
    """Decay of the 'ema' baseline."""
    gamma: float = bounded(1.0, min=0, max=1)
    """Discount of the returns-to-go G."""
    group_size: int = bounded(0, min=0)
    """Rollouts per task; 0 picks the default (1, or 4 with baseline='rloo')."""
    loss_agg: AggMode = "seq-mean-token-sum"
    lr: float = 1e-6

    def __post_init__(self) -> None:
        if self.group_size == 0:  # before the base check, which needs group_size >= 1
            self.group_size = 4 if self.baseline == "rloo" else 1
        super().__post_init__()
        if self.baseline == "rloo" and self.group_size < 2:
            raise ConfigError("baseline='rloo' needs group_size >= 2 (the other rollouts of a task are the baseline)")


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
        return Advantages(adv=batch.turn_to_tokens(A),
                          metrics={"turn_adv_abs": float(A.abs().sum() / batch.turn_mask.sum().clamp_min(1))})

    def policy_loss_tok(self, mb, logp, adv, mask):
        # score-function estimator, no importance ratio (strictly on-policy)
        return -adv * logp, {}
