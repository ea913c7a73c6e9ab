"""`shopsim rollout`: run an agent on an env and write a Parquet dataset of its trajectories."""

from __future__ import annotations

import argparse
from pathlib import Path

from shopsim.app.commands import env_help, positive_int, writable_output


def add_parser(sub) -> None:
    from shopsim.envs.shopping.env import STRATEGIES
    from shopsim.envs.shopping.tasks import ALL_FAMILIES as FAMILIES

    p = sub.add_parser("rollout", help="run an agent for N episodes and write a Parquet dataset",
                       description="Run an agent on an env and stream its trajectories to a Parquet file. A "
                                   "checkpoint (--checkpoint, or the shipped SFT model behind --agent lm) runs on "
                                   "the env options its manifest records, e.g. the observation rendering it was "
                                   "trained on.")
    p.add_argument("--env", required=True, help=env_help())
    p.add_argument("--agent", default=None, help="agent name (expert, random, lm, ...) or module:Class")
    p.add_argument("--model", metavar="DIR", default=None,
                   help="instead of --agent: any local causal-LM folder acting through its own chat template "
                        "(text envs; see `shopsim eval --model`), sampling at --temperature")
    p.add_argument("--checkpoint", default=None, help="load the agent from a checkpoint folder instead")
    p.add_argument("--episodes", type=positive_int, required=True, help="number of episodes (tasks)")
    p.add_argument("--group-size", type=positive_int, default=1, help="rollouts per task sharing the initial state")
    p.add_argument("--seed", type=int, default=0, help="base seed: episode i uses seed+i")
    p.add_argument("--split", default="train", choices=["train", "dev", "test"])
    p.add_argument("--family", nargs="+", default=None, metavar="FAMILY",
                   help=f"Shopping task family ({', '.join(FAMILIES)}); several alternate episode by episode. "
                        "Default: the families the checkpoint was trained on if its manifest records them (the "
                        "shipped SFT model behind --agent lm: find_and_buy), else the env's mix of all four")
    p.add_argument("--strategy", nargs="+", default=None, metavar="STRATEGY",
                   help=f"Shopping strategy instruction given at reset ({', '.join(STRATEGIES)}); several alternate "
                        "group by group. Recorded per episode (the viewer's strategy column). Default: none")
    p.add_argument("--num-envs", type=positive_int, default=8, help="env copies stepped together")
    p.add_argument("--vector", choices=["sync", "async"], default=None, help="use a gymnasium vector env")
    p.add_argument("--out", required=True,
                   help="output Parquet file; a folder of Parquet shards with --workers, --ray-address or "
                        "--shard-episodes (rerunning the same command finishes an interrupted folder)")
    add_model_arguments(p)
    add_scale_arguments(p)
    p.add_argument("--shard-episodes", type=positive_int, default=None,
                   help="episodes per shard of a sharded dataset (default: a 16th of the episodes, at most 1024); "
                        "without --workers the shards run in this process")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def add_scale_arguments(p) -> None:
    """--workers / --ray-address (`shopsim.distributed.RayPool`), shared by rollout, eval and bench."""
    p.add_argument("--workers", type=positive_int, default=None,
                   help="run episode ranges on N Ray workers of a local cluster (needs shopsim[ray]; docs/scale.md)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="run on an existing Ray cluster ('auto', or HOST:PORT of `ray start --head`); --workers "
                        "then defaults to the cluster's CPUs")
    p.add_argument("--ray-timeout", type=float, default=None, metavar="SECONDS",
                   help="give up joining the --ray-address cluster after this long (default 30)")


def add_model_arguments(p) -> None:
    """The options of ``--model DIR`` (`agents.lm.pretrained.model_agent`), shared by eval and rollout."""
    g = p.add_argument_group("--model options")
    g.add_argument("--device", default="cpu", help="torch device of the model, e.g. cpu, cuda, cuda:1")
    g.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens generated per turn at most")
    g.add_argument("--actions", choices=["auto", "tools", "text"], default="auto",
                   help="how the model is told the actions: tool schemas through its chat template, the text "
                        "grammar in the system prompt, or auto (tools where the template renders them)")
    g.add_argument("--context-mode", choices=["concat", "window"], default="concat",
                   help="concat: the whole episode as one chat; window: the system prompt, the last two turns and "
                        "the current page")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --decoding sample)")


