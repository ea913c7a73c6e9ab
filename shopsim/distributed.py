"""Rollouts beyond one process: episode ranges on Ray actors, and sharded Parquet datasets (docs/scale.md).

Two entry points, both built on `shopsim.rollout.collect`:

* `rollout_to_shards` writes a planned list of episodes (`shopsim.rollout.plan_episodes`) as a **sharded dataset**:
  a folder of ``part-00000.parquet``, ``part-00001.parquet``... (shard k holds episodes
  ``[k * shard_episodes, (k + 1) * shard_episodes)`` in episode order) plus ``_manifest.json``. Each shard is one
  `shopsim.datasets.DatasetWriter` file, so it appears only once complete; its footer records the shard's range
  and the run's fingerprint. Rerunning the same command skips every shard already on disk and runs only the missing
  ranges, so a run whose worker (or driver) died resumes where it stopped. The manifest is rewritten (atomically)
  after every finished shard, and only after the driver found that shard's file where it reads it (the folder is
  made absolute before it reaches the workers, so a worker whose working directory differs from the driver's writes
  into the same folder); it says ``"complete": true`` once all are there. `shopsim.datasets` reads the folder as one
  dataset; ``pandas.read_parquet(FOLDER)`` (the manifest's leading underscore hides it from pyarrow) and Hugging
  Face ``datasets.load_dataset(FOLDER)`` read its Parquet files as one table, one split.
* `RayPool.collect` has `collect`'s signature and result: it splits the episodes into ranges, runs them on the
  pool's actors and returns the trajectories in episode order (the evaluator's ``collect=`` hook). Inside
  ``with using(pool):`` every evaluation (`shopsim.leaderboard.evaluate`, hence ``shopsim eval`` and
  ``shopsim bench``) that is not given its own ``collect`` runs on the pool (`active_collect`).

Work runs on a `RayPool` of actors (one CPU each), each holding its own env copies and a copy of the agent (the
agent object is pickled once per call into Ray's object store). Without a pool, shards run in this process, one
after the other. The driver only ever holds one shard's bookkeeping, never the trajectories of the whole run, so its
memory does not grow with the number of episodes.

Trainers (`RayPool.collect` with ``broadcast_weights=True``, the LM trainers' ``rollout_workers``): the agent is
shipped to the object store once, and each call puts only its model's ``state_dict()`` (once, whatever the number
of workers); each worker loads it into its own copy of the agent before running its range.

Determinism: every episode is reset with its planned seed, so envs give the same episodes whichever worker runs
them. The agent of a shard starting at episode ``i`` is reset with ``agent_seed + i`` (``agent_seed + 0`` is what
a single-process `collect` uses), so an agent with one sampling stream gives samples that depend on the shard size
but not on the number of workers. Every episode's own stream (`shopsim.rollout.episode_seed`) is seeded from the
run's ``agent_seed`` and its index in the whole plan, so an agent that samples from per-episode streams (the LM
agent) gives the tokens of a single-process run whatever the shards and workers (log-probs equal up to float
rounding of differently batched forwards); an agent whose actions depend only on its episode (the scripted
experts, (s, S)) gives exactly the rows of a single-process run. With ``SOURCE_DATE_EPOCH`` set the files are
byte-identical from run to run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shopsim.datasets import LEGACY_MANIFEST, MANIFEST, manifest_file
from shopsim.errors import ConfigError, ShopsimError

MANIFEST_FORMAT = "shopsim-shards/1"
#: the most episodes a shard gets by default: big enough that per-shard overhead (an actor call, a Parquet footer) is
#: small, small enough that one lost shard is cheap to redo and a worker's memory stays low
DEFAULT_SHARD_EPISODES = 1024


def default_shard_episodes(n: int) -> int:
    """Episodes per shard when none is given: a 16th of the run (so a small run still spreads over the workers), at
    most `DEFAULT_SHARD_EPISODES`. It depends on the episode count only, never on the number of workers, so the
    shards (and a sampling agent's seeds) are the same whatever the cluster, and a rerun with other workers resumes."""
    return max(1, min(DEFAULT_SHARD_EPISODES, -(-n // 16)))


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def shard_ranges(n: int, shard_episodes: int) -> list[tuple[int, int]]:
    """[start, stop) episode ranges of `shard_episodes` episodes (the last may be shorter) covering `n` episodes."""
    if shard_episodes < 1:
        raise ConfigError(f"shard_episodes must be >= 1, got {shard_episodes}")
    return [(a, min(a + shard_episodes, n)) for a in range(0, n, shard_episodes)]


def _summary_sums(trajs) -> dict[str, Any]:
    """Sums behind `shopsim.rollout.summarize` (so shard summaries add up to the run's)."""
    from shopsim.rollout import summarize

    s = summarize(trajs)
    n = len(trajs)  # s["episodes"]
    return {"episodes": n, "turns": sum(t.num_turns for t in trajs),
            **{k: (None if (v := s[k]) is None else v * n) for k in ("success", "score", "return", "tokens")}}


def combine_summaries(shards: Sequence[dict]) -> dict[str, float | None]:
    """`shopsim.rollout.summarize`'s means from per-shard sums (``shard["summary"]``)."""
    n = sum(s["summary"]["episodes"] for s in shards)
    if not n:
        return {"episodes": 0}
    out: dict[str, float | None] = {"episodes": n}
    for key in ("success", "score", "return", "tokens"):
        vals = [s["summary"][key] for s in shards]
        out[key] = None if all(v is None for v in vals) else sum(v or 0.0 for v in vals) / n
    out["turns"] = sum(s["summary"]["turns"] for s in shards) / n
    return out


def _run_range(env_id: str, agent, specs, collect_kwargs: dict, agent_seed: int, out: str | None,
               metadata: dict | None):
    """Run one range of planned episodes; write them to `out` (a shard) and return its record, or return them."""
    from shopsim.rollout import collect

    # the range's agent reset seed moves with its start; per-episode streams keep the whole run's seed
    kwargs = {**collect_kwargs, "agent_seed": agent_seed + specs[0].index, "stream_seed": agent_seed, "specs": specs,
              "progress": False}
    if out is None:
        return collect(env_id, agent, **kwargs)
    import socket

    from shopsim.datasets import DatasetWriter

    with DatasetWriter(out, metadata=metadata) as writer:
        trajs = collect(env_id, agent, writer=writer, **kwargs)
    # "host": where it was written, for the driver's message if it cannot see the file (not kept in the manifest)
    return {"file": Path(out).name, "start": specs[0].index, "stop": specs[-1].index + 1, "turns": writer.num_turns,
            "summary": _summary_sums(trajs), "host": socket.gethostname()}


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a container's or ``taskset``'s share), else the
    machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity masks on this platform
        return os.cpu_count() or 1


def torch_settings(max_threads: int | None = None) -> dict[str, Any]:
    """This process's torch settings that decide a forward's float rounding: intra-op threads (at most
    `max_threads`), deterministic algorithms, float32 matmul precision and default dtype (`apply_torch_settings`
    gives a worker the same)."""
    import torch

    threads = torch.get_num_threads()
    return {"threads": max(1, min(threads, max_threads or threads)),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "default_dtype": str(torch.get_default_dtype()).removeprefix("torch.")}


def apply_torch_settings(settings: dict[str, Any]) -> None:
    """Set `torch_settings` (from another process) in this one."""
    import torch

    torch.set_num_threads(int(settings["threads"]))
    torch.use_deterministic_algorithms(bool(settings["deterministic"]),
                                       warn_only=bool(settings.get("deterministic_warn_only", False)))
    torch.set_float32_matmul_precision(settings["matmul_precision"])
    torch.set_default_dtype(getattr(torch, settings["default_dtype"]))


class ShardWorker:
    """A Ray actor body: runs episode ranges with its own env copies and a cached copy of the agent."""

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        # the driver's settings (`torch_settings`), so a forward rounds as it would in the driver
        apply_torch_settings(settings or {**torch_settings(), "threads": 1})
        self._agent: Any = None  # the deserialised agent of the last call (any agent: duck-typed)
        self._agent_key: str | None = None
        self._weights_key: str | None = None

    def pid(self) -> int:
        return os.getpid()

    def settings(self) -> dict[str, Any]:
        """The worker's `torch_settings` (what it applied)."""
        return torch_settings()

    def run(self, agent_key: str, agent_box: list, env_id: str, specs, collect_kwargs: dict, agent_seed: int,
            out: str | None = None, metadata: dict | None = None, weights: tuple[str, list] | None = None,
            with_stats: bool = False):
        """Run one range. `weights` = (key, [ref to a state dict]): load it into the agent's model first (once per
        key). `with_stats`: return ``(result, stats)`` with what the run added to the agent's numeric ``stats``."""
        import ray

        if agent_key != self._agent_key:  # a new agent (or new weights): deserialise it once per call of the driver
            self._agent, self._agent_key, self._weights_key = ray.get(agent_box[0]), agent_key, None
        if weights is not None and weights[0] != self._weights_key:
            self._agent.model.load_state_dict(ray.get(weights[1][0]))
            self._weights_key = weights[0]
        before = _numeric_stats(self._agent)
        result = _run_range(env_id, self._agent, specs, collect_kwargs, agent_seed, out, metadata)
        if not with_stats:
            return result
        after = _numeric_stats(self._agent)
        return result, {k: v - before.get(k, 0) for k, v in after.items()}


def _numeric_stats(agent) -> dict[str, float]:
    """The agent's numeric counters (the LM agent's ``stats``: turns, encoded tokens, timings)."""
    stats = getattr(agent, "stats", None)
    if not isinstance(stats, dict):
        return {}
    return {k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _import_ray(option: str = "--workers / --ray-address"):
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{option} need(s) Ray: pip install 'shopsim[ray]'") from None
    return ray


#: how long joining a cluster (--ray-address) may take before the command gives up (--ray-timeout)
DEFAULT_CONNECT_TIMEOUT_S = 30.0
#: joins the cluster at argv[1] in a child process, whose hang the parent can end (`_join_cluster`)
_JOIN_PROBE = ("import sys, ray; ray.init(address=sys.argv[1], logging_level='error', log_to_driver=False); "
               "print('joined', flush=True)")


def _split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``HOST:PORT`` or ``ray://HOST:PORT`` address; None for ``auto`` and other forms."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if sep and host and port.isdigit() else None


def _client_auth_env() -> dict[str, str]:
    """What a driver joining a cluster by address needs for Ray's token authentication: ``RAY_AUTH_MODE=token`` when
    the mode is unset and a token is available here (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
    ``~/.ray/auth_token``), else nothing.

    That is the rule `ray start --head` applies (Ray 2.60: token mode when a token exists, and any earlier local
    ``ray.init`` on the machine wrote one), but ``ray.init(address=HOST:PORT)`` skips it, so a driver joining such a
    head by address was refused (InvalidAuthToken). A token-mode driver also joins a head without authentication."""
    if os.environ.get("RAY_AUTH_MODE"):
        return {}  # the user's choice
    try:
        from ray._raylet import AuthenticationTokenLoader
    except ImportError:  # a Ray without token authentication
        return {}
    return {"RAY_AUTH_MODE": "token"} if AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True) else {}


def _use_auth_env(env: dict[str, str]) -> None:
    """Apply `_client_auth_env` to this process before it joins (Ray reads the mode from its cached config)."""
    if not env:
        return
    os.environ.update(env)
    from ray._raylet import Config

    Config.initialize("")  # re-read RAY_AUTH_MODE, as Ray's own `_enable_token_auth` does


def _join_cluster(ray, address: str, timeout_s: float) -> None:
    """``ray.init(address=...)`` that ends within about `timeout_s` with one `ConfigError` line if no cluster
    answers, leaving no process behind.

    ``ray.init`` itself retries a silent address for minutes inside Ray's C++ core, where the process ignores
    SIGTERM. So a ``HOST:PORT`` first gets a plain TCP connection (nothing listening is refused at once), then a
    child process joins the cluster under a deadline (its process group is killed when it passes); only after it
    joined does this process call ``ray.init``."""
    import signal
    import socket
    import subprocess
    import sys

    where = f"--ray-address {address}"
    hint = ("give the address that `ray start --head` printed (docs/scale.md), or --workers N for a local cluster "
            "without --ray-address")
    hostport = _split_address(address)
    if hostport is None and address != "auto":
        raise ConfigError(f"{where}: write HOST:PORT (e.g. 10.0.0.5:6379), ray://HOST:PORT or auto")
    if hostport is not None:
        try:
            socket.create_connection(hostport, timeout=min(5.0, timeout_s)).close()
        except socket.gaierror:
            raise ConfigError(f"{where}: unknown host {hostport[0]}; {hint}") from None
        except ConnectionRefusedError:
            raise ConfigError(f"{where}: nothing listens there (connection refused); {hint}") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot reach it ({exc.strerror or 'timed out'}); {hint}") from None
    auth = _client_auth_env()
    child = subprocess.Popen([sys.executable, "-c", _JOIN_PROBE, address], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True, env={**os.environ, **auth})
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # its own session: the child and anything it started
        child.communicate()
        raise ConfigError(f"{where}: no Ray cluster answered within {timeout_s:g} s; check the address and that "
                          "this machine can reach it (Ray's ports, docs/scale.md), or allow longer with "
                          "--ray-timeout") from None
    if child.returncode != 0 or "joined" not in out:
        errors = [ln.strip() for ln in err.splitlines() if "Error" in ln.split(":", 1)[0]]
        reason = errors[-1] if errors else f"exit status {child.returncode}"
        if "InvalidAuthToken" in err or "AuthenticationError" in err:
            have = "another token than the cluster's" if auth or os.environ.get("RAY_AUTH_MODE") == "token" else \
                "no token"
            raise ConfigError(f"{where}: the cluster uses token authentication and this process has {have}: give "
                              "it the head's token (`ray get-auth-token` there; RAY_AUTH_TOKEN=... or "
                              "~/.ray/auth_token here), or start every node and run this command with "
                              "RAY_AUTH_MODE=disabled (docs/scale.md)") from None
        if "Could not find any running Ray instance" in reason:
            raise ConfigError(f"{where}: no Ray cluster runs on this machine; start one with `ray start --head` "
                              "(docs/scale.md), or use --workers N for a local cluster") from None
        raise ConfigError(f"{where}: cannot join the Ray cluster ({reason[:300]}); {hint}") from None
    _use_auth_env(auth)
    ray.init(address=address, logging_level="warning")


class RayPool:
    """`workers` Ray actors (one CPU each) on a local cluster started here, or on the cluster at `address`.

    ``address=None, workers=N`` starts a new local Ray instance with N CPUs (beside any cluster already running on
    the machine) unless this process already joined one (then it is reused, e.g. a test's cluster); N may not
    exceed the CPUs this process can use (`usable_cpus`).
    ``address="auto"`` or ``"HOST:6379"`` joins a cluster started with ``ray start --head`` within
    `connect_timeout_s` (then ``workers`` defaults to the cluster's CPU count). Each worker runs torch with this
    process's settings (`torch_settings`), its threads capped at its share of the CPUs. Use as a context manager;
    `close` ends the actors (not the cluster). `option` names the setting in error messages (``--workers`` on the
    command line, ``rollout_workers`` in a trainer's config)."""

    def __init__(self, workers: int | None = None, address: str | None = None, *,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, option: str = "--workers") -> None:
        ray = _import_ray("--workers / --ray-address" if option == "--workers" else option)
        if workers is not None and workers < 1:
            raise ConfigError(f"{option} must be at least 1, got {workers}")
        if workers is None and address is None:
            raise ConfigError("give --workers N (a local Ray cluster) or --ray-address ADDR (an existing one)")
        machine = None  # the CPUs of a local cluster started here (it declares only one per worker)
        if not ray.is_initialized():
            if address is None:
                # a local cluster gets the CPUs it is told; told more than there are, it starts every worker and
                # they share the cores, so the run crawls (or waits on memory) instead of failing
                cpus = machine = usable_cpus()
                assert workers is not None  # checked above: without an address, workers is given
                if workers > cpus:
                    raise ConfigError(f"{option} {workers} needs {workers} CPUs (one per worker) but this process "
                                      f"can use {cpus}; lower {option} to {cpus} or fewer, or run on a Ray cluster "
                                      "with more CPUs (docs/scale.md)")
                # address="local": a new instance even while another cluster runs on the machine (`ray start`,
                # RAY_ADDRESS), which a plain ray.init would join and then refuse num_cpus for
                ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level="warning",
                         log_to_driver=True)
            else:
                _join_cluster(ray, address, connect_timeout_s)
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if workers is None:
            workers = max(1, cpus)
        elif workers > cpus:  # an actor that cannot get its CPU would wait for one forever
            raise ConfigError(f"{option} {workers} needs {workers} CPUs (one per worker) but the Ray cluster has "
                              f"{cpus}; lower {option} or add nodes (docs/scale.md)")
        self.ray = ray
        self.workers = workers
        # threads beyond a worker's share of the CPUs would only make the workers contend for cores
        self.torch_settings = torch_settings(max_threads=max(1, (machine or cpus) // workers))
        remote = ray.remote(num_cpus=1, max_restarts=0)(ShardWorker)
        self.actors = [remote.remote(self.torch_settings) for _ in range(workers)]
        self._calls = 0
        self._shipped: tuple | None = None  # (agent, key, box) of the agent whose weights `collect` broadcasts

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        self._shipped = None

    def put_agent(self, agent) -> tuple[str, list]:
        """The agent in the object store, boxed in a list so Ray passes the reference (not the value) to the actors,
        with a key that changes on every call (a trainer's agent has new weights each iteration)."""
        self._calls += 1
        return f"{id(self)}-{self._calls}", [self.ray.put(agent)]

    def put_weights(self, agent) -> tuple[tuple[str, list], str, list]:
        """Trainer path: ``(weights, key, box)``. The agent object goes to the object store on the first call (and
        again for another agent object); every call puts its model's current ``state_dict()`` once, for all
        workers, under a new key (`ShardWorker.run` loads it into its copy)."""
        if self._shipped is None or self._shipped[0] is not agent:
            self._shipped = (agent, *self.put_agent(agent))
        self._calls += 1
        state = {k: v.detach().cpu() for k, v in agent.model.state_dict().items()}
        return (f"{id(self)}-w{self._calls}", [self.ray.put(state)]), self._shipped[1], self._shipped[2]

    def map(self, jobs: Sequence[tuple], on_done: Callable[[int, Any], None] | None = None) -> list:
        """Run ``ShardWorker.run(*job)`` for every job, one at a time per actor, and return the results in job order.

        `on_done(k, result)` runs in the driver as each job finishes. A dead worker raises `ShopsimError` once the
        jobs still running elsewhere have finished (their results are kept by `on_done`)."""
        ray = self.ray
        todo = list(enumerate(jobs))[::-1]
        running: dict = {}  # object ref -> (job index, actor)
        results: dict[int, Any] = {}
        failure = None
        idle = list(self.actors)
        while todo or running:
            while idle and todo and failure is None:
                k, job = todo.pop()
                actor = idle.pop()
                running[actor.run.remote(*job)] = (k, actor)
            if not running:
                break
            done, _ = ray.wait(list(running), num_returns=1)
            k, actor = running.pop(done[0])
            try:
                results[k] = ray.get(done[0])
            except ray.exceptions.RayActorError as exc:
                failure = failure or exc
                continue
            idle.append(actor)
            if on_done is not None:
                on_done(k, results[k])
        if failure is not None:
            raise ShopsimError(f"a Ray worker died ({type(failure).__name__}); finished shards are kept: rerun the "
                               f"same command to run only the missing ones") from failure
        return [results[k] for k in range(len(jobs))]

    def collect(self, env_id: str, agent, *, episodes: int | None = None, seeds: Sequence[int] | None = None,
                tasks: Sequence | None = None, split: str | None = "train", group_size: int = 1, seed: int = 0,
                reset_options: dict | Callable | None = None, agent_seed: int | None = None,
                progress: bool = False, writer=None, broadcast_weights: bool = False,
                agent_stats: dict | None = None, **collect_kwargs) -> list:
        """`shopsim.rollout.collect` over the pool: the episodes split into one contiguous range per worker (whole
        groups), results in episode order (written to `writer` if given).

        `broadcast_weights` (trainers, whose agent changes only in its weights): ship the agent once and its model's
        state dict on each call (`put_weights`), instead of the whole agent on each call. `agent_stats` (a dict,
        e.g. the driver's ``agent.stats``): add to it what the workers' runs added to their agents' numeric stats,
        so counters read as after an in-process collect."""
        from shopsim.rollout import plan_episodes

        specs = plan_episodes(episodes=episodes, tasks=tasks, seeds=seeds, seed=seed, group_size=group_size,
                              split=split, reset_options=reset_options)
        n_groups = specs[-1].group_id + 1
        per = -(-n_groups // self.workers)
        ranges = [(g0 * group_size, min((g0 + per) * group_size, len(specs))) for g0 in range(0, n_groups, per)]
        weights = None
        if broadcast_weights:
            weights, key, box = self.put_weights(agent)
        else:
            key, box = self.put_agent(agent)
        kwargs = {"split": split, "group_size": group_size, "seed": seed, **collect_kwargs}
        base = seed if agent_seed is None else agent_seed
        with_stats = agent_stats is not None
        jobs = [(key, box, env_id, specs[a:b], kwargs, base, None, None, weights, with_stats) for a, b in ranges]
        results = self.map(jobs)
        if agent_stats is not None:  # with_stats
            for _, delta in results:
                for k, v in delta.items():
                    agent_stats[k] = agent_stats.get(k, 0) + v
            results = [chunk for chunk, _ in results]
        trajs = [t for chunk in results for t in chunk]
        if writer is not None:
            writer.write_all(trajs)
        return trajs


_ACTIVE: list[RayPool] = []


@contextlib.contextmanager
def using(pool: RayPool | None):
    """Within the block, `active_collect` is `pool.collect` (nothing changes for ``pool=None``)."""
    if pool is None:
        yield None
        return
    _ACTIVE.append(pool)
    try:
        yield pool
    finally:
        _ACTIVE.remove(pool)


def active_collect() -> Callable:
    """The rollout function evaluations use by default: the innermost `using` pool's, else `shopsim.rollout.collect`."""
    if _ACTIVE:
        return _ACTIVE[-1].collect
    from shopsim.rollout import collect

    return collect


# ---------------------------------------------------------------------- sharded datasets
def run_fingerprint(metadata: dict, n_episodes: int, shard_episodes: int) -> str:
    """What makes two runs the same run (the command's metadata, the plan's size and the shard size)."""
    from shopsim.trajectory import to_jsonable

    record = {"metadata": to_jsonable(metadata), "episodes": n_episodes, "shard_episodes": shard_episodes}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _shard_footer(path: Path) -> dict | None:
    """The ``shard`` record of a finished shard file (None if the file is not a shopsim shard)."""
    import pyarrow.parquet as pq

    from shopsim.datasets import METADATA_KEY

    try:
        meta = pq.read_schema(path).metadata or {}
        return json.loads(meta[METADATA_KEY]).get("shard")
    except (OSError, KeyError, ValueError):
        return None


def _record_from_file(path: Path, footer: dict) -> dict:
    """The manifest record of a shard finished by an earlier run (read back: a shard is small)."""
    from shopsim.datasets import read_trajectories

    trajs = read_trajectories(path)
    return {"file": path.name, "start": footer["start"], "stop": footer["stop"],
            "turns": sum(t.num_turns for t in trajs), "summary": _summary_sums(trajs)}


@dataclass
class ShardedRun:
    """What `rollout_to_shards` returns: the manifest it wrote, how many shards it ran now and the run's summary."""

    manifest: dict
    ran: int
    skipped: int
    summary: dict
    wall_s: float


def _write_manifest(out: Path, manifest: dict) -> None:
    from shopsim.paths import write_text_atomic

    write_text_atomic(out / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    # a folder from before the rename: its old manifest would now only stop pyarrow from reading the folder
    (out / LEGACY_MANIFEST).unlink(missing_ok=True)


def _missing_shard_error(out: Path, lost: list[tuple[str, str | None]]) -> ShopsimError:
    import socket

    name, host = lost[0]
    here = socket.gethostname()
    where = f"a worker on {host}" if host and host != here else "a worker"
    more = f" (and {len(lost) - 1} more shards)" if len(lost) > 1 else ""
    return ShopsimError(f"{where} wrote {out / name}{more}, but this process (on {here}) does not find it there; "
                        "--out must be a folder every Ray node writes at the same path (a shared file system, "
                        "docs/scale.md); the manifest is not marked complete")


def rollout_to_shards(env_id: str, agent, out: str | os.PathLike, *, specs: Sequence, metadata: dict,
                      shard_episodes: int | None = None, pool: RayPool | None = None,
                      agent_seed: int = 0, progress: bool = True, on_shard: Callable[[dict], None] | None = None,
                      **collect_kwargs) -> ShardedRun:
    """Write the episodes `specs` (a `plan_episodes` plan) as a sharded dataset in the folder `out`; see module
    docstring. `pool` runs the shards on Ray actors (else here, one after the other); `collect_kwargs` go to
    `shopsim.rollout.collect` (num_envs, env_kwargs, vector...); `on_shard(record)` runs in the driver after each
    shard is recorded (e.g. to sample memory)."""
    t0 = time.perf_counter()
    # absolute before it reaches a worker: a relative path would be taken from the worker's working directory (where
    # `ray start` ran), not the command's
    out = Path(out).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; a sharded dataset is a folder, give a folder path")
    out.mkdir(parents=True, exist_ok=True)
    specs = list(specs)
    shard_episodes = shard_episodes or default_shard_episodes(len(specs))
    ranges = shard_ranges(len(specs), shard_episodes)
    fingerprint = run_fingerprint(metadata, len(specs), shard_episodes)
    old = manifest_file(out)
    if old is not None:
        try:
            previous = json.loads(old.read_text()).get("run")
        except ValueError:
            previous = None
        if previous not in (None, fingerprint):
            raise ConfigError(f"{out} holds shards of a different run (other agent, seeds, episodes or shard size); "
                              f"choose another --out or delete {out}")
    done: dict[int, dict] = {}
    for k, (a, b) in enumerate(ranges):
        path = out / shard_name(k)
        if path.is_file():
            footer = _shard_footer(path)
            if not footer or footer.get("run") != fingerprint or (footer.get("start"), footer.get("stop")) != (a, b):
                raise ConfigError(f"{path} belongs to a different run; choose another --out or delete {out}")
            done[k] = _record_from_file(path, footer)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT, "run": fingerprint, "metadata": metadata, "episodes": len(specs),
        "shard_episodes": shard_episodes, "num_shards": len(ranges), "complete": False, "shards": []}

    lost: list[tuple[str, str | None]] = []  # shards a worker reported written that this process cannot see

    def record(k: int, rec: dict) -> None:
        host = rec.pop("host", None)
        footer = _shard_footer(out / rec["file"])
        if not footer or footer.get("run") != fingerprint or (footer.get("start"), footer.get("stop")) != ranges[k]:
            lost.append((rec["file"], host))
            return
        done[k] = rec
        manifest["shards"] = [done[i] for i in sorted(done)]
        manifest["complete"] = len(done) == len(ranges)
        _write_manifest(out, manifest)
        if bar is not None:
            bar.update(rec["stop"] - rec["start"])
        if on_shard is not None:
            on_shard(rec)

    skipped = len(done)
    todo = [k for k in range(len(ranges)) if k not in done]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(specs), initial=sum(b - a for k, (a, b) in enumerate(ranges) if k in done),
                   desc=f"rollout {env_id} -> {out}", unit="ep", leave=False)

    from shopsim.datasets import creation_time

    created = creation_time()  # the driver's (SOURCE_DATE_EPOCH as the driver sees it), not each worker's clock

    def job_meta(k: int) -> dict:
        a, b = ranges[k]
        # the footer names the shard and the run, so a shard whose manifest update was lost still counts on resume
        return {**metadata, "created": created,
                "shard": {"index": k, "start": a, "stop": b, "of": len(ranges), "run": fingerprint}}

    try:
        if pool is None:
            for k in todo:
                a, b = ranges[k]
                record(k, _run_range(env_id, agent, specs[a:b], collect_kwargs, agent_seed, str(out / shard_name(k)),
                                     job_meta(k)))
        else:
            key, box = pool.put_agent(agent)
            jobs = [(key, box, env_id, specs[ranges[k][0]:ranges[k][1]], collect_kwargs, agent_seed,
                     str(out / shard_name(k)), job_meta(k)) for k in todo]
            pool.map(jobs, on_done=lambda j, rec: record(todo[j], rec))
        if lost:
            raise _missing_shard_error(out, lost)
        if not todo:  # nothing to run: make sure the manifest lists what is there
            manifest["shards"] = [done[i] for i in sorted(done)]
            manifest["complete"] = True
            _write_manifest(out, manifest)
    finally:
        if bar is not None:
            bar.close()
    return ShardedRun(manifest=manifest, ran=len(todo), skipped=skipped, summary=combine_summaries(manifest["shards"]),
                      wall_s=time.perf_counter() - t0)
