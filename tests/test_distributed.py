"""Ray rollouts and sharded datasets (`shopsim.distributed`) on a 2-CPU local Ray cluster."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray  # in the dev extra that `make test` installs

from shopsim.datasets import read_episodes, read_metadata, read_trajectories, read_turns
from shopsim.distributed import RayPool, default_shard_episodes, rollout_to_shards, shard_ranges
from shopsim.errors import ConfigError, DatasetError, ShopsimError
from shopsim.rollout import collect, plan_episodes
from shopsim.testing import COUNT_ID, CountExpert, CountRandom, make_count_env

REPLENISHMENT = "shopsim/Replenishment-v0"


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


@pytest.fixture
def epoch(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")


class KillOnce(CountExpert):
    """The count expert, except that the worker process running the shard whose agent seed is `kill_seed` exits
    (as a crashed or preempted worker would) the first time, leaving `marker` behind."""

    def __init__(self, kill_seed: int, marker: str):
        super().__init__()
        self.kill_seed, self.marker = kill_seed, marker

    def reset(self, num_slots, seed=None):
        if seed == self.kill_seed and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)
        super().reset(num_slots, seed)


def _count_shards(out, agent, pool=None, n=12, shard=2):
    return rollout_to_shards(COUNT_ID, agent, out, specs=plan_episodes(episodes=n, seed=3), metadata={"agent": "x"},
                             shard_episodes=shard, pool=pool, agent_seed=3, progress=False,
                             env_fns=[make_count_env] * 2, num_envs=2)


def test_shard_ranges_cover_the_plan_in_order():
    assert shard_ranges(7, 3) == [(0, 3), (3, 6), (6, 7)]
    # the default depends on the episode count only: 16 shards of a small run, at most 1024 episodes per shard
    assert [default_shard_episodes(n) for n in (5, 256, 1_000_000)] == [1, 16, 1024]
    with pytest.raises(ConfigError, match="shard_episodes"):
        shard_ranges(7, 0)


def test_cli_workers_gives_the_rows_of_a_single_process_run(cluster, epoch, tmp_path, capsys):
    """The issue's acceptance command, scaled down: --workers 2 writes the same rows as the run without it, and
    the shards are byte-identical to the same sharded run in one process."""
    from shopsim.cli import main

    common = ["rollout", "--env", REPLENISHMENT, "--agent", "s_S", "--episodes", "12", "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "one.parquet")]) == 0
    assert main([*common, "--workers", "2", "--shard-episodes", "4", "--out", str(tmp_path / "ray")]) == 0
    assert main([*common, "--shard-episodes", "4", "--out", str(tmp_path / "local")]) == 0
    single, sharded = read_turns(tmp_path / "one.parquet"), read_turns(tmp_path / "ray")
    assert len(single) == 12 * 100 and single.equals(sharded)
    assert list(read_episodes(tmp_path / "ray")["traj_id"]) == list(range(12))
    for k in range(3):
        name = f"part-{k:05d}.parquet"
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert manifest["complete"] and [s["start"] for s in manifest["shards"]] == [0, 4, 8]
    assert read_metadata(tmp_path / "ray")["num_shards"] == 3
    assert "3 shards: 3 run now" in capsys.readouterr().out
    assert main([*common, "--shard-episodes", "4", "--out", str(tmp_path / "local")]) == 0  # the same command again
    assert "0 run now, 3 already there" in capsys.readouterr().out


def test_killed_worker_loses_no_shard_and_rerun_finishes_only_the_missing(cluster, tmp_path):
    marker = str(tmp_path / "killed")
    out = tmp_path / "d"
    agent = KillOnce(kill_seed=3 + 6, marker=marker)  # the shard of episodes [6, 8)
    with RayPool(2) as pool, pytest.raises(ShopsimError, match="rerun the same command"):
        _count_shards(out, agent, pool)
    assert os.path.exists(marker)
    finished = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("part-*.parquet")}
    assert "part-00003.parquet" not in finished and finished  # the killed shard is missing, others were kept
    with pytest.raises(DatasetError, match="unfinished"):
        read_turns(out)
    with RayPool(2) as pool:
        run = _count_shards(out, agent, pool)
    assert run.skipped == len(finished) and run.ran == 6 - len(finished)
    for name, stamp in finished.items():  # finished shards were not redone
        p = out / name
        assert (p.stat().st_ino, p.stat().st_mtime_ns) == stamp
    ref = collect(COUNT_ID, CountExpert(), env_fns=[make_count_env] * 2, num_envs=2, episodes=12, seed=3,
                  progress=False)
    assert [t.to_dict() for t in read_trajectories(out)] == [t.to_dict() for t in ref]


def test_in_process_resume_and_a_different_run_is_refused(tmp_path):
    out = tmp_path / "d"
    first = _count_shards(out, CountRandom())
    again = _count_shards(out, CountRandom())
    assert (first.ran, again.ran, again.skipped) == (6, 0, 6)
    assert again.summary == first.summary
    import datasets

    hf = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert hf["traj_id"] == list(read_turns(out)["traj_id"])  # Hugging Face reads the shards as one split
    with pytest.raises(ConfigError, match="different run"):
        _count_shards(out, CountRandom(), n=10)


def test_pool_collect_matches_collect(cluster):
    """The evaluator's collect hook: explicit tasks and seeds, results in episode order."""
    kw = {"tasks": [1, 2, 3, 4, 5], "seeds": [9, 8, 7, 6, 5], "env_fns": [make_count_env], "num_envs": 2}
    ref = collect(COUNT_ID, CountExpert(), progress=False, **kw)
    with RayPool(2) as pool:
        got = pool.collect(COUNT_ID, CountExpert(), **kw)
    assert [t.to_dict() for t in got] == [t.to_dict() for t in ref]


