"""VAPO for the Shopping LM agent (docs/algorithms/vapo.md).

"VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks", arXiv 2504.05118 (ByteDance
Seed; no code). PPO with a critic plus:

* value pre-training: roll out the frozen initial policy, train only the critic on Monte-Carlo returns (λ = 1)
  for ~50 steps before RL;
* decoupled GAE: critic targets with λ_critic = 1.0, policy advantages with λ_policy;
* length-adaptive GAE: λ_policy = 1 − 1/(α·l), α = 0.05, clamped to [0, 1] ([derived] clamp); l = generated
  tokens of the trajectory (``length_basis="trajectory"``, [derived]) or of the turn (``"turn"``);
* clip-higher (ε_low = 0.2, ε_high = 0.28), token-mean loss;
* positive-example LM loss: μ·(−token-mean log π over successful trajectories), μ = 0.1;
* group sampling: several samples per task (G = 16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from baselines.core.advantages import token_gae_for_batch
from baselines.core.batch import Batch
from baselines.core.config import AggMode, Truncation
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded


@dataclass
class VAPOConfig(LMConfig):
    """VAPO's options; the defaults are the paper's (arXiv 2504.05118, §3-§4)."""

    alpha: float = bounded(0.05, gt=0)
    """α of the length-adaptive GAE: λ_policy = 1 − 1/(α·l)."""
    lam_critic: float = bounded(1.0, min=0, max=1)
    """λ of the critic's GAE targets (decoupled GAE; 1.0 = Monte-Carlo returns)."""
    gamma: float = bounded(1.0, min=0, max=1)
    """Discount γ of both GAEs."""
    clip_low: float = 0.2
    clip_high: float = 0.28
    nll_coef: float = bounded(0.1, min=0)
    """μ of the positive-example LM loss (token-mean −log π over successful trajectories; 0: off)."""
    lr: float = 1e-6
    critic_lr: float = 2e-6
    vf_coef: float = 0.5
    value_clip: float | None = None
    value_pretrain_steps: int = bounded(50, min=0)
    """Critic-only steps on Monte-Carlo returns of the frozen initial policy before RL (0: off)."""
    value_pretrain_batches: int = bounded(2, min=1)
    """Rollout batches collected once for value pre-training (each `tasks_per_iter` × `group_size` episodes)."""
    group_size: int = 16
    length_basis: Literal["trajectory", "turn"] = "trajectory"
    """l of the length-adaptive λ: generated tokens of the whole trajectory ([derived]) or of the turn."""
    loss_agg: AggMode = "token-mean"
    normalize_advantage: bool = True
    truncation: Truncation = "terminal"
    """'terminal' or 'last_value' (proxy bootstrap, see baselines.core.advantages)."""


def length_adaptive_lambda(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """λ_policy = clamp(1 − 1/(α·l), 0, 1)."""
    return (1.0 - 1.0 / (alpha * lengths.float().clamp_min(1e-6))).clamp(0.0, 1.0)


class VAPO(LMAlgorithm):
    """Value-augmented PPO: value pre-training, decoupled and length-adaptive GAE, clip-higher, positive NLL."""

    name = "vapo"
    Config = VAPOConfig
    uses_critic = True

    def before_training(self, env_id, agent, rng, out_dir):
        c = self.config
        if c.value_pretrain_steps == 0:
            return {}
        return self.pretrain_critic(env_id, agent, rng, c.value_pretrain_steps, c.value_pretrain_batches)

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        values = ctx.values
        assert values is not None  # uses_critic: prepare() computed them
        _, ret = token_gae_for_batch(batch, values, gamma=c.gamma, lam=c.lam_critic, truncation=c.truncation)
        if c.length_basis == "trajectory":
            lam = length_adaptive_lambda(batch.traj_gen_len, c.alpha)  # [N]
            lam_mean = float(lam.mean())
        else:
            lam_turn = length_adaptive_lambda(batch.turn_len, c.alpha)  # [N, K]
            lam_rs = batch.turn_to_tokens(lam_turn)  # [R, S] per generated token
            lam = batch.to_traj_tokens(lam_rs)  # [N, L] per-step λ
            lam_mean = float((lam_turn * batch.turn_mask).sum() / batch.turn_mask.sum().clamp_min(1))
        adv, _ = token_gae_for_batch(batch, values, gamma=c.gamma, lam=lam, truncation=c.truncation)
        return Advantages(adv=adv, returns=ret, metrics={"lambda_policy": lam_mean})

    def extra_loss(self, mb, logp, mask):
        """μ · token-mean NLL over the generated tokens of successful trajectories (normalised over the step)."""
        c = self.config
        if c.nll_coef == 0:
            return None, {}
        batch: Batch = mb.batch
        pos_step = (batch.success[batch.row_traj[mb.step_rows]] > 0).float()
        denom = (mb.step_mask.float() * pos_step[:, None]).sum()
        if denom == 0:
            return None, {"nll_pos": 0.0}
        pmask = mask.float() * (batch.success[mb.row_traj] > 0).float()[:, None]
        nll = (-logp * pmask).sum() / denom
        return c.nll_coef * nll, {"nll_pos": float(nll.detach())}
