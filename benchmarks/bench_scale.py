"""Scale-out figures: Ray rollout throughput and the driver's memory while writing a sharded dataset.

    python -m benchmarks.bench_scale [--quick] [--json PATH] [--results DIR]
    python -m benchmarks.bench_scale --results docs/results    # the committed table

* **Throughput**: Replenishment-v0 episodes/s of the (s, S) agent written to Parquet, by the single-process runner
  (`shopsim.rollout.collect` into one `DatasetWriter` file, what ``shopsim rollout`` does without ``--workers``)
  and by `shopsim.distributed.rollout_to_shards` on a local Ray cluster with 1 and 2 workers, all in the same run;
  ratios are against the single-process rate; each runner's best of 3 runs (all runs are in the JSON). Starting
  Ray and its actors (and one warm-up shard of one episode per actor: imports, env construction) is timed
  separately and not counted.
* **Driver memory**: the peak resident memory (``ru_maxrss``) of this process after each shard while it writes
  `--memory-episodes` Replenishment episodes as shards itself (no Ray: the worst case for the driver, which runs
  and writes every episode). Flat means the peak after the first 10% of the shards equals the peak at the end;
  the default is 1M episodes, ``--quick`` writes fewer (same shard size) to show the same flatness.

Ray starts its worker processes at niceness 15. On a machine that other jobs load, that alone makes a worker much
slower than a normal-priority process, so this benchmark starts its Ray cluster with ``RAY_worker_niceness=0``
(Ray's own setting): the single-process reference, the driver and the workers compete for the cores on equal terms.

With ``--results DIR`` the table goes to ``DIR/bench_scale.md`` and the figures to ``DIR/bench_scale.json``
(``--results docs/results``: the committed table; generated, command, commit, seeds and wall time are in it); without
it no table is written.
Throughput on a shared machine is noisy: the figures are what this run measured, with the load it had.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

#: the table's file name in the ``--results`` folder (its figures: the same stem, .json)
TABLE = "bench_scale.md"
ENV_ID = "shopsim/Replenishment-v0"
#: Ray's setting for the niceness of its worker processes (default 15)
RAY_WORKER_NICENESS = "RAY_worker_niceness"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def throughput(episodes: int, seed: int, shard_episodes: int, tmp: Path, repeat: int = 3) -> dict:
    import agents
    from shopsim.datasets import DatasetWriter
    from shopsim.distributed import RayPool, rollout_to_shards
    from shopsim.rollout import collect, plan_episodes

    agent = agents.make("s_S", ENV_ID)
    rows = {}
    collect(ENV_ID, agent, episodes=2, seed=seed + episodes, progress=False)  # the same warm-up in this process
    walls = []
    for r in range(repeat):
        t0 = time.perf_counter()
        with DatasetWriter(tmp / f"single{r}.parquet") as writer:
            collect(ENV_ID, agent, episodes=episodes, seed=seed, writer=writer, progress=False)
        walls.append(time.perf_counter() - t0)
    rows["single process"] = {"workers": 0, "wall_s": min(walls), "walls_s": walls, "startup_s": 0.0}
    specs = plan_episodes(episodes=episodes, seed=seed)
    for workers in (1, 2):
        t0 = time.perf_counter()
        with RayPool(workers) as pool:
            # warm-up, counted as start-up: every actor imports shopsim and pyarrow and builds its envs once (one
            # one-episode shard each, of episodes outside the measured plan)
            warm = plan_episodes(episodes=workers, seed=seed + episodes)
            rollout_to_shards(ENV_ID, agent, tmp / f"warm{workers}", specs=warm, metadata={"warm-up": workers},
                              shard_episodes=1, pool=pool, agent_seed=seed, progress=False)
            startup = time.perf_counter() - t0
            walls = []
            for r in range(repeat):
                t1 = time.perf_counter()
                rollout_to_shards(ENV_ID, agent, tmp / f"ray{workers}-{r}", specs=specs, metadata={"bench": workers},
                                  shard_episodes=shard_episodes, pool=pool, agent_seed=seed, progress=False)
                walls.append(time.perf_counter() - t1)
            rows[f"Ray, {workers} worker{'s' * (workers > 1)}"] = {"workers": workers, "wall_s": min(walls),
                                                                  "walls_s": walls, "startup_s": startup}
    base = episodes / rows["single process"]["wall_s"]
    for row in rows.values():
        row["episodes_per_s"] = episodes / row["wall_s"]
        row["ratio"] = row["episodes_per_s"] / base
    return {"episodes": episodes, "shard_episodes": shard_episodes, "repeat": repeat, "rows": rows}


def driver_memory(episodes: int, seed: int, shard_episodes: int, tmp: Path) -> dict:
    import agents
    from shopsim.distributed import rollout_to_shards
    from shopsim.rollout import plan_episodes

    agent = agents.make("s_S", ENV_ID)
    samples = []  # (episodes done, peak RSS MB, current RSS MB)

    def sample(rec: dict) -> None:
        samples.append((rec["stop"], _peak_rss_mb(), _rss_mb()))

    specs = plan_episodes(episodes=episodes, seed=seed)
    start_peak = _peak_rss_mb()
    t0 = time.perf_counter()
    run = rollout_to_shards(ENV_ID, agent, tmp / "memory", specs=specs, metadata={"bench": "memory"},
                            shard_episodes=shard_episodes, agent_seed=seed, progress=False, on_shard=sample)
    wall = time.perf_counter() - t0
    n = len(samples)
    at10 = samples[max(0, -(-n // 10) - 1)]
    turns = sum(r["turns"] for r in run.manifest["shards"])
    size = sum(f.stat().st_size for f in (tmp / "memory").glob("part-*.parquet"))
    return {"episodes": episodes, "shard_episodes": shard_episodes, "shards": n, "turns": turns,
            "dataset_mb": size / 2**20, "wall_s": wall, "peak_rss_before_mb": start_peak,
            "peak_rss_at_10pct_mb": at10[1], "episodes_at_10pct": at10[0], "peak_rss_at_100pct_mb": samples[-1][1],
            "growth_10_to_100_pct": samples[-1][1] / at10[1] - 1.0,
            "samples": [{"episodes": e, "peak_rss_mb": p, "rss_mb": r} for e, p, r in samples]}


def write_table(res: dict, path: Path) -> None:
    from shopsim.paths import write_text_atomic

    tp, mem = res["throughput"], res["memory"]
    lines = [
        "# Scale-out: Ray rollout throughput and the driver's memory with sharded datasets", "",
        "Generated by `benchmarks/bench_scale.py`; do not edit by hand.", "",
        f"- command: `{res['command']}`",
        f"- commit: `{res['commit']}`",
        f"- machine: {res['machine']}",
        f"- env / agent: {ENV_ID}, (s, S); seeds {res['seed']}..{res['seed'] + tp['episodes'] - 1} (throughput), "
        f"{res['seed']}..{res['seed'] + mem['episodes'] - 1} (memory)",
        f"- wall time of the benchmark: {res['wall_s']:.0f} s",
        "- the machine is shared (2 cores, other jobs running): throughput figures are noisy; a worker count above "
        "the free cores cannot speed up", "",
        f"## Throughput ({tp['episodes']} episodes written to Parquet; shards of {tp['shard_episodes']}; "
        f"best of {tp['repeat']} runs, all listed in the JSON)", "",
        "| runner | episodes/s | ratio to single process | wall (s) | Ray + actor start (s, not counted) |",
        "|---|---|---|---|---|",
    ]
    for name, row in tp["rows"].items():
        lines.append(f"| {name} | {row['episodes_per_s']:.1f} | {row['ratio']:.2f}x | {row['wall_s']:.1f} | "
                     f"{row['startup_s']:.1f} |")
    lines += [
        "", f"## Driver memory writing {mem['episodes']:,} episodes as {mem['shards']} shards in one process", "",
        f"{mem['turns']:,} turns, {mem['dataset_mb']:.1f} MB of Parquet, {mem['wall_s']:.0f} s.", "",
        "| point | episodes written | peak RSS (MB) |", "|---|---|---|",
        f"| before | 0 | {mem['peak_rss_before_mb']:.0f} |",
        f"| 10% of the shards | {mem['episodes_at_10pct']:,} | {mem['peak_rss_at_10pct_mb']:.0f} |",
        f"| 100% | {mem['episodes']:,} | {mem['peak_rss_at_100pct_mb']:.0f} |", "",
        f"**Peak growth from 10% to 100%: {100 * mem['growth_10_to_100_pct']:+.1f}%** "
        f"({mem['episodes'] // max(1, mem['episodes_at_10pct'])}x the episodes).", "",
    ]
    write_text_atomic(path, "\n".join(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer episodes (the same measurements)")
    p.add_argument("--episodes", type=int, default=None, help="throughput episodes (default 96 quick, 1024 full)")
    p.add_argument("--memory-episodes", type=int, default=None,
                   help="episodes of the memory run (default 400 quick, 1,000,000 full)")
    p.add_argument("--shard-episodes", type=int, default=None,
                   help="episodes per shard of the memory run (default 40 quick, 1024 full)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument("--results", default=None, metavar="DIR",
                   help=f"write the table DIR/{TABLE} and its .json (the committed one: docs/results; default: none)")
    a = p.parse_args(argv)
    import ray
    import torch

    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import write_text_atomic

    torch.set_num_threads(1)
    # one local cluster for both pools, its workers at this process's priority (module docstring)
    os.environ[RAY_WORKER_NICENESS] = "0"
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    niceness = os.nice(0)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    episodes = a.episodes or (96 if a.quick else 1024)
    mem_episodes = a.memory_episodes or (400 if a.quick else 1_000_000)
    mem_shard = a.shard_episodes or (40 if a.quick else 1024)
    with tempfile.TemporaryDirectory() as tmp:
        mem = driver_memory(mem_episodes, a.seed, mem_shard, Path(tmp))  # first: before Ray grows this process
        tp = throughput(episodes, a.seed, max(1, episodes // 4), Path(tmp))
    res = {"command": "python -m benchmarks.bench_scale " + " ".join(sys.argv[1:] if argv is None else argv),
           "commit": git_commit(), "seed": a.seed,
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, 1 torch thread, "
                      f"niceness {niceness} (the driver and Ray's workers), load average "
                      f"{load:.1f} at the start",
           "throughput": tp, "memory": mem, "wall_s": time.perf_counter() - t0}
    for name, row in tp["rows"].items():
        print(f"{name:>18}: {row['episodes_per_s']:7.1f} episodes/s  ({row['ratio']:.2f}x single process, "
              f"{row['wall_s']:.1f}s; start {row['startup_s']:.1f}s)")
    print(f"driver peak RSS writing {mem['episodes']} episodes in {mem['shards']} shards: "
          f"{mem['peak_rss_at_10pct_mb']:.0f} MB at 10%, {mem['peak_rss_at_100pct_mb']:.0f} MB at 100% "
          f"({100 * mem['growth_10_to_100_pct']:+.1f}%)")
    if a.json:
        write_text_atomic(a.json, json.dumps(res, indent=2, default=str))
    if a.results:
        table = Path(a.results) / TABLE
        write_table(res, table)
        write_text_atomic(table.with_suffix(".json"), json.dumps(res, indent=2, default=str))
        print(f"wrote {table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
