"""Torch networks for the hybrid inventory policies (docs/algorithms/hybrid_ppo.md, docs/algorithms/hpo.md).

The policy is applied per SKU with shared weights: every SKU's features (its stock and pipeline normalised by
its mean demand, its cost parameters, recent demand, the period) go through the same MLP. That makes one set of
parameters serve any N (5, 12, 50, 1,000 SKUs) and every warehouse of the multi-warehouse env (parameter sharing).
The HPO paper feeds the same inputs ("inventories, underage and holding costs, mean demand, normalised by mean
demand") to one MLP over all SKUs; per-SKU sharing is our [derived] reading that scales with N.

Heads: a Bernoulli logit (order or not; last layer zero-initialised, so the discrete head starts uniform) and a
continuous pre-activation x; the quantity is q = mean·softplus(x + shift), which maps into the "order > 0" regime.
HPO uses x deterministically; Gaussian PPO samples u ~ N(x, σ²) with a fixed σ and uses q = mean·softplus(u + shift).
The value net is separate and sums per-SKU values into V(s).
"""

from __future__ import annotations

import torch
from torch import nn

FEATURE_KEYS = ("on_hand", "pipeline", "demand_mean", "holding", "backlog", "fixed", "past_demand", "period")


def n_features(lead_time: int, past: int) -> int:
    return 7 + lead_time + past


def sku_features(on_hand, pipeline, mean, holding, backlog, fixed, past_demand, period) -> torch.Tensor:
    """Per-SKU feature tensor (..., N, F) from state tensors of shape (..., N) [(..., N, L), (..., N, K)];
    `period` is a 0-dim tensor or has the batch shape (...). Differentiable in on_hand and pipeline (HPO's pathwise
    and cross terms)."""
    scale = mean.clamp_min(1e-3)
    ip = on_hand + pipeline.sum(-1)
    per = period.expand_as(on_hand) if period.dim() == 0 else period.unsqueeze(-1).expand_as(on_hand)
    cols = [
        (on_hand / scale).unsqueeze(-1) / 4.0,
        pipeline / scale.unsqueeze(-1) / 4.0,
        (ip / scale).unsqueeze(-1) / 4.0,
        holding.unsqueeze(-1),
        (backlog / 10.0).unsqueeze(-1),
        (fixed / 64.0).unsqueeze(-1),
        (mean / 10.0).unsqueeze(-1),
        past_demand / scale.unsqueeze(-1) / 2.0,
        per.unsqueeze(-1),
    ]
    return torch.cat(cols, dim=-1)


def obs_to_features(obs_list, dtype=torch.float32) -> torch.Tensor:
    """Stack a list of observation dicts (the replenishment / multi-warehouse envs) into features (B, N, F)."""
    import numpy as np

    arr = {k: torch.as_tensor(np.stack([np.asarray(o[k]) for o in obs_list]), dtype=dtype) for k in FEATURE_KEYS}
    return sku_features(arr["on_hand"], arr["pipeline"], arr["demand_mean"], arr["holding"], arr["backlog"],
                        arr["fixed"], arr["past_demand"], arr["period"].reshape(-1))


def mlp(inp: int, hidden: tuple[int, ...], out: int, *, zero_last: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = inp
    for h in hidden:
        lin = nn.Linear(d, h)
        nn.init.orthogonal_(lin.weight, gain=2 ** 0.5)
        nn.init.zeros_(lin.bias)
        layers += [lin, nn.Tanh()]
        d = h
    last = nn.Linear(d, out)
    if zero_last:
        nn.init.zeros_(last.weight)
    else:
        nn.init.orthogonal_(last.weight, gain=0.01)
    nn.init.zeros_(last.bias)
    layers.append(last)
    return nn.Sequential(*layers)


class HybridPolicy(nn.Module):
    """Discrete (Bernoulli per SKU) and continuous (quantity per SKU) heads on separate MLP trunks."""

    def __init__(self, n_feat: int, hidden: tuple[int, ...] = (64, 64), *, shift: float = 1.0,
                 std: float = 0.5, q_max: float = 200.0):
        super().__init__()
        self.n_feat, self.hidden, self.shift, self.std, self.q_max = n_feat, tuple(hidden), shift, std, q_max
        self.disc = mlp(n_feat, self.hidden, 1, zero_last=True)
        self.cont = mlp(n_feat, self.hidden, 1)

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(order logits, continuous pre-activation x), each (..., N)."""
        return self.disc(feats).squeeze(-1), self.cont(feats).squeeze(-1)

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        return self.disc(feats).squeeze(-1)

    def quantity(self, u: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """Map a continuous pre-activation into the 'order > 0' regime: mean·softplus(u + shift), capped at q_max."""
        return (mean * nn.functional.softplus(u + self.shift)).clamp(max=self.q_max)

    def spec(self) -> dict:
        return {"n_feat": self.n_feat, "hidden": list(self.hidden), "shift": self.shift, "std": self.std,
                "q_max": self.q_max}


class SumValue(nn.Module):
    """V(s) = Σ_i v(features_i): a per-SKU MLP summed over SKUs (costs are additive over SKUs)."""

    calibrated: bool  # set by baselines.hybrid_ppo once the output bias starts at the mean return (unset before)

    def __init__(self, n_feat: int, hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        self.net = mlp(n_feat, tuple(hidden), 1)
        last = self.net[-1]
        assert isinstance(last, nn.Linear)  # mlp ends with its output layer
        with torch.no_grad():
            last.weight.mul_(100.0)  # undo the policy-style 0.01 gain: values are O(1) after scaling

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.net(feats).squeeze(-1).sum(-1)
