"""DAPO for the Shopping LM agent (docs/algorithms/dapo.md).

"DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476 (defaults of the verl DAPO
recipe). Four changes to GRPO:

* clip-higher: ε_low = 0.2, ε_high = 0.28 (and verl's dual clip c = 10 on negative advantages);
* token-level loss: Σ_{i,t} / Σ_i |o_i| (token-mean);
* dynamic sampling: drop groups whose rewards are all equal; keep generating until the batch has `tasks_per_iter`
  groups or `max_gen_batches` tries were made; the last try keeps everything (verl-agent ``filter_group_data``);
* overlong reward shaping (eq. 13): R_len(|y|) = 0 if |y| ≤ L_max − L_cache; ((L_max − L_cache) − |y|)/L_cache
  up to L_max; −1 beyond. Multi-turn [derived]: applied to each turn's length against the per-turn token limit
  (L_cache = L_max/4) and summed into R_i; ``overlong_basis="trajectory"`` uses the trajectory's total instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from baselines.core.batch import Batch
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from baselines.grpo import grpo_advantages, trajectory_reward, zero_variance_share
from shopsim.errors import ConfigError


@dataclass
class DAPOConfig(LMConfig):
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 10.0
    group_size: int = 16
    loss_agg: str = "token-mean"
    dynamic_sampling: bool = True
    max_gen_batches: int = 10
    overlong_penalty: bool = True
    overlong_max_len: int | None = None
    """L_max: per-turn token limit (None: the agent's max_new_tokens)."""
    overlong_buffer_frac: float = 0.25
    overlong_factor: float = 1.0
    overlong_basis: str = "turn"
    weight_decay: float = 0.1
    lr: float = 1e-6
    eps_std: float = 1e-6
    reward: str = "return"

    def __post_init__(self) -> None:
        if self.max_gen_batches < 1:
            raise ConfigError(f"max_gen_batches must be >= 1, got {self.max_gen_batches}")
        if self.overlong_basis not in ("turn", "trajectory"):
            raise ConfigError(f"overlong_basis={self.overlong_basis!r}; choose 'turn' or 'trajectory'")
        if not 0 < self.overlong_buffer_frac <= 1:
            raise ConfigError(f"overlong_buffer_frac must be in (0, 1], got {self.overlong_buffer_frac}")
        super().__post_init__()


def overlong_penalty(lengths: torch.Tensor, l_max: float, l_cache: float, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment for lengths |y| (any shape)."""
    L = lengths.float()
    start = l_max - l_cache
    soft = (start - L) / l_cache
    out = torch.where(L <= start, torch.zeros_like(L), torch.where(L <= l_max, soft, torch.full_like(L, -1.0)))
    return factor * out


class DAPO(LMAlgorithm):
    """Decoupled clip and dynamic sampling policy optimisation (GRPO + clip-higher, token-mean, filtering, shaping)."""

    name = "dapo"
    Config = DAPOConfig

    def _l_max(self) -> int:
        c = self.config
        if c.overlong_max_len is not None:
            return int(c.overlong_max_len)
        samp = getattr(getattr(self, "agent", None), "sampling", None)
        return int(getattr(samp, "max_new_tokens", None) or c.max_new_tokens or 64)

    def shaped_reward(self, batch: Batch) -> torch.Tensor:
        c = self.config
        R = trajectory_reward(batch, c.reward)
        if not c.overlong_penalty:
            return R
        lmax = self._l_max()
        lcache = max(1.0, c.overlong_buffer_frac * lmax)
        if c.overlong_basis == "turn":
            pen = overlong_penalty(batch.turn_len, lmax, lcache, c.overlong_factor) * batch.turn_mask
            return R + pen.sum(1)
        return R + overlong_penalty(batch.traj_gen_len, lmax, lcache, c.overlong_factor)

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        R = self.shaped_reward(batch)
        A = grpo_advantages(R, batch.group_ids, scale="group", eps=c.eps_std)
        return Advantages(adv=batch.traj_to_tokens(A), metrics={
            "zero_variance_groups": zero_variance_share(R, batch.group_ids),
            "overlong_penalty": float((R - trajectory_reward(batch, c.reward)).mean())})

    def collect_batch(self, env_id, agent, iteration, rng, env_kwargs=None, env_fns=None, progress=False):
        """Dynamic sampling: keep only groups with reward variance, regenerate until the batch is full."""
        from baselines.core.batch import build_batch

        c = self.config
        if not c.dynamic_sampling:
            return super().collect_batch(env_id, agent, iteration, rng, env_kwargs, env_fns, progress)
        kept: list = []
        generated = 0
        tries = 0
        n_groups = 0
        for tries in range(1, c.max_gen_batches + 1):
            trajs, _ = super().collect_batch(env_id, agent, iteration, rng, env_kwargs, env_fns, progress)
            generated += len(trajs)
            last = tries == c.max_gen_batches
            b = build_batch(trajs)  # cheap; only rewards/lengths are used here
            R = self.shaped_reward(b).numpy()
            gid = b.group_ids.numpy()
            for g in np.unique(gid):
                members = [t for t, x in zip(trajs, gid, strict=False) if x == g]
                rs = R[gid == g]
                if last or np.ptp(rs) > 0:
                    # re-key the group so groups from different tries never merge
                    for t in members:
                        t.group_id = (tries, t.group_id)
                    kept.extend(members)
                    n_groups += 1
                if n_groups >= c.tasks_per_iter and not last:
                    break
            if n_groups >= c.tasks_per_iter:
                break
        return kept, {"rollouts": generated, "gen_batches": tries, "kept_groups": n_groups}
