"""Dataset writing/reading throughput and rollout-runner overhead.

    python -m benchmarks.bench_datasets [--quick]

Prints turns/s for `shopsim.datasets.DatasetWriter` (streaming, atomic, zstd) on language-agent turns (observation
text, action, 64 prompt ids, 16 action ids and log-probs, a small info dict), the same rows written by
`pandas.DataFrame.to_parquet` in one go and as JSON lines (references measured in the same run), the streaming
read-back rate, and the rollout runner's per-step overhead against a bare `env.step` loop on a toy env.
Target: at least 50k turns/s to Parquet.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def make_trajectories(n_traj: int, turns: int, seed: int = 0):
    from shopsim.trajectory import Trajectory, Turn

    rng = np.random.default_rng(seed)
    obs = "Instruction: find waterproof hiking boots, size 9, under $80. [results] B0001 Trail boot $59.99 " * 3
    out = []
    for i in range(n_traj):
        t = Trajectory(env_id="shopsim/Shopping-v0", task_id=i, split="train", seed=i, group_id=i // 8, traj_id=i,
                       agent="lm")
        for k in range(turns):
            t.append(Turn(obs, f"click[B{k:04d}]", float(k == turns - 1), k == turns - 1, False,
                          {"page": "item", "invalid_action": None, "score": 0.5},
                          prompt_ids=rng.integers(0, 4000, 64).tolist(), action_ids=rng.integers(0, 4000, 16).tolist(),
                          action_logprobs=(-rng.random(16)).tolist()))
        out.append(t)
    return out


def timed(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    from shopsim.datasets import iter_trajectories, write_dataset

    n_traj, turns = (2_000, 10) if args.quick else (10_000, 10)
    trajs = make_trajectories(n_traj, turns)
    n_turns = n_traj * turns
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t_ours = timed(lambda: write_dataset(tmp / "ours.parquet", trajs, {"bench": True}))

        def pandas_ref():
            rows = [{"traj_id": t.traj_id, "turn": k, **turn.to_dict()}
                    for t in trajs for k, turn in enumerate(t.turns)]
            for r in rows:
                r["info"] = json.dumps(r["info"])
                r["hidden"] = r["extra"] = None
            pd.DataFrame(rows).to_parquet(tmp / "pandas.parquet")

        def jsonl_ref():
            with open(tmp / "ref.jsonl", "w") as f:
                for t in trajs:
                    f.write(json.dumps(t.to_dict()) + "\n")

        t_pandas = timed(pandas_ref)
        t_jsonl = timed(jsonl_ref)
        t_read = timed(lambda: sum(1 for _ in iter_trajectories(tmp / "ours.parquet")), repeat=1)
        size = (tmp / "ours.parquet").stat().st_size

    print(f"dataset write: {n_turns} turns ({n_traj} trajectories x {turns} turns)")
    print(f"  shopsim DatasetWriter : {n_turns / t_ours:>10,.0f} turns/s  ({t_ours * 1e3:.0f} ms, {size / 1e6:.1f} MB)")
    print(f"  pandas.to_parquet ref : {n_turns / t_pandas:>10,.0f} turns/s  (ours/ref = {t_pandas / t_ours:.2f}x)")
    print(f"  JSON lines ref        : {n_turns / t_jsonl:>10,.0f} turns/s  (ours/ref = {t_jsonl / t_ours:.2f}x)")
    print(f"  streaming read-back   : {n_turns / t_read:>10,.0f} turns/s")

    # rollout-runner overhead on a toy env
    from shopsim.rollout import collect
    from shopsim.testing import COUNT_ID, CountEnv, CountExpert, make_count_env

    episodes = 500 if args.quick else 3000
    env, agent = CountEnv(), CountExpert()
    agent.reset(1, 0)
    t0 = time.perf_counter()
    steps = 0
    for ep in range(episodes):
        obs, info = env.reset(seed=ep)
        done = False
        while not done:
            obs, r, term, trunc, info = env.step(agent.act_one(0, obs, info))
            steps += 1
            done = term or trunc
    t_bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    trajs = collect(COUNT_ID, CountExpert(), env_fns=[make_count_env] * 8, num_envs=8, episodes=episodes,
                    progress=False)
    t_run = time.perf_counter() - t0
    steps_run = sum(t.num_turns for t in trajs)
    print(f"rollout runner on a toy env ({episodes} episodes):")
    print(f"  bare env.step loop    : {steps / t_bare:>10,.0f} steps/s")
    print(f"  shopsim.rollout       : {steps_run / t_run:>10,.0f} steps/s  "
          f"(overhead {(t_run / steps_run - t_bare / steps) * 1e6:.1f} us/step)")


if __name__ == "__main__":
    main()
