"""Run agents on environments and collect turn-segmented trajectories (docs/design.md).

`collect` runs any `agents.Agent` on a pool of env copies for a list of episodes and returns `Trajectory`
objects, optionally streaming each finished one to a `shopsim.datasets.DatasetWriter`.

Episodes are specified by (task id, seed, group id). With `tasks` given, each task is run `group_size` times with
the same reset seed and options, so the rollouts of a group share their initial state (GRPO-style groups). Without
`tasks`, episode i uses seed `seed + i` and the env draws its task from `split` with that seed.

Execution modes:

* ``vector=None`` (default): `num_envs` env instances in this process; a slot takes the next episode as soon as
  its previous one ends (no waiting for the slowest episode). Copies share the read-only catalog and index.
* ``vector="sync"`` / ``"async"``: a `gymnasium.vector.SyncVectorEnv` / `AsyncVectorEnv` (subprocesses). A slot
  that finishes is reset alone (``options["reset_mask"]``) with its next episode's seed and options; slots with no
  work left are stepped with their last action and their output discarded (and reset again if they end).

Trajectories come back (and are written) in episode order, whatever the mode and the number of copies.
Each turn stores the observation the agent acted on, its action and the env's answer. Stored `info` dicts drop the
keys in `drop_info_keys` (by default the privileged `oracle` and the bulky `structured` / `valid_actions`);
the pre-action state key (`info["anchor"]`, used by GiGPO) is kept in `turn.extra["anchor"]`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shopsim.errors import ConfigError
from shopsim.trajectory import Trajectory, Turn

DEFAULT_DROP_INFO = ("oracle", "structured", "valid_actions")


@dataclass(frozen=True)
class EpisodeSpec:
    index: int
    task_id: Any
    seed: int
    group_id: int
    options: dict


def episode_seed(agent_seed: int, index: int) -> int:
    """The seed of episode `index`'s own sampling stream (`agents.base.Agent.seed_episode`) in a collect whose agent
    seed is `agent_seed`: a function of the pair only, so the episode samples the same whichever process, worker or
    batch runs it. SeedSequence mixes the two, so nearby seeds and indices give unrelated streams."""
    entropy = [int(agent_seed) & 0xFFFFFFFFFFFFFFFF, int(index)]  # SeedSequence takes non-negative ints only
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1)  # fits manual_seed's int64


class EpisodePlan(Sequence):
    """The ordered episodes `collect` runs (`plan_episodes`), computed on demand: its memory does not grow with the
    number of episodes, and ``plan[i]`` is what the i-th entry of the whole list would be. A slice is a list of
    specs (shards and worker ranges are bounded, and a list pickles without the options callable)."""

    def __init__(self, n_groups: int, group_size: int, *, tasks: Sequence | None, seeds: Sequence[int] | None,
                 seed: int, split: str | None, reset_options: dict | Callable[[int, int], dict] | None) -> None:
        self.n_groups, self.group_size = n_groups, group_size
        self._tasks, self._seeds, self._seed, self._split = tasks, seeds, seed, split
        self._options = reset_options

    def __len__(self) -> int:
        return self.n_groups * self.group_size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._spec(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        k = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= k < n:
            raise IndexError(f"episode {i} of a plan of {n}")
        return self._spec(k)

    def __iter__(self) -> Iterator[EpisodeSpec]:
        return (self._spec(k) for k in range(len(self)))

    def _spec(self, index: int) -> EpisodeSpec:
        g = index // self.group_size
        s = int(self._seeds[g]) if self._seeds is not None else self._seed + g
        opts = self._options(index, g) if callable(self._options) else dict(self._options or {})
        if self._split is not None:
            opts.setdefault("split", self._split)
        task = self._tasks[g] if self._tasks is not None else None
        if task is not None:
            opts["task_id"] = task
        return EpisodeSpec(index, task, s, g, opts)


def plan_episodes(*, episodes: int | None = None, tasks: Sequence | None = None, seeds: Sequence[int] | None = None,
                  seed: int = 0, group_size: int = 1, split: str | None = "train",
                  reset_options: dict | Callable[[int, int], dict] | None = None) -> EpisodePlan:
    """The ordered episodes that `collect` runs (see module docstring), as a lazy `EpisodePlan`."""
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}")
    if tasks is not None:
        tasks = list(tasks)
        n_groups = len(tasks) if episodes is None else episodes
        if n_groups > len(tasks):
            raise ConfigError(f"episodes={episodes} but only {len(tasks)} tasks given")
    elif episodes is not None:
        n_groups = episodes
    elif seeds is not None:
        n_groups = len(seeds)
    else:
        raise ConfigError("give episodes=N, tasks=[...] or seeds=[...]")
    if n_groups < 1:
        raise ConfigError(f"need at least one episode, got {n_groups}")
    if seeds is not None and len(seeds) < n_groups:
        raise ConfigError(f"{len(seeds)} seeds for {n_groups} episodes; give one seed per episode (group)")
    return EpisodePlan(n_groups, group_size, tasks=tasks, seeds=seeds, seed=seed, split=split,
                       reset_options=reset_options)


class _InProcessPool:
    def __init__(self, env_fns: list[Callable[[], Any]]):
        self.envs = [fn() for fn in env_fns]

    def reset(self, slot: int, seed: int, options: dict):
        return self.envs[slot].reset(seed=seed, options=options)

    def step(self, actions: dict[int, Any]) -> dict[int, tuple]:
        return {slot: self.envs[slot].step(a) for slot, a in actions.items()}

    def release(self, slot: int) -> None:
        """The slot has no more work (nothing to do in-process: it is simply not stepped again)."""

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _VectorPool:
    """Adapter over a gymnasium VectorEnv that lets each slot be reset alone with its own seed/options."""

    def __init__(self, env_fns: list[Callable[[], Any]], mode: str):
        import gymnasium

        # Autoreset is disabled: the pool resets every finished slot itself, with the next episode's seed/options,
        # or (no work left) with a throw-away reset so it is never stepped past its end.
        disabled = gymnasium.vector.AutoresetMode.DISABLED
        self.vec: gymnasium.vector.SyncVectorEnv | gymnasium.vector.AsyncVectorEnv
        if mode == "sync":
            self.vec = gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=disabled)
        else:  # shared memory mangles Text observations (fixed-width buffers), so pipe them instead
            self.vec = gymnasium.vector.AsyncVectorEnv(env_fns, shared_memory=False, autoreset_mode=disabled)
        self.n = len(env_fns)
        self.last_actions: list[Any] = [None] * self.n
        self.started = False

    @staticmethod
    def _slot_info(infos: dict, i: int) -> dict:
        """Undo the vector env's info batching (dict of arrays with `_key` masks, nested for dict values)."""
        out = {}
        for k, v in infos.items():
            if k.startswith("_"):
                continue
            mask = infos.get("_" + k)
            if mask is not None and not mask[i]:
                continue
            value = _VectorPool._slot_info(v, i) if isinstance(v, dict) else v[i]
            out[k] = value.item() if isinstance(value, np.generic) else value
        return out

    @staticmethod
    def _slot_obs(obs, i: int):
        if isinstance(obs, dict):
            return {k: _VectorPool._slot_obs(v, i) for k, v in obs.items()}
        return obs[i]

    def reset(self, slot: int, seed: int, options: dict):
        if not self.started:  # the vector env needs one full reset before masked ones
            self.vec.reset(seed=[seed] * self.n)
            self.started = True
        mask = np.zeros(self.n, dtype=bool)
        mask[slot] = True
        seeds: list[int | None] = [None] * self.n
        seeds[slot] = seed
        obs, infos = self.vec.reset(seed=seeds, options={**options, "reset_mask": mask})
        return self._slot_obs(obs, slot), self._slot_info(infos, slot)

    def step(self, actions: dict[int, Any]) -> dict[int, tuple]:
        for slot, a in actions.items():
            self.last_actions[slot] = a
        per_slot = [self.last_actions[i] if self.last_actions[i] is not None
                    else self.vec.single_action_space.sample() for i in range(self.n)]
        batch: Any = per_slot  # the vector env's batch: strings stay a list, arrays (or dicts of them) are stacked
        if isinstance(per_slot[0], dict):
            batch = {k: np.stack([np.asarray(b[k]) for b in per_slot]) for k in per_slot[0]}
        elif not isinstance(per_slot[0], str):
            batch = np.stack([np.asarray(b) for b in per_slot])
        obs, rew, term, trunc, infos = self.vec.step(batch)
        for i in range(self.n):
            if i not in actions and (term[i] or trunc[i]):  # an idle slot's throw-away episode ended
                self.release(i)
        return {slot: (self._slot_obs(obs, slot), float(rew[slot]), bool(term[slot]), bool(trunc[slot]),
                       self._slot_info(infos, slot)) for slot in actions}

    def release(self, slot: int) -> None:
        """The slot has no more work; a vector env steps every slot, so give it a live throw-away episode."""
        self.reset(slot, 0, {})

    def close(self) -> None:
        self.vec.close()


