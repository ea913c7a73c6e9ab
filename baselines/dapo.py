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
from typing import Literal

import numpy as np
import torch

from baselines.core.advantages import Reward, group_advantages, trajectory_reward, zero_variance_share
from baselines.core.batch import Batch
from baselines.core.config import AggMode
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm, LMConfig
from shopsim.configs import bounded


@dataclass
class DAPOConfig(LMConfig):
    """DAPO's options; the defaults are the verl DAPO recipe's (arXiv 2503.14476)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 10.0
    group_size: int = 16
    loss_agg: AggMode = "token-mean"
    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal and sample again until `tasks_per_iter` groups remain."""
    max_gen_batches: int = bounded(10, min=1)
    """Most generation rounds per iteration under dynamic sampling; the last round keeps every group."""
    overlong_penalty: bool = True
    """Overlong reward shaping (eq. 13): penalise generations that run into the length limit."""
    overlong_max_len: int | None = bounded(None, min=1)
    """L_max: per-turn token limit (None: the agent's max_new_tokens)."""
    overlong_buffer_frac: float = bounded(0.25, gt=0, max=1)
    """L_cache as a share of L_max: the soft-penalty zone before the limit."""
    overlong_factor: float = bounded(1.0, min=0)
    """Scale of the overlong penalty."""
    overlong_basis: Literal["turn", "trajectory"] = "turn"
    """Penalise each turn's length against the per-turn limit and sum ('turn', [derived]) or the trajectory's
    total generated length ('trajectory')."""
    weight_decay: float = 0.1
    lr: float = 1e-6
    eps_std: float = bounded(1e-6, min=0)
    """ε added to the group std before dividing."""
    reward: Reward = "return"
    """Trajectory reward R_i before shaping: the sum of env rewards ('return'), the final score, or the success
    flag."""


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
        A = group_advantages(R, batch.group_ids, scale="group", eps=c.eps_std)
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
