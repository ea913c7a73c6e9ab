"""Advantage estimators and batch-aware advantage helpers shared by the LM algorithms (docs/algorithms/core.md).

The estimators are registered by name (`register_estimator`, `estimator`, `estimators`): an estimator maps
``(batch, ctx, config)`` to the trainer's `Advantages`, and an algorithm that uses one unchanged names it in its
`advantage_estimator` class attribute instead of importing another algorithm's module:

* ``"group_outcome"``: GRPO's group-relative outcome advantage (Shao et al., arXiv 2402.03300, §4.1; Dr.GRPO's
  unscaled variant, arXiv 2503.20783), options in `GroupOutcomeConfig`;
* ``"token_gae"``: PPO's token-level GAE over generated tokens with a critic (Schulman et al., arXiv 1506.02438,
  eq. 16; verl's multi-turn placement of the turn reward on the turn's last generated token).

The building blocks of the GRPO family (`trajectory_reward`, `group_advantages`, `zero_variance_share`,
`GROUP_MODES`) live here too, so that DAPO, GiGPO, BiPACE, WAPO and ARC share them without importing each other.

The helpers work in the batch's trajectory-token layout (each trajectory's generated tokens in order, see
`baselines.core.batch`), so the same code serves the concat and window context modes.

Truncated episodes: GAE should bootstrap from V(s_next), the value of the observation after the last action. The
rollout does not record that final observation, so ``truncation="last_value"`` uses the value at the start of the
last turn as a proxy ([derived]) and ``"terminal"`` (default) treats the cut as terminal (CleanRL's choice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

import torch

from shopsim.configs import bounded
from shopsim.errors import ConfigError, UnknownNameError

from .batch import Batch
from .config import Advantages, AggMode, Ctx, LMConfig
from .gae import discounted_reverse_cumsum, gae
from .stats import group_normalize, group_stats

__all__ = ["turn_returns_to_go", "token_rewards_tt", "token_gae_for_batch", "bootstrap_values", "turn_end_mask_tt",
           "Reward", "REWARDS", "GROUP_MODES", "trajectory_reward", "group_advantages", "zero_variance_share",
           "GroupOutcomeConfig", "Estimator", "register_estimator", "estimator", "estimators"]

Reward = Literal["return", "score", "success"]
"""Trajectory reward R_i of the outcome estimators: the sum of env rewards, the final score, or the success flag."""
REWARDS = get_args(Reward)
#: episode- and step-level normalisation modes of GiGPO and BiPACE -> `stats.group_normalize` modes
GROUP_MODES = {"mean_norm": "mean", "mean_std_norm": "mean_std"}


def turn_returns_to_go(batch: Batch, gamma: float) -> torch.Tensor:
    """G_{i,k} = Σ_{j≥k} γ^{j−k} r_{i,j}  [N, K] (0 on padded turns)."""
    return discounted_reverse_cumsum(batch.turn_rewards * batch.turn_mask, gamma) * batch.turn_mask


def turn_end_mask_tt(batch: Batch) -> torch.Tensor:
    """[N, L] True at the last generated token of each turn (trajectory-token layout)."""
    tt = batch.traj_tok_turn
    nxt = torch.nn.functional.pad(tt[:, 1:], (0, 1), value=-1)
    return batch.traj_tok_mask & (nxt != tt)


def token_rewards_tt(batch: Batch) -> torch.Tensor:
    """[N, L] r_k at the last generated token of turn k, 0 elsewhere (verl's placement)."""
    k = batch.traj_tok_turn.clamp_min(0)
    r = torch.gather(batch.turn_rewards, 1, k)
    return torch.where(turn_end_mask_tt(batch), r, torch.zeros_like(r))


def bootstrap_values(batch: Batch, values_tt: torch.Tensor, truncation: str) -> torch.Tensor | None:
    """[N] value after each trajectory's last action: 0 when terminated; on truncation see module docstring."""
    if truncation == "terminal":
        return None
    if truncation != "last_value":
        raise ValueError(f"truncation must be 'terminal' or 'last_value', got {truncation!r}")
    starts = batch.turn_starts()  # [N, K] flat index into R*S
    n_turns = batch.turn_mask.sum(1).clamp_min(1) - 1
    idx = torch.gather(starts, 1, n_turns[:, None]).squeeze(1)
    # position of that flat index inside the trajectory-token layout
    hit = batch.traj_tok_index == idx[:, None]
    v = (values_tt * hit).sum(1)
    return torch.where(batch.truncated & ~batch.terminated, v, torch.zeros_like(v))


def token_gae_for_batch(batch: Batch, values: torch.Tensor, *, gamma: float, lam, truncation: str = "terminal",
                        extra_rewards: torch.Tensor | None = None):
    """Token-level GAE over generated tokens, skipping env tokens (LM PPO). values [R, S] -> (adv [R,S], ret [R,S]).

    `extra_rewards` [R, S] are added to the per-token rewards (e.g. verl's in-reward KL penalty −β·k1_t).
    `lam` may be a float or a per-trajectory tensor [N] (VAPO's length-adaptive λ).
    """
    v_tt = batch.to_traj_tokens(values)
    r_tt = token_rewards_tt(batch)
    if extra_rewards is not None:
        r_tt = r_tt + batch.to_traj_tokens(extra_rewards)
    last = bootstrap_values(batch, v_tt, truncation)
    adv_tt, ret_tt = gae(r_tt, v_tt, batch.traj_tok_mask, gamma=gamma, lam=lam, last_value=last)
    return batch.from_traj_tokens(adv_tt), batch.from_traj_tokens(ret_tt)


# ------------------------------------------------------------------------------------------ the GRPO family's pieces
def trajectory_reward(batch: Batch, kind: str = "return") -> torch.Tensor:
    """R_i [N] of each trajectory: ``"return"`` (sum of env rewards), ``"score"`` or ``"success"``."""
    return {"return": batch.returns, "score": batch.score, "success": batch.success}[kind].float()


def group_advantages(R: torch.Tensor, group_ids, *, scale: str = "group", eps: float = 1e-6,
                     singleton: str = "zero", weights: torch.Tensor | None = None) -> torch.Tensor:
    """Group-relative outcome advantages [N] (GRPO, arXiv 2402.03300 §4.1): R_i minus its group's mean, divided by
    the group's std + `eps` (``scale="group"``), the batch's (``"batch"``) or nothing (``"none"``, Dr.GRPO).
    `weights` (turn counts) repeat each trajectory once per turn in the statistics (verl-agent's step rows)."""
    if weights is None:
        if scale == "group":
            return group_normalize(R, group_ids, "mean_std", eps=eps, singleton=singleton)
        A = group_normalize(R, group_ids, "mean", singleton=singleton)
        if scale == "batch":
            A = A / (R.std() + eps) if R.numel() > 1 else A
        return A
    # rows: each trajectory repeated once per turn
    reps = weights.long().clamp_min(1)
    Rr = R.repeat_interleave(reps)
    gr = torch.as_tensor(group_ids).repeat_interleave(reps)
    mean, std, cnt = group_stats(Rr, gr)
    first = torch.cumsum(reps, 0) - reps
    mean, std, cnt = mean[first], std[first], cnt[first]
    A = R - mean
    if scale == "group":
        A = A / (std + eps)
    elif scale == "batch":
        A = A / (Rr.std() + eps)
    single = cnt <= reps.float()  # one trajectory in the group
    return torch.where(single, R if singleton == "raw" else torch.zeros_like(R), A)


def zero_variance_share(R: torch.Tensor, group_ids) -> float:
    """Share of groups whose rewards are all equal (singletons included): they give no learning signal."""
    if R.numel() == 0:
        return 0.0
    ids = torch.as_tensor(group_ids).long()
    _, std, _ = group_stats(R, ids)
    n = int(ids.max()) + 1
    flat = torch.zeros(n).scatter_(0, ids, (std == 0).float())  # every member carries its group's std
    present = torch.zeros(n).index_add_(0, ids, torch.ones_like(R)) > 0
    return float(flat[present].mean())


@dataclass
class GroupOutcomeConfig(LMConfig):
    """The options of the ``"group_outcome"`` estimator (GRPO's, arXiv 2402.03300 §4.1), shared by the configs of
    the algorithms that build on it (GRPO, ARC, midtrain)."""

    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide the group-centred rewards by the group's std ('group', GRPO), the batch's std ('batch') or by
    nothing ('none', Dr.GRPO)."""
    eps_std: float = bounded(1e-6, min=0)
    """ε added to the std before dividing (ε_std)."""
    loss_agg: AggMode = "seq-mean-token-mean"
    stats_over: Literal["trajectory", "rows"] = "trajectory"
    """Group statistics once per trajectory ('trajectory') or once per turn row, so that longer trajectories
    weigh more ('rows', verl-agent's step rows)."""
    singleton: Literal["zero", "raw"] = "zero"
    """Advantage of a group with a single rollout: 0 ('zero') or its raw reward ('raw', verl's mean 0 / std 1)."""
    reward: Reward = "return"
    """Trajectory reward R_i: the sum of env rewards ('return'), the final score, or the success flag."""


# ------------------------------------------------------------------------------------------ the registry
Estimator = Callable[[Batch, Ctx, Any], Advantages]
"""``(batch, ctx, config) -> Advantages``: token advantages [R, S] (and critic targets) of one batch."""
_ESTIMATORS: dict[str, Estimator] = {}
_E = TypeVar("_E", bound=Estimator)


def register_estimator(name: str, *, overwrite: bool = False) -> Callable[[_E], _E]:
    """Decorator: register an `Estimator` under `name` (an existing name needs ``overwrite=True``)."""

    def deco(fn: _E) -> _E:
        if name in _ESTIMATORS and not overwrite:
            raise ValueError(f"advantage estimator {name!r} is already registered; pass overwrite=True")
        _ESTIMATORS[name] = fn
        return fn

    return deco


def estimator(name: str) -> Estimator:
    """The estimator registered as `name`."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise UnknownNameError(f"unknown advantage estimator {name!r}; registered: {', '.join(estimators())}") from None


def estimators() -> list[str]:
    """The registered estimator names."""
    return sorted(_ESTIMATORS)


@register_estimator("group_outcome")
def group_outcome(batch: Batch, ctx: Ctx, config: Any) -> Advantages:
    """GRPO's outcome advantage: `group_advantages` of `trajectory_reward` within each task's G rollouts, broadcast
    to every generated token of the trajectory. Options (`GroupOutcomeConfig`): reward, stats_over,
    scale_rewards, eps_std, singleton. Logs ``zero_variance_groups``."""
    c = config
    R = trajectory_reward(batch, c.reward)
    w = batch.turn_mask.sum(1) if c.stats_over == "rows" else None
    A = group_advantages(R, batch.group_ids, scale=c.scale_rewards, eps=c.eps_std, singleton=c.singleton, weights=w)
    return Advantages(adv=batch.traj_to_tokens(A),
                      metrics={"zero_variance_groups": zero_variance_share(R, batch.group_ids)})


@register_estimator("token_gae")
def token_gae(batch: Batch, ctx: Ctx, config: Any) -> Advantages:
    """PPO's token-level GAE with the critic's values `ctx.values` (`token_gae_for_batch`); the returns are the
    critic's targets. Options: gamma, gae_lambda, truncation, and kl_in_reward (verl's in-reward KL penalty
    r_t −= β·k1_t on generated tokens, against π_ref; logged as ``kl_in_reward``)."""
    c = config
    if ctx.values is None:
        raise ConfigError("the token_gae estimator needs the critic's values (an algorithm with uses_critic = True)")
    extra, m = None, {}
    if getattr(c, "kl_in_reward", 0) > 0 and ctx.ref_logp is not None:
        kl = (ctx.old_logp - ctx.ref_logp) * batch.gen_mask  # k1 on generated tokens (verl)
        extra = -c.kl_in_reward * kl
        m["kl_in_reward"] = float(kl.sum() / batch.gen_mask.sum().clamp_min(1))
    adv, ret = token_gae_for_batch(batch, ctx.values, gamma=c.gamma, lam=c.gae_lambda, truncation=c.truncation,
                                   extra_rewards=extra)
    return Advantages(adv=adv, returns=ret, metrics=m)
