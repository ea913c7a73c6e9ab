"""Ray rollouts and sharded datasets (`shopsim.distributed`) on a 2-CPU local Ray cluster."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray  # in the dev extra that `make test` installs

from shopsim.datasets import LEGACY_MANIFEST, MANIFEST, read_episodes, read_metadata, read_trajectories, read_turns
from shopsim.distributed import RayPool, _run_range, default_shard_episodes, rollout_to_shards, shard_ranges
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
    from shopsim.app.cli import main

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
    manifest = json.loads((tmp_path / "ray" / MANIFEST).read_text())
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


def test_pandas_reads_a_sharded_folder_and_an_old_folder_still_resumes(tmp_path):
    """The README says pandas reads the output: a folder holding ``manifest.json`` made pyarrow's discovery fail
    ("Could not read schema"); the manifest's leading underscore hides it. A folder written before the rename
    (``manifest.json``) is still read and resumed, and its old manifest replaced."""
    import pandas as pd

    out = tmp_path / "d"
    _count_shards(out, CountRandom())
    parts = sorted(out.glob("part-*.parquet"))
    assert len(parts) == 6 and (out / MANIFEST).is_file() and not (out / LEGACY_MANIFEST).exists()
    whole = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    got = pd.read_parquet(out)
    assert len(got) == len(whole) > 0
    pd.testing.assert_frame_equal(got, whole)
    assert list(got["traj_id"]) == list(read_turns(out)["traj_id"])
    before = read_turns(out)
    (out / MANIFEST).rename(out / LEGACY_MANIFEST)  # a folder from before the rename
    assert read_turns(out).equals(before)
    assert len(read_trajectories(out)) == 12
    again = _count_shards(out, CountRandom())
    assert (again.ran, again.skipped) == (0, 6)
    assert (out / MANIFEST).is_file() and not (out / LEGACY_MANIFEST).exists()
    pd.testing.assert_frame_equal(pd.read_parquet(out), whole)


class _ElsewherePool:
    """A pool whose worker runs on another machine: it writes each shard at the path it is given, but in its own
    file system (here: under `root`), where the driver cannot see it."""

    def __init__(self, root: Path):
        self.root = root

    def put_agent(self, agent):
        return "key", [agent]

    def map(self, jobs, on_done):
        for j, (_key, box, env_id, specs, kwargs, seed, out, meta) in enumerate(jobs):
            elsewhere = self.root / Path(out).relative_to(Path(out).anchor)
            elsewhere.parent.mkdir(parents=True, exist_ok=True)
            on_done(j, _run_range(env_id, box[0], specs, kwargs, seed, str(elsewhere), meta))


def test_a_shard_the_driver_cannot_see_fails_the_run_instead_of_completing_it(tmp_path):
    """Workers that wrote their shards where the driver does not read them (another machine's disk, another working
    directory) gave a manifest marked complete and a success message; now the run stops with what to change."""
    out = tmp_path / "d"
    with pytest.raises(ShopsimError, match=r"part-00000.parquet \(and 5 more shards\), but this process .* does not "
                                           r"find it there; --out must be a folder every Ray node writes"):
        _count_shards(out, CountRandom(), pool=_ElsewherePool(tmp_path / "other-node"))
    assert len(list((tmp_path / "other-node").rglob("part-*.parquet"))) == 6  # the worker did write them
    assert not (out / MANIFEST).exists() or not json.loads((out / MANIFEST).read_text())["complete"]
    with pytest.raises(DatasetError):
        read_turns(out)


def test_relative_out_lands_in_the_drivers_folder_whatever_the_workers_cwd(cluster, tmp_path, monkeypatch):
    """`shopsim rollout --ray-address ... --out D` handed the workers the relative path D, so they wrote D/part-*
    under their own working directory (where `ray start` ran) while the driver marked its empty D complete."""
    worker_cwd, user = tmp_path / "where-ray-started", tmp_path / "user"
    worker_cwd.mkdir()
    user.mkdir()
    monkeypatch.chdir(user)
    with RayPool(2) as pool:
        ray.get([a.__ray_call__.remote(lambda _self, d: os.chdir(d), str(worker_cwd)) for a in pool.actors])
        assert set(ray.get([a.__ray_call__.remote(lambda _self: os.getcwd()) for a in pool.actors])) == {
            str(worker_cwd)}
        run = _count_shards("D", CountExpert(), pool)
    assert run.ran == 6 and run.manifest["complete"]
    assert sorted(p.name for p in (user / "D").glob("part-*.parquet")) == [f"part-{k:05d}.parquet" for k in range(6)]
    assert not (worker_cwd / "D").exists()
    ref = collect(COUNT_ID, CountExpert(), env_fns=[make_count_env] * 2, num_envs=2, episodes=12, seed=3,
                  progress=False)
    assert [t.to_dict() for t in read_trajectories("D")] == [t.to_dict() for t in ref]


def test_pool_collect_matches_collect(cluster):
    """The evaluator's collect hook: explicit tasks and seeds, results in episode order."""
    kw = {"tasks": [1, 2, 3, 4, 5], "seeds": [9, 8, 7, 6, 5], "env_fns": [make_count_env], "num_envs": 2}
    ref = collect(COUNT_ID, CountExpert(), progress=False, **kw)
    with RayPool(2) as pool:
        got = pool.collect(COUNT_ID, CountExpert(), **kw)
    assert [t.to_dict() for t in got] == [t.to_dict() for t in ref]


def test_cli_eval_workers_gives_the_metrics_of_a_single_process_eval(cluster, tmp_path):
    """`shopsim eval --workers 2` runs the protocol's episodes (and the reference's) on the pool: same metrics."""
    from shopsim.app.cli import main

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


def test_a_failed_connect_leaves_no_empty_output_folder(no_local_ray, tmp_path, capsys):
    """`--ray-address` to a cluster that does not answer stopped the command but left the folders made for --out."""
    from shopsim.app.cli import main

    dead = ["--ray-address", "127.0.0.1:1", "--no-progress"]
    assert main(["rollout", "--env", REPLENISHMENT, "--agent", "s_S", "--episodes", "2", *dead,
                 "--out", str(tmp_path / "new" / "D")]) == 2
    assert main(["eval", "--env", REPLENISHMENT, "--agent", "s_S", "--tasks", "1", *dead,
                 "--out", str(tmp_path / "results" / "x.json")]) == 2
    assert capsys.readouterr().err.count("nothing listens there") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()  # a folder that was there before the command stays
    assert main(["rollout", "--env", REPLENISHMENT, "--agent", "s_S", "--episodes", "2", *dead,
                 "--out", str(tmp_path / "kept")]) == 2
    assert (tmp_path / "kept").is_dir()
