"""HPO: hybrid policy optimisation with mixed (pathwise + score-function) gradients (docs/algorithms/hpo.md).

Alvo, Russo, Kanoria, "Policy Optimization in Hybrid Discrete-Continuous Action Spaces via Mixed Gradients",
arXiv 2605.14297 (code: MatiasAlvo/hybrid-rl, `HybridAgent`). In a piecewise-smooth MDP the continuous controls get
pathwise gradients through a differentiable simulator (`shopsim.envs.replenishment.step_torch`, with the demand
noise fixed and the discrete choices held fixed), the discrete choices get PPO's clipped score-function gradient.

Per update:
1. roll out `batch_scenarios` scenarios for the horizon through `step_torch`, keeping the graph; r = −cost;
   the continuous head is deterministic, u = μ_θ(s), quantity = mean·softplus(u + shift);
2. GAE(γ, λ) with a separate value net (rewards scaled by their batch std);
3. PPO epoch 0 on the full batch with the observations still attached to the graph:
   L = L_clip(discrete log-probs, A) + c_v·L_V + c_pw·L_pw,  L_pw = −mean_{t∈[buf, T−buf), b} r_{t,b} / std(r);
   the clipped term's gradient through s_t into earlier quantities is the cross term (`disable_cross_term`);
   the value net sees detached features, so the value loss sends no gradient into the continuous head (asserted);
4. detach everything (each pathwise gradient is used once);
5. epochs 1..E−1: standard PPO on `minibatches` minibatches (discrete head and value);
6. early stop on approx-KL > target_kl; gradient norms clipped per component (order head, quantity head, value).

Defaults: the configuration that matches the paper (lr 0.003, clip 0.16, γ 0.93, λ 0.96, 5 epochs, 4 minibatches,
vf 0.13, pathwise_coef 10, buffer 20, max_grad_norm 5, target_kl 0.015, policy [512, 512], value [64, 64]).
The per-SKU shared-weight policy net is our [derived] reading (see `agents.inventory_nets`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from baselines.hybrid_ppo import HybridPPO, HybridPPOConfig, reported_cost
from shopsim.configs import bounded


@dataclass
class HPOConfig(HybridPPOConfig):
    """HPO's options; the defaults are the paper's config (arXiv 2605.14297)."""

    lr: float = 0.003
    weight_decay: float = bounded(0.0, min=0)
    """Adam weight decay."""
    clip: float = 0.16
    gamma: float = 0.93
    gae_lambda: float = 0.96
    update_epochs: int = 5
    minibatches: int = 4
    vf_coef: float = 0.13
    pathwise_coef: float = bounded(10.0, min=0)
    """Weight of the pathwise loss L_pw."""
    buffer_periods: int = bounded(20, min=0)
    """L_pw averages periods [buffer, T − buffer) (all periods if that window is empty)."""
    max_grad_norm: float = 5.0
    target_kl: float | None = 0.015
    disable_cross_term: bool = False
    """Compute the discrete log-probs of epoch 0 on detached observations (no gradient into earlier quantities)."""
    hidden: tuple[int, ...] = (512, 512)


class HPO(HybridPPO):
    """Hybrid PPO with the pathwise gradient through the differentiable simulator (see the module docstring)."""

    name: ClassVar[str] = "hpo"
    Config: ClassVar[type] = HPOConfig
    mode: ClassVar[str] = "pathwise"

    def pathwise_loss(self, cost: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """L_pw = −mean r / std(r) over the buffered window, r = −cost (cost: (T, B, W), attached)."""
        T, buf = cost.shape[0], self.config.buffer_periods
        window = cost[buf:T - buf] if T - 2 * buf > 0 else cost
        return window.mean() / scale

    def update_iteration(self, sim, b, policy, value, opt, gen) -> dict:
        c = self.config
        ro = sim.rollout(policy, b, mode="pathwise", gen=gen, graph=True)
        train_cost = float(reported_cost(ro["cost"].detach(), sim.cfg.warmup).mean())
        adv, ret, scale = self.advantages(ro, value)
        T, B, W, N, F = ro["feats"].shape
        feats = ro["feats"].reshape(-1, N, F)
        disc_feats = feats.detach() if c.disable_cross_term else feats
        value_feats = feats.detach()
        assert not value_feats.requires_grad  # the value loss must not reach the continuous head
        order, u, logp = ro["order"].reshape(-1, N), ro["u"].reshape(-1, N), ro["logp"].reshape(-1)
        pg, vl, ent, kl0 = self.ppo_loss(policy, value, disc_feats, order, u, logp, adv, ret, with_gaussian=False,
                                         value_feats=value_feats)
        l_pw = self.pathwise_loss(ro["cost"], scale)
        self.step_optim(opt, pg + c.vf_coef * vl - c.ent_coef * ent + c.pathwise_coef * l_pw, policy, value)
        stats = {"train_cost": train_cost, "pathwise_loss": float(l_pw.detach()), "pg_loss0": float(pg.detach())}
        del ro["cost"]  # each pathwise gradient is used once
        if c.update_epochs > 1:
            flat = self.flatten(ro, adv, ret)
            stats.update(self.minibatch_epochs(c.update_epochs - 1, policy, value, opt, flat, gen, with_gaussian=False))
        return stats
