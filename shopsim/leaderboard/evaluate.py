"""Run one agent through an evaluation protocol and summarise it (docs/leaderboard.md).

`evaluate(agent, protocol)` runs, for each eval seed, every (test task, try) episode of the protocol with
`shopsim.rollout.collect` (task ids and reset seeds given explicitly, so two agents see the same episodes), turns
the trajectories into per-seed summaries (`shopsim.leaderboard.metrics`) and aggregates them over seeds. For a
family with a reference policy (``protocol.reference``; replenishment: the (s, S) policy, registered as
``("s_S", "inventory")``) the caller passes that agent as ``reference=``; it is evaluated on the same episodes and
every entry gets a per-seed ``gap_to_s_S_pct``.

The evaluator takes its agents as arguments and never builds one: it sits below `agents` in the layers
(``[tool.importlinter]`` in pyproject.toml); the CLI and the benchmark runner build them (`agents.make`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shopsim.leaderboard.metrics import add_gap, aggregate, episode_record, seed_summary
from shopsim.leaderboard.protocols import Protocol

#: metric aliases: the leaderboard name -> episode_metrics names an env may use for it (first found wins)
ALIASES: dict[str, tuple[str, ...]] = {"policy_value": ("policy_value", "value", "reward")}


@dataclass
class Evaluation:
    """What `evaluate` returns: aggregated metrics, per-seed summaries and (optionally) the trajectories."""

    metrics: dict[str, dict]
    per_seed: list[dict]
    wall_s: float
    trajectories: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _apply_aliases(summary: dict) -> None:
    for name, sources in ALIASES.items():
        if name not in summary:
            for src in sources:
                if src in summary:
                    summary[name] = summary[src]
                    break


def agent_env_kwargs(agent, protocol: Protocol) -> dict:
    """The protocol's env options plus the presentation options (`shopsim.envs.presentation_kwargs`) the agent was
    trained with (``agent.env_kwargs``, e.g. numbered results for an LM fine-tuned on them); task options stay the
    protocol's."""
    from shopsim.envs import presentation_kwargs

    mine = getattr(agent, "env_kwargs", None) or {}
    allowed = presentation_kwargs(protocol.env_id) if mine else frozenset()
    return {**protocol.env_kwargs, **{k: v for k, v in mine.items() if k in allowed}}


def run_seeds(agent, protocol: Protocol, *, progress: bool = False, num_envs: int = 8,
              collect: Callable | None = None, keep: bool = False) -> tuple[list[dict], list]:
    """Per-seed summaries of `agent` on every episode of `protocol` (and the trajectories if `keep`)."""
    if collect is None:  # shopsim.rollout.collect, or a Ray pool's inside `shopsim.distributed.using(pool)`
        from shopsim.distributed import active_collect

        collect = active_collect()
    summaries, kept = [], []
    env_kwargs = agent_env_kwargs(agent, protocol)
    for seed in protocol.seeds:
        tasks, seeds = protocol.episodes(seed)
        trajs = collect(protocol.env_id, agent, tasks=tasks, seeds=seeds, split=protocol.split, group_size=1,
                        num_envs=num_envs, env_kwargs=env_kwargs, progress=progress,
                        agent_seed=int(seed))
        records = [episode_record(t) for t in trajs]
        for rec, task in zip(records, tasks, strict=False):
            rec["task_id"] = task  # group tries by the protocol's task id whatever the env echoes back
        summary = seed_summary(records, protocol.tries)
        _apply_aliases(summary)
        summaries.append(summary)
        if keep:
            kept.extend(trajs)
    return summaries, kept


#: (id(reference agent), episodes) -> (the agent, its per-seed summaries); the agent is kept so its id stays unique
_REFERENCE_CACHE: dict[Any, tuple[Any, list[dict]]] = {}


def reference_summaries(reference, protocol: Protocol, *, progress: bool = False,
                        collect: Callable | None = None) -> list[dict]:
    """Per-seed summaries of the `reference` agent on `protocol` (memoised per process and agent object)."""
    key = (id(reference), protocol.env_id, protocol.split, protocol.task_ids, protocol.seeds, protocol.tries,
           tuple(sorted(protocol.env_kwargs.items())))
    if key not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[key] = (reference, run_seeds(reference, protocol, progress=progress, collect=collect)[0])
    return [dict(s) for s in _REFERENCE_CACHE[key][1]]


def evaluate(agent, protocol: Protocol, *, reference=None, progress: bool = False, num_envs: int = 8,
             collect: Callable | None = None, keep_trajectories: bool = False) -> Evaluation:
    """Evaluate `agent` (an `agents.Agent`) on every episode of `protocol`; see module docstring.

    `reference`: the agent named by ``protocol.reference`` (built by the caller), for the gap metric; without it a
    protocol that names a reference gets a note instead of the gap."""
    t0 = time.perf_counter()
    summaries, trajs = run_seeds(agent, protocol, progress=progress, num_envs=num_envs, collect=collect,
                                 keep=keep_trajectories)
    notes = []
    if protocol.reference and reference is None:
        notes.append(f"no gap to {protocol.reference}: no reference agent was given to evaluate()")
    elif protocol.reference:
        try:
            ref = reference_summaries(reference, protocol, progress=progress, collect=collect)
        except Exception as exc:  # noqa: BLE001 - a broken reference must not lose the entry's own metrics
            notes.append(f"no gap to {protocol.reference}: the reference failed ({type(exc).__name__}: {exc})")
        else:
            add_gap(summaries, ref)
    return Evaluation(metrics=aggregate(summaries), per_seed=summaries, wall_s=time.perf_counter() - t0,
                      trajectories=trajs, notes=notes)
