"""Run one agent through an evaluation protocol and summarise it (docs/leaderboard.md).

`evaluate(agent, protocol)` runs, for each eval seed, every (test task, try) episode of the protocol with
`shopsim.rollout.collect` — one call for all eval seeds, so one labelled progress bar per evaluation (task ids and
reset seeds given explicitly, so two agents see the same episodes) — turns the trajectories into per-episode
records and per-seed summaries, and summarises the records with 95% intervals over tasks
(`shopsim.leaderboard.metrics.summarize`: Wilson for rates, a seeded bootstrap over tasks otherwise). For a family
with a reference policy (``protocol.reference``; replenishment: the (s, S) policy, registered as
``("s_S", "inventory")``) the caller passes that agent as ``reference=``; it is evaluated on the same episodes once
per process and protocol (`reference_run`), and every entry gets ``gap_to_s_S_pct`` (a paired bootstrap). When the
agent being evaluated *is* the reference (same name and env), its own run is reused instead of running it twice.

PettingZoo envs (the multi-warehouse env) run through `parallel_records`: the env's parallel API, every agent of every
episode one slot of the evaluated agent (which acts for each warehouse on that warehouse's own observation), one
record per episode with the total (team) cost, each agent's cost (``cost/<agent>``) and the pooled fill rate.

The evaluator takes its agents as arguments and never builds one: it sits below `agents` in the layers
(``[tool.importlinter]`` in pyproject.toml); the CLI and the benchmark runner build them (`agents.make`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np

from shopsim.leaderboard.metrics import add_gap, episode_record, seed_summary, summarize
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
    records: list[dict] = field(default_factory=list)
    """Per-episode records (`episode_record`), each with its ``task_id``; pooled over training runs by the bench."""
    reference_records: list[dict] | None = None
    """The reference agent's records on the same episodes (None without a reference)."""


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


@contextmanager
def decoding(agent, mode: str):
    """Within the block, an agent with a ``sampling.greedy`` switch (the LM agents) decodes as `mode` says
    (`Protocol.decoding`): ``greedy`` switches arg-max on and restores the agent's own setting after; ``sample``
    leaves the agent as it is."""
    sampling: Any = getattr(agent, "sampling", None)  # duck-typed: anything with a `greedy` attribute
    if mode != "greedy" or not hasattr(sampling, "greedy"):
        yield
        return
    saved = sampling.greedy
    sampling.greedy = True
    try:
        yield
    finally:
        sampling.greedy = saved


#: env copies an evaluation steps together when neither the caller nor the agent (``agent.eval_slots``) says
DEFAULT_NUM_ENVS = 8


def eval_num_envs(agent, num_envs: int | None) -> int:
    """The env copies to evaluate `agent` with: `num_envs` when given, else the agent's ``eval_slots`` (the LM agent
    decodes that many episodes as one batch), else `DEFAULT_NUM_ENVS`."""
    if num_envs is not None:
        return int(num_envs)
    return int(getattr(agent, "eval_slots", None) or DEFAULT_NUM_ENVS)


@overload
def run_seeds(agent, protocol: Protocol, *, progress: bool = ..., num_envs: int | None = ...,
              collect: Callable | None = ..., keep: bool = ...,
              with_records: Literal[False] = ...) -> tuple[list[dict], list]: ...


@overload
def run_seeds(agent, protocol: Protocol, *, progress: bool = ..., num_envs: int | None = ...,
              collect: Callable | None = ..., keep: bool = ...,
              with_records: Literal[True]) -> tuple[list[dict], list, list[dict]]: ...


def run_seeds(agent, protocol: Protocol, *, progress: bool = False, num_envs: int | None = None,
              collect: Callable | None = None, keep: bool = False,
              with_records: bool = False) -> tuple[list[dict], list] | tuple[list[dict], list, list[dict]]:
    """Per-seed summaries of `agent` on every episode of `protocol` (and the trajectories if `keep`; and the
    per-episode records if `with_records`). All eval seeds' episodes run in one `collect` call (one progress bar;
    the agent's sampling is seeded with the first eval seed)."""
    if collect is None:  # shopsim.rollout.collect, or a Ray pool's inside `shopsim.distributed.using(pool)`
        from shopsim.distributed import active_collect

        collect = active_collect()
    from shopsim.envs import is_pettingzoo

    env_kwargs = agent_env_kwargs(agent, protocol)
    num_envs = eval_num_envs(agent, num_envs)
    tasks, seeds, bounds = [], [], [0]
    for seed in protocol.seeds:
        t, s = protocol.episodes(seed)
        tasks += t
        seeds += s
        bounds.append(len(tasks))
    with decoding(agent, protocol.decoding):
        if is_pettingzoo(protocol.env_id):
            trajs = []
            records = parallel_records(agent, protocol.env_id, tasks=tasks, seeds=seeds, split=protocol.split,
                                       env_kwargs=env_kwargs, num_envs=num_envs, progress=progress,
                                       agent_seed=int(protocol.seeds[0]))
        else:
            trajs = collect(protocol.env_id, agent, tasks=tasks, seeds=seeds, split=protocol.split, group_size=1,
                            num_envs=num_envs, env_kwargs=env_kwargs, progress=progress,
                            agent_seed=int(protocol.seeds[0]))
            records = [episode_record(t) for t in trajs]
    for rec, task in zip(records, tasks, strict=False):
        rec["task_id"] = task  # group tries by the protocol's task id whatever the env echoes back
    summaries = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        summary = seed_summary(records[lo:hi], protocol.tries)
        _apply_aliases(summary)
        summaries.append(summary)
    for rec in records:
        _apply_aliases(rec)
    kept = trajs if keep else []
    return (summaries, kept, records) if with_records else (summaries, kept)