def model_agent_from_args(args: argparse.Namespace, env_id: str, *, greedy: bool):
    """The agent of ``--model DIR`` and what a results file records about it."""
    from agents.lm.pretrained import model_agent, model_record

    agent = model_agent(args.model, env_id, actions=args.actions, context_mode=args.context_mode,
                        max_new_tokens=args.max_new_tokens, device=args.device, greedy=greedy,
                        temperature=args.temperature)
    record = {**model_record(args.model), "actions": agent.actions,
              "context_mode": args.context_mode, "max_new_tokens": args.max_new_tokens}
    if args.temperature != 1.0:
        record["temperature"] = args.temperature
    return agent, record


def ray_pool(args: argparse.Namespace):
    """The `RayPool` that --workers / --ray-address ask for, or None."""
    if args.workers is None and args.ray_address is None:
        return None
    from shopsim.distributed import DEFAULT_CONNECT_TIMEOUT_S, RayPool
    from shopsim.errors import ConfigError

    timeout = DEFAULT_CONNECT_TIMEOUT_S if args.ray_timeout is None else args.ray_timeout
    if not timeout > 0:
        raise ConfigError(f"--ray-timeout must be > 0 seconds, got {args.ray_timeout}")
    return RayPool(args.workers, args.ray_address, connect_timeout_s=timeout)


