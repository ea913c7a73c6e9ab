"""PPO for the Shopping LM agent, token-level GAE with a critic (docs/algorithms/ppo.md).

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347, eq. 7 (clipped surrogate) and eq. 9
(combined loss); GAE: Schulman et al., arXiv 1506.02438, eq. 16. Multi-turn token GAE as in verl: every generated
token is an action, r_k sits on the last generated token of turn k, and env tokens are skipped (next value and
running advantage carry over them), the shared ``"token_gae"`` estimator of `baselines.core.advantages`.
Advantages are whitened over the batch's generated tokens.

    actor:  L_π = −token-mean min(ρ·A, clip(ρ, 1−ε, 1+ε)·A)      (optional dual clip c = 3)
    critic: L_V = ½·token-mean max((V − R)², (clip(V, V_old ± ε_v) − R)²)
    total:  L = L_π + c_v·L_V − c_ent·H (+ β·k3)

The critic is a separate copy of the policy backbone with a fresh scalar head (`critic_shared=True`: a head on the
policy backbone). The numeric (Replenishment) flavour lives in `baselines.hybrid_ppo`.
"""

from __future__ import annotations

from dataclasses import dataclass

from baselines.core.config import AggMode, Truncation
from baselines.core.trainer import LMAlgorithm, LMConfig
from shopsim.configs import bounded


@dataclass
class PPOConfig(LMConfig):
    """PPO's options with token-level GAE and a critic; the defaults are verl's PPO recipe."""

    gamma: float = bounded(1.0, min=0, max=1)
    """Discount γ of the token-level GAE."""
    gae_lambda: float = bounded(1.0, min=0, max=1)
    """λ of the token-level GAE."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    value_clip: float | None = 0.5
    vf_coef: float = 0.5
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_in_reward: float = bounded(0.0, min=0)
    """β of the in-reward KL penalty r_t −= β·k1_t on generated tokens (verl); needs no reference copy if 0."""
    lr: float = 1e-6
    critic_lr: float = 1e-5
    update_epochs: int = 1
    minibatches: int = 4
    normalize_advantage: bool = True
    loss_agg: AggMode = "token-mean"
    group_size: int = 1
    truncation: Truncation = "terminal"
    """'terminal' or 'last_value' (proxy bootstrap, see baselines.core.advantages)."""


class PPO(LMAlgorithm):
    """Token-level PPO with a learned critic (verl's multi-turn GAE that skips env tokens)."""

    name = "ppo"
    Config = PPOConfig
    uses_critic = True
    advantage_estimator = "token_gae"