#: episodes a `parallel_records` batch steps together (the agent acts for all their agents in one call)
PARALLEL_BATCH = 64


def parallel_records(agent, env_id: str, *, tasks: list, seeds: list[int], split: str = "test",
                     env_kwargs: dict | None = None, num_envs: int = 8, progress: bool = False,
                     agent_seed: int | None = None) -> list[dict]:
    """One record per episode of a PettingZoo parallel env (`shopsim.envs.make`): episode i is reset with
    ``seed=seeds[i]`` and ``options={"split": split, "task_id": tasks[i]}``; `agent` acts for every agent of every
    episode, each (episode, agent) pair one slot (``begin_episode`` on its reset observation and info, ``act`` on
    its own observation), in lockstep batches of `PARALLEL_BATCH` episodes (`num_envs` is unused: the envs are
    stepped in this process).

    A record holds the `episode_record` fields (no success; ``return`` is the sum of every agent's rewards,
    ``score`` minus the total cost), ``cost`` (the total over agents of their ``episode_metrics["cost"]``),
    ``cost/<agent>`` per agent, ``fill_rate`` (the env's ``team_fill_rate`` when it reports one, else the mean over
    agents), ``order_rate`` (the mean over agents) and the agents' mean of any other numeric episode metric."""
    from tqdm.auto import tqdm

    from shopsim.envs import make

    del num_envs
    env_kwargs = dict(env_kwargs or {})
    records: list[dict] = []
    bar = tqdm(total=len(tasks), desc=f"eval {getattr(agent, 'name', type(agent).__name__)} on {env_id}",
               unit="ep", leave=False, disable=not progress)
    first = True
    for lo in range(0, len(tasks), PARALLEL_BATCH):
        envs = [make(env_id, **env_kwargs) for _ in range(min(PARALLEL_BATCH, len(tasks) - lo))]
        names = list(envs[0].possible_agents)
        A = len(names)
        if first:  # one reset per evaluation (the agent's sampling stream runs on across batches)
            agent.reset(len(envs) * A, seed=agent_seed)
            first = False
        obs, infos = [], []
        for j, env in enumerate(envs):
            o, inf = env.reset(seed=int(seeds[lo + j]), options={"split": split, "task_id": tasks[lo + j]})
            obs.append(o)
            infos.append(inf)
            for k, a in enumerate(names):
                agent.begin_episode(j * A + k, o[a], inf[a])
        ret = [0.0] * len(envs)
        turns = [0] * len(envs)
        final: list[dict | None] = [None] * len(envs)
        live = list(range(len(envs)))
        while live:
            slots = [j * A + k for j in live for k in range(A)]
            decisions = agent.act([obs[j][a] for j in live for a in names],
                                  [infos[j][a] for j in live for a in names], slots)
            still = []
            for n, j in enumerate(live):
                acts = {a: decisions[n * A + k].action for k, a in enumerate(names)}
                o, r, term, trunc, inf = envs[j].step(acts)
                ret[j] += float(sum(r.values()))
                turns[j] += 1
                done = all(term.get(a, False) or trunc.get(a, False) for a in names)
                for k, a in enumerate(names):
                    agent.observe(j * A + k, float(r.get(a, 0.0)), bool(term.get(a, False)),
                                  bool(trunc.get(a, False)), inf.get(a, {}))
                obs[j], infos[j] = o, inf
                if done:
                    final[j] = inf
                else:
                    still.append(j)
            live = still
        for j, env in enumerate(envs):
            records.append(_parallel_record(tasks[lo + j], names, final[j] or {}, ret[j], turns[j]))
            env.close()
        bar.update(len(envs))
    bar.close()
    return records