def _check_shopping_choice(values: list[str] | None, env_id: str, flag: str, allowed, what: tuple[str, str],
                           purpose: str) -> list[str] | None:
    """`values` of a Shopping-only option (--family, --strategy), checked against `allowed`; None if not given.
    `what`: the option's noun, singular and plural."""
    from shopsim.envs import family_of
    from shopsim.errors import ConfigError

    if values is None:
        return None
    if family_of(env_id) != "shopping":
        raise ConfigError(f"{flag} {purpose}; {env_id} has no {what[1]}, drop {flag}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ConfigError(f"{flag} {bad[0]!r} is not a Shopping {what[0]}; choose from {', '.join(allowed)}")
    return list(values)


def _checkpoint_dir(args: argparse.Namespace, agent) -> Path | None:
    """The checkpoint folder the agent was loaded from: --checkpoint, or the shipped SFT model `agents.make("lm")`
    loads when given no checkpoint."""
    if args.checkpoint:
        return Path(args.checkpoint)
    if getattr(agent, "checkpoint", None):
        return Path(agent.checkpoint)
    if args.agent == "lm":
        from agents.lm.agent import default_checkpoint_dir

        return default_checkpoint_dir()
    return None


def run(args: argparse.Namespace) -> int:
    import agents
    from agents.registry import CHECKPOINT_MANIFEST, manifest_env_kwargs, manifest_families
    from shopsim.datasets import DatasetWriter
    from shopsim.envs import check_env_id, check_env_options, family_of
    from shopsim.rollout import RunningSummary, collect

    check_env_id(args.env)
    if (args.agent is None) == (args.model is None) or (args.model and args.checkpoint):
        from shopsim.errors import ConfigError

        raise ConfigError("give either --agent NAME (with --checkpoint DIR to load one) or --model DIR")
    from shopsim.envs.shopping.env import STRATEGIES
    from shopsim.envs.shopping.tasks import ALL_FAMILIES

    families = _check_shopping_choice(args.family, args.env, "--family", ALL_FAMILIES, ("task family", "task families"),
                                      "chooses Shopping tasks")
    strategies = _check_shopping_choice(args.strategy, args.env, "--strategy", STRATEGIES, ("strategy", "strategies"),
                                        "instructs the Shopping agent")
    sharded = bool(args.workers or args.ray_address or args.shard_episodes)
    out = writable_output(args.out, is_dir=sharded)  # a sharded dataset is a folder (an existing one resumes)
    model_info = None
    if args.model:
        agent, model_info = model_agent_from_args(args, args.env, greedy=False)
    else:
        agent = (agents.load_checkpoint(args.checkpoint, env_id=args.env) if args.checkpoint
                 else agents.make(args.agent, args.env))
    ckpt = _checkpoint_dir(args, agent)
    has_manifest = ckpt is not None and (ckpt / CHECKPOINT_MANIFEST).is_file()
    env_kwargs = manifest_env_kwargs(ckpt) if has_manifest else {}  # the env the policy was trained on
    if env_kwargs:
        assert ckpt is not None  # env_kwargs come from its manifest
        check_env_options(args.env, env_kwargs, what=f"{ckpt / CHECKPOINT_MANIFEST} env_kwargs")
    if families is None and has_manifest and family_of(args.env) == "shopping":
        families = manifest_families(ckpt)
        if families:
            print(f"note: {' and '.join(families)} tasks, the families {ckpt} was trained on (--family to change)")
    options = None
    if families or strategies:
        def options(index: int, group: int) -> dict:
            out = {"family": families[group % len(families)]} if families else {}
            if strategies:
                out["strategy"] = strategies[group % len(strategies)]
            return out
    meta = {"env_id": args.env, "agent": args.agent, "checkpoint": args.checkpoint, "seed": args.seed,
            "split": args.split, "episodes": args.episodes, "group_size": args.group_size, "families": families,
            "strategies": strategies, "env_kwargs": env_kwargs}
    if model_info is not None:
        meta["model"] = model_info
    if sharded:
        return _run_sharded(args, agent, meta, env_kwargs, options)
    summary = RunningSummary()
    with DatasetWriter(out, metadata=meta) as writer:  # streamed: memory does not grow with --episodes
        collect(args.env, agent, episodes=args.episodes, seed=args.seed, split=args.split,
                group_size=args.group_size, num_envs=args.num_envs, vector=args.vector, writer=writer,
                env_kwargs=env_kwargs, reset_options=options, progress=not args.no_progress, keep=False,
                on_episode=summary.add)
    s = summary.result()
    success = "" if s["success"] is None else f"success {s['success']:.3f}, "
    print(f"wrote {out} ({writer.num_episodes} episodes, {writer.num_turns} turns): {success}"
          f"score {s['score']:.3f}, mean turns {s['turns']:.1f}")
    return 0


def _run_sharded(args: argparse.Namespace, agent, meta: dict, env_kwargs: dict, options) -> int:
    """The sharded path of `run`: the same episodes, written as `shopsim.distributed` shards into the folder --out."""
    from shopsim.distributed import default_shard_episodes, rollout_to_shards
    from shopsim.rollout import plan_episodes

    specs = plan_episodes(episodes=args.episodes, seed=args.seed, split=args.split, group_size=args.group_size,
                          reset_options=options)
    shard_episodes = args.shard_episodes or default_shard_episodes(len(specs))
    pool = ray_pool(args)
    try:
        run = rollout_to_shards(args.env, agent, args.out, specs=specs, metadata=meta, shard_episodes=shard_episodes,
                                pool=pool, agent_seed=args.seed, progress=not args.no_progress,
                                num_envs=args.num_envs, vector=args.vector, env_kwargs=env_kwargs)
    finally:
        if pool is not None:
            pool.close()
    s = run.summary
    success = "" if s.get("success") is None else f"success {s['success']:.3f}, "
    turns = sum(r["turns"] for r in run.manifest["shards"])
    resumed = f", {run.skipped} already there" if run.skipped else ""
    print(f"wrote {args.out} ({run.manifest['num_shards']} shards: {run.ran} run now{resumed}; {s['episodes']} "
          f"episodes, {turns} turns): {success}score {s['score']:.3f}, mean turns {s['turns']:.1f}")
    return 0