def _env_factory(env_id: str, env_kwargs: dict) -> Callable[[], Any]:
    def make():
        import gymnasium

        import shopsim.envs  # noqa: F401  (registers ids in subprocesses too)

        return gymnasium.make(env_id, **env_kwargs)

    return make


def collect(env_id: str, agent, *, episodes: int | None = None, seeds: Sequence[int] | None = None,
            tasks: Sequence | None = None, split: str | None = "train", group_size: int = 1, num_envs: int = 8,
            seed: int = 0, env_kwargs: dict | None = None,
            reset_options: dict | Callable[[int, int], dict] | None = None, writer=None, progress: bool = True,
            vector: str | None = None, env_fns: Iterable[Callable[[], Any]] | None = None,
            max_steps: int = 10_000, drop_info_keys: Sequence[str] = DEFAULT_DROP_INFO,
            agent_seed: int | None = None, specs: Sequence[EpisodeSpec] | None = None,
            stream_seed: int | None = None, keep: bool = True,
            on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Run `agent` for the planned episodes and return their trajectories in episode order.

    `env_fns` (callables making an env) replaces `env_id`'s `gymnasium.make` when given (e.g. wrapped envs).
    `agent_seed` seeds the agent's sampling (default: `seed`): `agent.reset(num_slots, agent_seed)`, and each
    episode's own stream, ``agent.seed_episode(slot, episode_seed(stream_seed, index))`` with `stream_seed`
    defaulting to the agent seed. `specs` runs these episodes of a `plan_episodes` plan instead of planning (a
    slice of a larger plan: `shopsim.distributed` runs one shard of episodes this way, with the whole plan's
    `stream_seed`; the trajectories keep the plan's episode indices as `traj_id` and its group ids).

    Trajectories go to `writer` and `on_episode(trajectory)` in episode order as soon as their predecessors are done.
    ``keep=False`` then drops them (the result is empty), so memory stays bounded however many episodes run: the
    plan is lazy, and only episodes that finished ahead of an earlier one are held.
    """
    from shopsim.envs import check_env_id, is_pettingzoo

    if env_fns is None:
        check_env_id(env_id)
    if env_fns is None and is_pettingzoo(env_id):
        raise ConfigError(f"{env_id} is a PettingZoo env; use its own training loop (shopsim train), not collect")
    if vector not in (None, "sync", "async"):
        raise ConfigError(f"vector={vector!r}; choose None (in-process), 'sync' or 'async'")
    if specs is None:
        specs = plan_episodes(episodes=episodes, tasks=tasks, seeds=seeds, seed=seed, group_size=group_size,
                              split=split, reset_options=reset_options)
    elif not specs:
        raise ConfigError("specs is empty; give at least one episode")
    n_specs = len(specs)
    n_slots = max(1, min(int(num_envs), n_specs))
    fns = list(env_fns) if env_fns is not None else [_env_factory(env_id, dict(env_kwargs or {}))] * n_slots
    if len(fns) < n_slots:
        fns = (fns * n_slots)[:n_slots]
    fns = fns[:n_slots]
    pool = _InProcessPool(fns) if vector is None else _VectorPool(fns, vector)
    agent_name = getattr(agent, "name", type(agent).__name__)
    agent_seed = seed if agent_seed is None else agent_seed
    stream_seed = agent_seed if stream_seed is None else stream_seed
    agent.reset(n_slots, agent_seed)
    seed_episode = getattr(agent, "seed_episode", None)  # duck-typed agents without the Agent base may lack it
    drop = set(drop_info_keys)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_specs, desc=f"rollout {env_id} [{agent_name}]", unit="ep", leave=False)

    results: dict[int, Trajectory] = {}
    kept: list[Trajectory] = []
    next_to_emit = 0
    queue = enumerate(specs)  # (place in the output order, spec), drawn lazily
    pending = next(queue, None)
    active: dict[int, dict] = {}  # slot -> {"place", "spec", "traj", "obs", "info", "steps"}
    # `results` and `next_to_emit` count places in `specs` (episode indices when the whole plan runs)

    def start(slot: int) -> None:
        nonlocal pending
        assert pending is not None  # called only while specs remain
        place, spec = pending
        pending = next(queue, None)
        obs, info = pool.reset(slot, spec.seed, dict(spec.options))
        traj = Trajectory(env_id=env_id, task_id=info.get("task_id", spec.task_id),
                          split=info.get("split", spec.options.get("split")), seed=spec.seed, group_id=spec.group_id,
                          strategy=info.get("strategy", spec.options.get("strategy")),
                          traj_id=spec.index, agent=agent_name,
                          meta={k: info[k] for k in ("family",) if k in info})
        active[slot] = {"place": place, "spec": spec, "traj": traj, "obs": obs, "info": info, "steps": 0}
        if seed_episode is not None:
            seed_episode(slot, episode_seed(stream_seed, spec.index))
        agent.begin_episode(slot, obs, info)

    def emit_ready() -> None:
        nonlocal next_to_emit
        while next_to_emit in results:
            traj = results.pop(next_to_emit)
            if writer is not None:
                writer.write(traj)
            if on_episode is not None:
                on_episode(traj)
            if keep:
                kept.append(traj)
            next_to_emit += 1

    try:
        for slot in range(n_slots):
            if pending is not None:
                start(slot)
        while active:
            slots = sorted(active)
            decisions = agent.act([active[s]["obs"] for s in slots], [active[s]["info"] for s in slots], slots)
            if len(decisions) != len(slots):
                raise RuntimeError(f"agent {agent_name} returned {len(decisions)} decisions for {len(slots)} slots")
            outs = pool.step({s: d.action for s, d in zip(slots, decisions, strict=False)})
            for s, d in zip(slots, decisions, strict=False):
                state = active[s]
                obs, rew, term, trunc, info = outs[s]
                state["steps"] += 1
                if state["steps"] >= max_steps and not (term or trunc):
                    trunc = True
                extra = dict(d.extra)
                if "anchor" in state["info"]:
                    extra.setdefault("anchor", state["info"]["anchor"])
                turn = Turn(observation=state["obs"], action=d.action, reward=float(rew), terminated=bool(term),
                            truncated=bool(trunc), info={k: v for k, v in info.items() if k not in drop},
                            prompt_ids=d.prompt_ids, action_ids=d.action_ids, action_logprobs=d.action_logprobs,
                            hidden=d.hidden, value=d.value, logprob=d.logprob, extra=extra)
                state["traj"].append(turn)
                agent.observe(s, float(rew), bool(term), bool(trunc), info)
                if term or trunc:
                    results[state["place"]] = state["traj"]
                    del active[s]
                    if bar is not None:
                        bar.update(1)
                    if pending is not None:
                        start(s)
                    else:
                        pool.release(s)
                else:
                    state["obs"], state["info"] = obs, info
            emit_ready()
        emit_ready()
    finally:
        pool.close()
        if bar is not None:
            bar.close()
    return kept


class RunningSummary:
    """`summarize` over trajectories seen one at a time (``collect(..., on_episode=summary.add, keep=False)``), in
    constant memory; `result()` equals `summarize` of the same trajectories up to float rounding."""

    _KEYS = ("score", "return", "turns", "tokens")

    def __init__(self) -> None:
        self.episodes = 0
        self.successes = 0.0
        self.success_defined = False
        self.sums = dict.fromkeys(self._KEYS, 0.0)

    def add(self, traj: Trajectory) -> None:
        self.episodes += 1
        self.successes += float(traj.success)
        self.success_defined = self.success_defined or "success" in traj.final_info
        for key, value in zip(self._KEYS, (traj.score, traj.total_reward, traj.num_turns, traj.num_generated_tokens),
                              strict=True):
            self.sums[key] += float(value)

    def result(self) -> dict[str, float | None]:
        if not self.episodes:
            return {"episodes": 0}
        n = self.episodes
        return {"episodes": n, "success": self.successes / n if self.success_defined else None,
                **{k: v / n for k, v in self.sums.items()}}


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float | None]:
    """Mean success, score, return, turns and generated tokens of a list of trajectories.

    ``success`` is None when no episode's final info reports one: a cost env (Replenishment) has no notion of
    success, and a rate of 0 would read as a failing policy.
    """
    if not trajectories:
        return {"episodes": 0}
    arr = lambda f: np.array([f(t) for t in trajectories], dtype=float)  # noqa: E731
    defined = any("success" in t.final_info for t in trajectories)
    return {
        "episodes": len(trajectories),
        "success": float(arr(lambda t: t.success).mean()) if defined else None,
        "score": float(arr(lambda t: t.score).mean()),
        "return": float(arr(lambda t: t.total_reward).mean()),
        "turns": float(arr(lambda t: t.num_turns).mean()),
        "tokens": float(arr(lambda t: t.num_generated_tokens).mean()),
    }