def _parallel_record(task_id, names: list[str], info: dict, ret: float, turns: int) -> dict:
    per = {a: (info.get(a) or {}).get("episode_metrics") or {} for a in names}
    costs = {a: float(per[a].get("cost", float("nan"))) for a in names}
    total = float(sum(costs.values()))
    rec: dict = {"task_id": task_id, "success": None, "score": -total, "return": ret, "turns": float(turns),
                 "tokens": 0.0, "invalid_rate": 0.0, "cost": total}
    rec.update({f"cost/{a}": c for a, c in costs.items()})
    shared = set.intersection(*(set(m) for m in per.values())) if per else set()
    for key in sorted(shared - {"cost", "team_cost", "team_fill_rate"}):
        try:
            rec[key] = float(np.mean([float(per[a][key]) for a in names]))
        except (TypeError, ValueError):
            continue  # non-numeric extras are not leaderboard metrics
    team_fill = next((m["team_fill_rate"] for m in per.values() if "team_fill_rate" in m), None)
    if team_fill is not None:
        rec["fill_rate"] = float(team_fill)
    return rec


#: (id(reference agent), episodes) -> (the agent, its per-seed summaries, its records); the agent is kept so its id
#: stays unique
_REFERENCE_CACHE: dict[Any, tuple[Any, list[dict], list[dict]]] = {}


def _reference_key(reference, protocol: Protocol) -> tuple:
    return (id(reference), protocol.env_id, protocol.split, protocol.task_ids, protocol.seeds, protocol.tries,
            tuple(sorted(protocol.env_kwargs.items())))


def reference_run(reference, protocol: Protocol, *, progress: bool = False,
                  collect: Callable | None = None) -> tuple[list[dict], list[dict]]:
    """(per-seed summaries, records) of the `reference` agent on `protocol`, memoised per process and agent object,
    so that every entry measured against it reuses one run."""
    key = _reference_key(reference, protocol)
    if key not in _REFERENCE_CACHE:
        summaries, _, records = run_seeds(reference, protocol, progress=progress, collect=collect, with_records=True)
        _REFERENCE_CACHE[key] = (reference, summaries, records)
    _, summaries, records = _REFERENCE_CACHE[key]
    return [dict(s) for s in summaries], [dict(r) for r in records]


def reference_summaries(reference, protocol: Protocol, *, progress: bool = False,
                        collect: Callable | None = None) -> list[dict]:
    """Per-seed summaries of the `reference` agent on `protocol` (see `reference_run`)."""
    return reference_run(reference, protocol, progress=progress, collect=collect)[0]


def _is_reference(agent, reference) -> bool:
    """Whether `agent` is the reference agent itself (the same object, or the same registered agent class and
    name), so that its evaluation can serve as the reference run."""
    if agent is reference:
        return True
    if reference is None or type(agent) is not type(reference):
        return False
    return getattr(agent, "name", None) == getattr(reference, "name", None) and not getattr(agent, "learns", False)


def evaluate(agent, protocol: Protocol, *, reference=None, progress: bool = False, num_envs: int | None = None,
             collect: Callable | None = None, keep_trajectories: bool = False) -> Evaluation:
    """Evaluate `agent` (an `agents.Agent`) on every episode of `protocol`; see module docstring.

    `reference`: the agent named by ``protocol.reference`` (built by the caller), for the gap metric; without it a
    protocol that names a reference gets a note instead of the gap. An LM agent decodes as ``protocol.decoding``
    says (`decoding`, applied in `run_seeds`; greedy by default) and gets its own sampling setting back afterwards."""
    t0 = time.perf_counter()
    notes: list[str] = []
    ref_records = None
    if protocol.reference and reference is not None and _is_reference(agent, reference):
        # the agent is the reference: run it once, as the reference run every other entry also reuses
        summaries, records = reference_run(reference, protocol, progress=progress, collect=collect)
        trajs: list = []
        if keep_trajectories:  # trajectories are not memoised; run again only when they are asked for
            summaries, trajs, records = run_seeds(agent, protocol, progress=progress, num_envs=num_envs,
                                                  collect=collect, keep=True, with_records=True)
        ref_summaries, ref_records = [dict(s) for s in summaries], records
        add_gap(summaries, ref_summaries)
    else:
        summaries, trajs, records = run_seeds(agent, protocol, progress=progress, num_envs=num_envs,
                                              collect=collect, keep=keep_trajectories, with_records=True)
        if protocol.reference and reference is None:
            notes.append(f"no gap to {protocol.reference}: no reference agent was given to evaluate()")
        elif protocol.reference:
            try:
                ref_summaries, ref_records = reference_run(reference, protocol, progress=progress, collect=collect)
            except Exception as exc:  # noqa: BLE001 - a broken reference must not lose the entry's own metrics
                notes.append(f"no gap to {protocol.reference}: the reference failed ({type(exc).__name__}: {exc})")
            else:
                add_gap(summaries, ref_summaries)
    metrics = summarize(records, per_seed=summaries, reference=ref_records, tries=protocol.tries)
    return Evaluation(metrics=metrics, per_seed=summaries, wall_s=time.perf_counter() - t0,
                      trajectories=trajs, notes=notes, records=records, reference_records=ref_records)
