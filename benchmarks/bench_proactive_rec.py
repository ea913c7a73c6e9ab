"""Throughput of ProactiveRec-v0: batched whole-path scorer vs the per-step Gymnasium loop (same run, same paths).

    .venv/bin/python -m benchmarks.bench_proactive_rec [--quick] [--catalog-size 5000] [--threads 1]

Prints absolute steps/s (one step = one recommended item scored: IoI, IoR, CTR) for both and their ratio, for the
SASRec and the analytic simulator. Target (issue 4): >= 20k steps/s batched.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from shopsim.envs.proactive_rec import STOP, PathScorer, ProactiveRecEnv, get_world


def _paths(world, b, rng):
    items = rng.integers(world.n_items, size=(b, 10))
    lengths = rng.integers(1, 11, size=b)
    return np.where(np.arange(10)[None] < lengths[:, None], items, STOP)


def bench(simulator: str, size: int, batch: int, episodes: int, reps: int) -> dict:
    t0 = time.perf_counter()
    world = get_world(size, 0, simulator)
    build = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    hist, tgt = world.tasks(np.arange(batch))
    paths = _paths(world, batch, rng)
    scorer = PathScorer(world)
    scorer.score(hist[:8], tgt[:8], paths[:8])  # warm-up
    t0 = time.perf_counter()
    for _ in range(reps):
        s = scorer.score(hist, tgt, paths)
    dt = (time.perf_counter() - t0) / reps
    batched = float(s.step_mask.sum()) / dt
    env = ProactiveRecEnv(catalog_size=size, simulator=simulator, action_mode="item", world=world)
    steps = 0
    t0 = time.perf_counter()
    for e in range(episodes):
        env.reset(seed=e, options={"task_id": e})
        for item in paths[e]:
            _, _, term, _, _ = env.step(int(item) if item >= 0 else env.n)
            steps += int(item >= 0)
            if term:
                break
    per_step = steps / (time.perf_counter() - t0)
    return {"simulator": simulator, "build_s": build, "batched_steps_s": batched, "env_steps_s": per_step,
            "ratio": batched / per_step}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller batch and fewer repetitions")
    ap.add_argument("--catalog-size", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    batch, episodes, reps = (1024, 50, 2) if args.quick else (4096, 200, 5)
    print(f"ProactiveRec-v0 scorer benchmark: catalog {args.catalog_size}, batch {batch}, threads {args.threads}")
    print(f"{'simulator':10s} {'world build s':>13s} {'batched steps/s':>16s} {'env steps/s':>12s} {'ratio':>7s}")
    for sim in ("sasrec", "analytic"):
        r = bench(sim, args.catalog_size, batch, episodes, reps)
        print(f"{sim:10s} {r['build_s']:13.2f} {r['batched_steps_s']:16,.0f} {r['env_steps_s']:12,.0f} "
              f"{r['ratio']:7.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
