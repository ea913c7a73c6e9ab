"""ARC for the Shopping LM agent (docs/algorithms/arc.md): strategy-conditioned groups and a mixed reward.

"ARC: fair relative advantage comparison in open-world real interaction" (Ant International; no arXiv id, paper
text or code available). Everything beyond the seed digest's summary is a [derived] design (docs/algorithms/arc.md):

    strategies S (M = 3): recommend_directly, ask_first, confirm_before_buying, injected with
                          reset(options={"strategy": s}) (the env renders the instruction into the first observation)
    rollouts:             for each task x and each s in S, n = group_size rollouts with the task's reset seed
    group:                g = (task, strategy)   (a no-instruction "free" group per task with free_group=True)
    mixed reward:         r = r_task + w_fmt·r_format + w_tool·r_tool
                          r_format = share of the trajectory's actions that parsed
                          r_tool   = share of the parsed actions (tool calls) that executed without error
    advantage:            A_i = (r_i − mean_g r) / (std_g r + ε_std), broadcast to every generated token
    loss:                 −agg min(ρ·A, clip(ρ, 1−ε, 1+ε)·A) − c_ent·agg H  (+ β·k3, off by default)

ρ uses the instructed prompt the tokens were generated from (the card's on-policy reading). Evaluation resets
without a strategy: the shared evaluation uses only `reset_options`, which never carries ARC's strategies.
The answer-latency proxy (turns / characters before the first user-visible message) and the share of episodes
that asked the customer are logged per iteration (``train_turns_before_first_answer``, ``train_asked``, and per
strategy ``strategy_success/<s>``, ``strategy_asked/<s>``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from baselines.core.advantages import GroupOutcomeConfig, group_advantages, trajectory_reward, zero_variance_share
from baselines.core.batch import Batch
from baselines.core.stats import group_index, group_stats
from baselines.core.trainer import Advantages, Ctx, LMAlgorithm
from shopsim.configs import bounded
from shopsim.errors import ConfigError
from shopsim.trajectory import Trajectory, style_metrics

#: the card's M = 3 strategies, as the Shopping env names them (`shopsim.envs.shopping.env.STRATEGIES`)
DEFAULT_STRATEGIES = ("recommend_directly", "ask_first", "confirm_before_buying")
#: the strategy key of the no-instruction group (free_group=True)
FREE = None


@dataclass
class ARCConfig(GroupOutcomeConfig):
    """ARC's options; defaults are the card's [derived] design (docs/algorithms/arc.md)."""

    group_size: int = bounded(4, min=1)
    """n, rollouts per (task, strategy) group; a task gets n × (number of strategies [+ 1 free group]) rollouts."""
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    """The strategy instructions injected with reset(options={"strategy": s}); an env strategy name
    (recommend_directly, ask_first, confirm_before_buying) or any instruction text."""
    strategies_per_task: int = bounded(0, min=0)
    """Strategies run per task: 0 = all of them (the card's reading); k > 0 = a random subset of k per task."""
    free_group: bool = False
    """Also run a no-instruction group of n rollouts per task, so training sees the evaluation prompts."""
    base: Literal["grpo", "ppo"] = "grpo"
    """Advantage base: 'grpo' (the group-normalised mixed reward) or 'ppo' (the card's alternative: token GAE with a
    critic that reads the instructed prompt, on the mixed reward, then normalised inside each (task, strategy)
    group)."""
    gamma: float = bounded(1.0, min=0, max=1)
    """base='ppo': discount γ of the token GAE."""
    gae_lambda: float = bounded(1.0, min=0, max=1)
    """base='ppo': λ of the token GAE."""
    w_fmt: float = bounded(0.1, min=0)
    """Weight of the format reward r_format (share of the trajectory's actions that parsed)."""
    w_tool: float = bounded(0.1, min=0)
    """Weight of the tool reward r_tool (share of the parsed actions that executed without error)."""
    drop_zero_variance: bool = False
    """Leave groups whose mixed rewards are all equal out of the loss and its normaliser (False: they stay in
    with A = 0)."""
    entropy_coef: float = bounded(1e-3, min=0)
    """c_ent, weight of the entropy bonus over all generated tokens (the card's guard against entropy collapse)."""

    def __post_init__(self) -> None:
        if isinstance(self.strategies, str):  # "a,b" from a command line or a JSON config
            self.strategies = tuple(s for s in self.strategies.split(",") if s)
        self.strategies = tuple(self.strategies)
        super().__post_init__()
        if not self.strategies or any(not isinstance(s, str) or not s.strip() for s in self.strategies):
            raise ConfigError("arc: strategies must be a non-empty list of non-empty strategy names, e.g. "
                              f"{','.join(DEFAULT_STRATEGIES)}")
        if len(set(self.strategies)) != len(self.strategies):
            raise ConfigError(f"arc: strategies {self.strategies} repeats a strategy; list each once")
        if self.strategies_per_task > len(self.strategies):
            raise ConfigError(f"arc: strategies_per_task={self.strategies_per_task} exceeds the "
                              f"{len(self.strategies)} strategies; use 0 (all) or at most {len(self.strategies)}")
        if "strategy" in self.reset_options:
            raise ConfigError("arc: reset_options must not set 'strategy' (ARC injects the strategies itself and "
                              "evaluation runs without one); remove it")


def plan_strategies(strategies: Sequence[str], n_tasks: int, per_task: int, free_group: bool,
                    rng: np.random.Generator | None = None) -> list[list[str | None]]:
    """The strategy of each group of each task: all `strategies` (per_task = 0) or a random subset of `per_task`,
    in the configured order, plus the free group (None) last when `free_group`."""
    out = []
    for _ in range(n_tasks):
        ss = list(strategies)
        if per_task:
            assert rng is not None, "per_task > 0 draws the subsets with rng"
            keep = sorted(rng.choice(len(ss), size=per_task, replace=False).tolist())
            ss = [ss[j] for j in keep]
        out.append(ss + ([FREE] if free_group else []))
    return out


def strategy_reset_options(plan: list[list[str | None]], n: int, base: dict | None = None):
    """`reset_options(index, group)` for `shopsim.rollout.collect`: rollout r of task g runs strategy
    ``plan[g][r // n]``; the free group's rollouts get no strategy key."""
    base = dict(base or {})

    def options(index: int, g: int) -> dict:
        per = n * len(plan[g])
        s = plan[g][(index - g * per) // n]
        return {**base, "strategy": s} if s is not None else dict(base)

    return options


def format_tool_rewards(traj: Trajectory) -> tuple[float, float]:
    """(r_format, r_tool) of one trajectory from its per-turn ``info["invalid_kind"]`` (the shopping env):
    r_format = parsed actions / actions; r_tool = parsed actions that executed without error / parsed actions
    (0 when nothing parsed: a trajectory of unparseable text earns no tool reward)."""
    n = len(traj.turns)
    if n == 0:
        return 0.0, 0.0
    parsed = ok = 0
    for t in traj.turns:
        info = t.info or {}
        kind = info.get("invalid_kind")
        if kind is None and info.get("invalid_action") and "invalid_kind" not in info:
            kind = "tool"  # an env that does not tell the two apart: count the action as parsed, failed call
        if kind != "parse":
            parsed += 1
            ok += int(kind is None)
    return parsed / n, (ok / parsed if parsed else 0.0)


def mixed_reward(batch: Batch, r_task: torch.Tensor, w_fmt: float, w_tool: float) -> tuple[torch.Tensor, dict]:
    """r = r_task + w_fmt·r_format + w_tool·r_tool per trajectory [N], and the components' batch means."""
    ft = torch.tensor([format_tool_rewards(t) for t in batch.trajectories], dtype=r_task.dtype).reshape(-1, 2)
    if ft.shape[0] != r_task.shape[0]:
        raise ConfigError("arc: the batch carries no trajectories to read the format / tool rewards from")
    r = r_task + w_fmt * ft[:, 0] + w_tool * ft[:, 1]
    return r, {"r_task": float(r_task.mean()), "r_format": float(ft[:, 0].mean()), "r_tool": float(ft[:, 1].mean())}


def strategy_group_ids(group_ids: torch.Tensor, strategy_ids: torch.Tensor) -> torch.Tensor:
    """Dense ids of the (task group, strategy) pairs: rollouts of one task under different strategies (or without
    one) never share a group, whatever the rollout's own group id says."""
    keys = list(zip(torch.as_tensor(group_ids).tolist(), torch.as_tensor(strategy_ids).tolist(), strict=True))
    return group_index(keys)[0]


def ppo_group_advantages(batch: Batch, values: torch.Tensor, r: torch.Tensor, gids: torch.Tensor, *,
                         gamma: float = 1.0, lam: float = 1.0, eps: float = 1e-6):
    """The PPO base ([derived], card §"Design"): token GAE on the mixed reward, then each (task, strategy) group's
    token advantages whitened over the group's generated tokens. Returns (advantages [R, S], critic targets).

    The env's turn rewards sit on each turn's last generated token (as for PPO); the format/tool part of the mixed
    reward, r − Σ_k r_k, is added on the trajectory's last generated token, so the token rewards sum to r."""
    from baselines.core.advantages import token_gae_for_batch

    bonus_tt = torch.zeros(batch.traj_tok_mask.shape, dtype=torch.float32)
    last = (batch.traj_tok_mask.sum(1) - 1).clamp_min(0)
    has = batch.traj_tok_mask.any(1)
    n = torch.arange(len(last))
    bonus_tt[n[has], last[has]] = (r - batch.returns).float()[has]
    adv, ret = token_gae_for_batch(batch, values, gamma=gamma, lam=lam, extra_rewards=batch.from_traj_tokens(bonus_tt))
    sel = batch.gen_mask.bool()
    vals = adv[sel]
    mean, std, _ = group_stats(vals, gids[batch.row_traj][:, None].expand_as(adv)[sel])
    out = torch.zeros_like(adv)
    out[sel] = (vals - mean) / (std + eps)
    return out, ret


class ARC(LMAlgorithm):
    """ARC: group-relative advantages inside (task, strategy) groups, on a format/tool-mixed reward."""

    name = "arc"
    Config = ARCConfig
    needs_entropy = True  # entropy is logged even with c_ent = 0 (the card's collapse check)

    def collect_batch(self, env_id: str, agent, iteration: int, rng: np.random.Generator,
                      env_kwargs: dict | None = None, env_fns=None, progress: bool = False):
        """n rollouts per (task, strategy) for `tasks_per_iter` tasks, all with the task's reset seed."""
        collect = self.rollout_collect()

        c = self.config
        tasks, seeds, screen = self.iteration_tasks(env_id, agent, rng, env_kwargs=env_kwargs, env_fns=env_fns)
        plan = plan_strategies(c.strategies, c.tasks_per_iter, c.strategies_per_task, c.free_group, rng)
        per_task = c.group_size * len(plan[0])
        trajs = collect(env_id, agent, tasks=tasks, seeds=seeds, episodes=c.tasks_per_iter if tasks else None,
                        split="train", group_size=per_task, num_envs=c.num_envs, env_kwargs=env_kwargs,
                        reset_options=strategy_reset_options(plan, c.group_size, c.reset_options),
                        progress=progress, env_fns=env_fns, agent_seed=int(rng.integers(0, 2**31 - 1)))
        m: dict = {"rollouts": len(trajs), "rollouts_per_task": per_task, **screen}
        by: dict[str, list[Trajectory]] = {}
        for t in trajs:
            by.setdefault("free" if t.strategy is None else str(t.strategy), []).append(t)
        for s, ts in sorted(by.items()):
            m[f"strategy_success/{s}"] = float(np.mean([t.success for t in ts]))
            sm = style_metrics(ts)
            for k in ("asked", "turns_before_first_answer"):
                if k in sm:
                    m[f"strategy_{k}/{s}"] = sm[k]
        return trajs, m

    def setup(self, agent) -> None:
        self.uses_critic = self.config.base == "ppo"  # the critic exists only for the PPO base
        super().setup(agent)

    def compute_advantages(self, batch: Batch, ctx: Ctx) -> Advantages:
        c = self.config
        r, parts = mixed_reward(batch, trajectory_reward(batch, c.reward), c.w_fmt, c.w_tool)
        gids = strategy_group_ids(batch.group_ids, batch.strategy_ids)
        if c.base == "ppo":
            assert ctx.values is not None  # the PPO base has a critic (setup)
            adv, ret = ppo_group_advantages(batch, ctx.values, r, gids, gamma=c.gamma, lam=c.gae_lambda,
                                            eps=c.eps_std)
            return Advantages(adv=adv, returns=ret, metrics={**parts, "reward_mixed": float(r.mean())})
        w = batch.turn_mask.sum(1) if c.stats_over == "rows" else None
        A = group_advantages(r, gids, scale=c.scale_rewards, eps=c.eps_std, singleton=c.singleton, weights=w)
        sizes = torch.bincount(gids)
        zv = zero_variance_share(r, gids)
        metrics = {**parts, "reward_mixed": float(r.mean()), "zero_variance_groups": zv,
                   "groups": float(len(sizes)), "group_size_mean": float(sizes[sizes > 0].float().mean())}
        token_mask = None
        if c.drop_zero_variance:
            # a group whose rewards are all equal leaves the loss and its normaliser entirely
            keep = group_stats(r, gids)[1] > 0  # group_stats gives a tied (or single-member) group std 0
            token_mask = batch.traj_to_tokens(keep.float()) > 0
            metrics["dropped_trajectories"] = float((~keep).sum())
        return Advantages(adv=batch.traj_to_tokens(A), token_mask=token_mask, metrics=metrics)
