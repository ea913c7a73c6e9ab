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

from collections.abc import Callable, Iterable, Sequence
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


def plan_episodes(*, episodes: int | None = None, tasks: Sequence | None = None, seeds: Sequence[int] | None = None,
                  seed: int = 0, group_size: int = 1, split: str | None = "train",
                  reset_options: dict | Callable[[int, int], dict] | None = None) -> list[EpisodeSpec]:
    """The ordered list of episodes that `collect` runs (see module docstring)."""
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
    specs = []
    for g in range(n_groups):
        s = int(seeds[g]) if seeds is not None else seed + g
        for r in range(group_size):
            index = g * group_size + r
            opts = reset_options(index, g) if callable(reset_options) else dict(reset_options or {})
            if split is not None:
                opts.setdefault("split", split)
            task = tasks[g] if tasks is not None else None
            if task is not None:
                opts["task_id"] = task
            specs.append(EpisodeSpec(index, task, s, g, opts))
    return specs


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
        mode_kw = {"autoreset_mode": gymnasium.vector.AutoresetMode.DISABLED}
        if mode == "sync":
            self.vec = gymnasium.vector.SyncVectorEnv(env_fns, **mode_kw)
        else:  # shared memory mangles Text observations (fixed-width buffers), so pipe them instead
            self.vec = gymnasium.vector.AsyncVectorEnv(env_fns, shared_memory=False, **mode_kw)
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
        seeds = [None] * self.n
        seeds[slot] = seed
        obs, infos = self.vec.reset(seed=seeds, options={**options, "reset_mask": mask})
        return self._slot_obs(obs, slot), self._slot_info(infos, slot)

    def step(self, actions: dict[int, Any]) -> dict[int, tuple]:
        for slot, a in actions.items():
            self.last_actions[slot] = a
        batch = [self.last_actions[i] if self.last_actions[i] is not None else self.vec.single_action_space.sample()
                 for i in range(self.n)]
        if isinstance(batch[0], dict):
            batch = {k: np.stack([np.asarray(b[k]) for b in batch]) for k in batch[0]}
        elif not isinstance(batch[0], str):
            batch = np.stack([np.asarray(b) for b in batch])
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
            agent_seed: int | None = None, specs: Sequence[EpisodeSpec] | None = None) -> list[Trajectory]:
    """Run `agent` for the planned episodes and return their trajectories in episode order.

    `env_fns` (callables making an env) replaces `env_id`'s `gymnasium.make` when given (e.g. wrapped envs).
    `agent_seed` seeds the agent's sampling (default: `seed`). `specs` runs these episodes of a `plan_episodes`
    plan instead of planning (a slice of a larger plan: `shopsim.distributed` runs one shard of episodes this way;
    the trajectories keep the plan's episode indices as `traj_id` and its group ids).
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
    specs = list(specs)
    position = {spec.index: k for k, spec in enumerate(specs)}  # episode index -> place in the output order
    n_slots = max(1, min(int(num_envs), len(specs)))
    fns = list(env_fns) if env_fns is not None else [_env_factory(env_id, dict(env_kwargs or {}))] * n_slots
    if len(fns) < n_slots:
        fns = (fns * n_slots)[:n_slots]
    fns = fns[:n_slots]
    pool = _InProcessPool(fns) if vector is None else _VectorPool(fns, vector)
    agent_name = getattr(agent, "name", type(agent).__name__)
    agent.reset(n_slots, seed if agent_seed is None else agent_seed)
    drop = set(drop_info_keys)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(specs), desc=f"rollout {env_id} [{agent_name}]", unit="ep", leave=False)

    results: dict[int, Trajectory] = {}
    next_to_emit = 0
    queue = list(reversed(specs))
    active: dict[int, dict] = {}  # slot -> {"spec", "traj", "obs", "info", "steps"}
    # `results` and `next_to_emit` count places in `specs` (episode indices when the whole plan runs)

    def start(slot: int) -> None:
        spec = queue.pop()
        obs, info = pool.reset(slot, spec.seed, dict(spec.options))
        traj = Trajectory(env_id=env_id, task_id=info.get("task_id", spec.task_id),
                          split=info.get("split", spec.options.get("split")), seed=spec.seed, group_id=spec.group_id,
                          strategy=info.get("strategy", spec.options.get("strategy")),
                          traj_id=spec.index, agent=agent_name,
                          meta={k: info[k] for k in ("family",) if k in info})
        active[slot] = {"spec": spec, "traj": traj, "obs": obs, "info": info, "steps": 0}
        agent.begin_episode(slot, obs, info)

    def emit_ready() -> None:
        nonlocal next_to_emit
        while next_to_emit in results:
            if writer is not None:
                writer.write(results[next_to_emit])
            next_to_emit += 1

    try:
        for slot in range(n_slots):
            if queue:
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
                    results[position[state["spec"].index]] = state["traj"]
                    del active[s]
                    if bar is not None:
                        bar.update(1)
                    if queue:
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
    return [results[i] for i in range(len(specs))]


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
