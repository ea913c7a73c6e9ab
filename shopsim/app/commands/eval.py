"""`shopsim eval`: evaluate an agent or a checkpoint on an env's fixed evaluation split; write a results file."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from shopsim.app.commands import env_help, positive_int, writable_output
from shopsim.app.commands.rollout import add_model_arguments, add_scale_arguments, model_agent_from_args, ray_pool


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate an agent on the test split and write a results JSON",
                       description="Evaluate an agent (by name) or a trained checkpoint on the env's fixed "
                                   "evaluation protocol (the first tasks of data/splits/<Name-vN>.json, sized per "
                                   "env so that intervals are tight; --whole-split for all of them): every task is "
                                   "tried --tries times under each eval seed; metrics get 95%% intervals (Wilson "
                                   "for rates, a seeded bootstrap over tasks otherwise).")
    p.add_argument("--env", required=True, help=env_help())
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--agent", help="agent name (expert, random, s_S, ...) or module:Class")
    who.add_argument("--checkpoint", help="a checkpoint folder written by training (has shopsim_agent.json)")
    who.add_argument("--model", metavar="DIR",
                     help="any local causal-LM folder (safetensors, tokenizer, chat template; e.g. from `shopsim "
                          "model import`), acting through its own chat template: with the env's tool schemas where "
                          "the template renders tools, else with the env's text grammar in the system prompt "
                          "(text envs only). The results record the model's name and weights sha256")
    p.add_argument("--name", default=None, help="leaderboard entry name (default: the agent name / folder name)")
    p.add_argument("--split", default="test", choices=["test", "dev"])
    p.add_argument("--episodes", type=positive_int, default=None,
                   help="episodes per seed: uses the first max(1, N // tries) tasks of the split")
    p.add_argument("--tasks", type=positive_int, default=None, help="use the first N tasks of the split")
    p.add_argument("--tries", type=positive_int, default=None, help="tries per task and seed (pass^k needs >= k)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="eval seeds (default: the protocol's)")
    p.add_argument("--whole-split", action="store_true",
                   help="every task, eval seed and try of the split file instead of the env's default protocol size")
    p.add_argument("--num-envs", type=positive_int, default=None,
                   help="env copies stepped together (default: the agent's evaluation batch: 64 for the LM agent, "
                        "8 for the others)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    p.add_argument("--env-kwargs", default=None, metavar="JSON",
                   help='env constructor options as JSON, e.g. \'{"k": 20}\' (default: those recorded in the '
                        "checkpoint's manifest, else the env's defaults; the checkpoint's presentation options, e.g. "
                        "Shopping's obs_mode, always apply)")
    p.add_argument("--decoding", choices=["greedy", "sample"], default="greedy",
                   help="how an LM agent decodes its actions: greedy (arg-max, the leaderboard protocol's; a task's "
                        "tries then differ only where the env's reset seed changes the episode) or sample (the "
                        "agent's own sampling: a loaded LM checkpoint samples at temperature 1). Agents that do not "
                        "decode from a language model act as they always do. Recorded in the results file as "
                        "'decoding' when not greedy; it is part of the protocol hash")
    add_model_arguments(p)
    p.add_argument("--out", required=True, help="results JSON to write")
    add_scale_arguments(p)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import agents
    from agents.registry import manifest_env_kwargs
    from shopsim.app.bench import make_agent, reference_agent
    from shopsim.envs import check_env_id, check_env_options
    from shopsim.leaderboard.evaluate import agent_env_kwargs, evaluate
    from shopsim.leaderboard.protocols import load_protocol
    from shopsim.leaderboard.render import fmt_metric
    from shopsim.leaderboard.results import make_results, write_results

    check_env_id(args.env)
    if args.name is not None:
        _check_entry_name(args.name, "--name")
    out = writable_output(args.out)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    whole = load_protocol(args.env, args.split, sized=False)
    default = whole if args.whole_split else load_protocol(args.env, args.split)
    tries = args.tries or default.tries
    tasks = args.tasks if args.episodes is None else max(1, args.episodes // tries)
    # --tasks may reach past the default size: the first N tasks of the whole split
    protocol = replace(whole.limited(tasks=tasks or len(default.task_ids), seeds=args.seeds or list(default.seeds),
                                     tries=tries), decoding=args.decoding)
    env_kwargs = _parse_env_kwargs(args.env_kwargs)
    if env_kwargs:
        check_env_options(args.env, env_kwargs, what="--env-kwargs")
    if args.checkpoint:
        agent = agents.load_checkpoint(args.checkpoint, env_id=args.env)
        manifest = Path(args.checkpoint) / agents.registry.CHECKPOINT_MANIFEST
        payload = agents.registry.read_manifest(args.checkpoint)
        name, kind = args.name or checkpoint_entry_name(args.checkpoint, payload), "checkpoint"
        if args.name is None:
            _check_entry_name(name, f"the entry name {name[:40]!r} (from the checkpoint's folder; --name sets "
                                    "another)")
        algorithm = payload.get("algorithm") if isinstance(payload.get("algorithm"), str) else None
        budget = checkpoint_budget(args.checkpoint, payload)
        config: dict[str, Any] = {"checkpoint": str(args.checkpoint), "manifest": manifest.read_text()}
        if env_kwargs is None:  # evaluate on the env the policy was trained on
            env_kwargs = manifest_env_kwargs(manifest)
            check_env_options(args.env, env_kwargs, what=f"{manifest} env_kwargs")
    elif args.model:
        agent, config = model_agent_from_args(args, args.env, greedy=args.decoding == "greedy")
        name, kind = args.name or config["model"], "agent"
        if args.name is None:
            _check_entry_name(name, f"the entry name {name[:40]!r} (from the model's name; --name sets another)")
        algorithm = budget = None
    else:
        # built for the options it is evaluated on (a retrieval agent's K comes from them)
        agent = make_agent(args.agent, args.env, {**protocol.env_kwargs, **(env_kwargs or {})})
        name, kind = args.name or args.agent, ("agent" if getattr(agent, "learns", False) else "reference")
        config = {"agent": args.agent}
        algorithm = budget = None
    if env_kwargs:
        protocol = replace(protocol, env_kwargs={**protocol.env_kwargs, **env_kwargs})
    used = agent_env_kwargs(agent, protocol)  # what `evaluate` runs on: the agent's rendering stays
    if used:
        config["env_kwargs"] = used
    import contextlib

    from shopsim.distributed import using

    # --workers / --ray-address: the episodes run on Ray actors
    with ray_pool(args) or contextlib.nullcontext() as pool, using(pool):
        ev = evaluate(agent, protocol, reference=reference_agent(protocol), progress=not args.no_progress,
                      num_envs=args.num_envs)
    rec = make_results(protocol=protocol, entry=name, kind=kind, metrics=ev.metrics,
                       agent=f"{type(agent).__module__}:{type(agent).__qualname__}", algorithm=algorithm,
                       config=config, budget=budget, wall_s=ev.wall_s, extra={"notes": ev.notes} if ev.notes else None)
    write_results(out, rec)
    for note in ev.notes:
        print(f"note: {note}")
    shown = [m for m in protocol.metrics if m in ev.metrics] or sorted(ev.metrics)[:6]
    print(f"wrote {out}: {name} on {args.env} ({args.split}, {len(protocol.task_ids)} tasks x {protocol.tries} "
          f"tries x {len(protocol.seeds)} seeds, protocol {protocol.hash}, {ev.wall_s:.1f}s)")
    for m in shown:
        print(f"  {m:>24}: {fmt_metric(ev.metrics[m])}")
    return 0


def _check_entry_name(name: str, what: str) -> None:
    """Refuse an entry name the leaderboard would not take (`shopsim.leaderboard.results.entry_name_problem`)
    before any evaluation runs."""
    from shopsim.errors import ConfigError
    from shopsim.leaderboard.results import entry_name_problem

    problem = entry_name_problem(name)
    if problem:
        raise ConfigError(f"{what} {problem}")


def _run_dir(checkpoint) -> Path:
    """The training run a checkpoint folder belongs to: ``OUT`` for ``OUT/checkpoint``, else the folder itself."""
    path = Path(checkpoint).resolve()
    return path.parent if path.name == "checkpoint" else path


def checkpoint_entry_name(checkpoint, manifest: dict) -> str:
    """A leaderboard name for a checkpoint evaluated without ``--name``: its run folder, prefixed with the
    algorithm the manifest records unless the folder's name already says it (``runs/hpo-seed0/checkpoint`` ->
    ``hpo-seed0``, ``runs/a/checkpoint`` trained by hpo -> ``hpo/a``)."""
    run = _run_dir(checkpoint).name
    algo = manifest.get("algorithm")
    if not isinstance(algo, str) or not algo:
        return run
    return run if algo.lower() in run.lower() else f"{algo}/{run}"


def checkpoint_budget(checkpoint, manifest: dict) -> dict | None:
    """The training budget of a checkpoint for the leaderboard's budget column: the manifest's ``budget`` (or
    ``iterations``) if recorded, else the number of iterations in the run's ``metrics.csv`` next to the checkpoint;
    plus the training seed. None if neither records it."""
    import csv

    budget = dict(manifest["budget"]) if isinstance(manifest.get("budget"), dict) else {}
    if "iterations" not in budget and isinstance(manifest.get("iterations"), int):
        budget["iterations"] = manifest["iterations"]
    log = _run_dir(checkpoint) / "metrics.csv"
    if "iterations" not in budget and log.is_file():
        try:
            with log.open(newline="") as f:
                done = {row["iteration"] for row in csv.DictReader(f) if row.get("iteration") not in (None, "")}
        except (OSError, csv.Error, KeyError, UnicodeDecodeError):
            done = set()
        if done:
            budget["iterations"] = len(done)
    if not budget:
        return None
    if isinstance(manifest.get("seed"), int):
        budget.setdefault("train_seed", manifest["seed"])
    return budget


def _parse_env_kwargs(text: str | None) -> dict | None:
    import json

    from shopsim.errors import ShopsimError

    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShopsimError(f"--env-kwargs is not valid JSON ({exc.msg}); write e.g. '{{\"k\": 20}}'") from None
    if not isinstance(value, dict):
        raise ShopsimError("--env-kwargs must be a JSON object of constructor options, e.g. '{\"k\": 20}'")
    return value