def test_cli_eval_workers_gives_the_metrics_of_a_single_process_eval(cluster, tmp_path):
    """`shopsim eval --workers 2` runs the protocol's episodes (and the reference's) on the pool: same metrics."""
    from shopsim.cli import main

    common = ["eval", "--env", REPLENISHMENT, "--agent", "s_S", "--tasks", "3", "--seeds", "0", "1", "--tries", "1",
              "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "one.json")]) == 0
    assert main([*common, "--workers", "2", "--out", str(tmp_path / "ray.json")]) == 0
    one, two = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "ray.json"))
    assert one["metrics"] and one["metrics"] == two["metrics"]


def test_more_workers_than_cluster_cpus_is_refused(cluster):
    with pytest.raises(ConfigError, match="needs 3 CPUs"):
        RayPool(3)


@pytest.fixture
def no_local_ray(monkeypatch):
    """This process as if it had not joined a Ray cluster, and any in-process ``ray.init`` a test failure: the
    checks below must refuse before it (they run whether or not the module's cluster is up)."""

    def forbidden(*args, **kwargs):
        raise AssertionError("ray.init was called before the bad setting was refused")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", forbidden)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_more_workers_than_this_machines_cpus_is_refused_before_ray_starts(no_local_ray):
    """A local cluster declares the CPUs it is told, so the cluster check alone let 64 workers start on 2 cores."""
    from shopsim.distributed import usable_cpus

    n = usable_cpus() + 1
    with pytest.raises(ConfigError, match=f"--workers {n} needs {n} CPUs .* this process can use {n - 1}; lower"):
        RayPool(n)


def _probe_children() -> list:
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if "ray.init" in " ".join(p.cmdline())]


def test_ray_address_with_nothing_listening_is_refused_at_once(no_local_ray):
    import time

    t = time.monotonic()
    with pytest.raises(ConfigError, match="127.0.0.1:1: nothing listens there"):
        RayPool(address="127.0.0.1:1")
    assert time.monotonic() - t < 10
    with pytest.raises(ConfigError, match="write HOST:PORT"):
        RayPool(address="not an address")


def test_ray_address_that_never_answers_times_out_leaving_no_process(no_local_ray):
    """A port that accepts but never speaks Ray kept `ray.init` retrying for minutes in a process that ignored
    SIGTERM; the join now gives up after the timeout and kills what it started."""
    import socket
    import time

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        t = time.monotonic()
        with pytest.raises(ConfigError, match="no Ray cluster answered within 3 s"):
            RayPool(address=f"127.0.0.1:{silent.getsockname()[1]}", connect_timeout_s=3)
        assert time.monotonic() - t < 20
    assert _probe_children() == []


def test_ray_address_auto_without_a_cluster_is_one_clean_error(no_local_ray, monkeypatch):
    """``auto`` on a machine without a cluster gave Ray's traceback. Ray's ``auto`` also joins any cluster process
    it finds running on the machine (another test session's local cluster), so the joining child here is shown
    none: the machine Ray sees has no cluster."""
    import shopsim.distributed as distributed

    hide = ("import ray._private.services as s; f = lambda: []; f.cache_clear = lambda: None; "
            "s.find_gcs_addresses = f; ")
    monkeypatch.setattr(distributed, "_JOIN_PROBE", hide + distributed._JOIN_PROBE)
    with pytest.raises(ConfigError, match="auto: no Ray cluster runs on this machine; start one with `ray start"):
        RayPool(address="auto")
    assert _probe_children() == []


def test_workers_run_torch_with_the_drivers_settings(cluster):
    """Workers take the driver's torch threads (up to their share of the CPUs), deterministic-algorithms mode,
    matmul precision and default dtype, so their forwards round as the driver's do."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with RayPool(1) as pool:  # one worker of a 2-CPU cluster: both CPUs are its share
            got = pool.ray.get(pool.actors[0].settings.remote())
        with RayPool(2) as pool:  # two: one each, whatever the driver uses
            capped = pool.ray.get(pool.actors[1].settings.remote())
    finally:
        torch.set_num_threads(threads)
    assert got == {"threads": 2, "deterministic": torch.are_deterministic_algorithms_enabled(),
                   "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                   "matmul_precision": torch.get_float32_matmul_precision(), "default_dtype": "float32"}
    assert got["deterministic"]  # tests/conftest.py turns it on in the driver; a fresh worker has it off
    assert capped == {**got, "threads": 1}
