"""`shopsim rollout`: run an agent on an env and write a Parquet dataset of its trajectories."""

from __future__ import annotations

import argparse

from shopsim.commands import positive_int, writable_output


def add_parser(sub) -> None:
    p = sub.add_parser("rollout", help="run an agent for N episodes and write a Parquet dataset",
                       description="Run an agent on an env and stream its trajectories to a Parquet file.")
    p.add_argument("--env", required=True, help="env id, e.g. shopsim/Shopping-v0")
    p.add_argument("--agent", required=True, help="agent name (expert, random, lm, ...) or module:Class")
    p.add_argument("--checkpoint", default=None, help="load the agent from a checkpoint folder instead")
    p.add_argument("--episodes", type=positive_int, required=True, help="number of episodes (tasks)")
    p.add_argument("--group-size", type=positive_int, default=1, help="rollouts per task sharing the initial state")
    p.add_argument("--seed", type=int, default=0, help="base seed: episode i uses seed+i")
    p.add_argument("--split", default="train", choices=["train", "dev", "test"])
    p.add_argument("--num-envs", type=positive_int, default=8, help="env copies stepped together")
    p.add_argument("--vector", choices=["sync", "async"], default=None, help="use a gymnasium vector env")
    p.add_argument("--out", required=True, help="output Parquet file")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import agents
    from shopsim.datasets import DatasetWriter
    from shopsim.envs import check_env_id
    from shopsim.rollout import collect, summarize

    check_env_id(args.env)
    out = writable_output(args.out)
    agent = (agents.load_checkpoint(args.checkpoint, env_id=args.env) if args.checkpoint
             else agents.make(args.agent, args.env))
    meta = {"env_id": args.env, "agent": args.agent, "checkpoint": args.checkpoint, "seed": args.seed,
            "split": args.split, "episodes": args.episodes, "group_size": args.group_size}
    with DatasetWriter(out, metadata=meta) as writer:
        trajs = collect(args.env, agent, episodes=args.episodes, seed=args.seed, split=args.split,
                        group_size=args.group_size, num_envs=args.num_envs, vector=args.vector, writer=writer,
                        progress=not args.no_progress)
    s = summarize(trajs)
    print(f"wrote {out} ({writer.num_episodes} episodes, {writer.num_turns} turns): success {s['success']:.3f}, "
          f"score {s['score']:.3f}, mean turns {s['turns']:.1f}")
    return 0
