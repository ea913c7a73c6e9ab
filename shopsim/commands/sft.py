"""`shopsim sft`: supervised warm start of the LM agent on scripted-expert trajectories (agents.lm.sft).

    shopsim sft --env shopsim/Shopping-v0 --expert-episodes 1000 --out runs/sft [--family find_and_buy] [--seed 0]
    shopsim sft --env shopsim/Shopping-v0 --data expert.parquet --out runs/sft

The defaults are the recipe that lets the default 1.4M-parameter model reach the find_and_buy target on two CPU
cores (docs/agents.md, "Language-model agent"): copy-friendly expert data (results opened by position, the task line as
the query, a blank after the bracket), a short-to-long curriculum and prior-breaking copy augmentation
(`agents.lm.augment`). ``--no-numbered-results --expert-query full --no-arg-space --curriculum-steps 0
--augment-copies 0`` is plain behaviour cloning on the expert's default actions.

Writes OUT/checkpoint (a save_pretrained folder + shopsim manifest: `shopsim eval --checkpoint OUT/checkpoint`),
OUT/metrics.csv and OUT/sft_curve.png.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    import argparse

    from shopsim.commands import positive_int

    p = sub.add_parser("sft", help="supervised warm start of the LM agent on expert trajectories",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="shopsim/Shopping-v0", help="env id (default: %(default)s)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="a Parquet dataset of expert trajectories (from `shopsim rollout`)")
    src.add_argument("--expert-episodes", type=positive_int, help="collect this many expert episodes first")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="continue from this model folder (a checkpoint's weights and tokenizer) instead of a "
                        "randomly initialised model; --arch/--size are then ignored")
    p.add_argument("--steps", type=positive_int, default=2900,
                   help="optimizer steps, curriculum included (default: %(default)s)")
    p.add_argument("--curriculum-steps", type=int, default=2000,
                   help="the first steps train on the shortest quarter of the rows (copy turns; default: %(default)s)")
    p.add_argument("--augment-copies", type=int, default=1,
                   help="prior-breaking copy augmentation: rewritten copies per expert episode (agents.lm.augment; "
                        "default: %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context-mode", choices=["window", "concat"], default="concat",
                   help="concat: the whole episode in one growing context, each token encoded once with the KV "
                        "cache (default: %(default)s)")
    p.add_argument("--obs-mode", choices=["compact", "terse", "full"], default="terse",
                   help="env obs_mode the agent is trained on; terse states the task once per episode "
                        "(default: %(default)s)")
    p.add_argument("--history", type=int, default=1, help="window mode: past turns in the prompt")
    p.add_argument("--pin-first-turn", action=argparse.BooleanOptionalAction, default=None,
                   help="window mode: keep the first turn (the task) in every prompt (default: on with "
                        "--obs-mode terse)")
    p.add_argument("--history-obs-chars", type=int, default=100,
                   help="window mode: characters kept of each past observation")
    p.add_argument("--obs-loss-weight", type=float, default=0.0,
                   help="auxiliary LM loss weight on observation tokens (0: loss on agent tokens only)")
    p.add_argument("--family", default="find_and_buy",
                   help="task families of the expert episodes and of the dev evaluation, comma-separated, or 'all' "
                        "(default: %(default)s)")
    p.add_argument("--arch", choices=["llama", "gpt2"], default="llama")
    p.add_argument("--size", choices=["tiny", "mini", "small", "medium"], default="mini")
    p.add_argument("--eval-every", type=int, default=1000, help="dev evaluation interval in steps (0: end only)")
    p.add_argument("--eval-episodes", type=positive_int, default=50)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--numbered-results", action=argparse.BooleanOptionalAction, default=True,
                   help="env numbered_results=True and the expert opens results by position (click[#3]) "
                        "(default: on)")
    p.add_argument("--expert-query", choices=["full", "span", "instruction"], default="instruction",
                   help="the expert's search: full = attributes, option values, type; span = '<attributes> <type>'; "
                        "instruction = the task line up to its price clause (default: %(default)s)")
    p.add_argument("--results-per-page", type=positive_int, default=5, help="env results_per_page (default: 5)")
    p.add_argument("--arg-space", action=argparse.BooleanOptionalAction, default=True,
                   help="the expert writes click[ x] / search[ q]: the same action, but the first argument word "
                        "tokenizes as in the task line (default: on)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from agents.lm.sft import SFTConfig, expert_trajectories, train_sft
    from shopsim.commands import writable_output
    from shopsim.envs import check_env_id
    from shopsim.errors import ConfigError

    check_env_id(args.env)
    out = writable_output(args.out, is_dir=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    families = () if args.family in ("all", "") else tuple(f.strip() for f in args.family.split(",") if f.strip())
    if args.env == "shopsim/Shopping-v0":
        from shopsim.envs.shopping.tasks import FAMILIES

        bad = [f for f in families if f not in FAMILIES]
        if bad:
            raise ConfigError(f"--family {','.join(bad)}: choose from {', '.join(FAMILIES)} (comma-separated) or all")
    env_kwargs = {**({"numbered_results": True} if args.numbered_results else {}),
                  **({"obs_mode": args.obs_mode} if args.obs_mode != "compact" else {}),
                  **({"results_per_page": args.results_per_page} if args.results_per_page else {})}
    expert_kwargs = {**({"click_by": "index"} if args.numbered_results else {}),
                     "query": args.expert_query, **({"arg_space": True} if args.arg_space else {})}
    cfg = SFTConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                    context_mode=args.context_mode, history=args.history,
                    history_obs_chars=args.history_obs_chars,
                    pin_first_turn=(args.obs_mode == "terse" and args.context_mode == "window"
                                    if args.pin_first_turn is None else args.pin_first_turn),
                    obs_loss_weight=args.obs_loss_weight, arch=args.arch,
                    size=args.size, eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                    curriculum_steps=min(args.curriculum_steps, args.steps), augment_copies=args.augment_copies,
                    families=families, env_kwargs=env_kwargs)
    if args.data:
        from shopsim.datasets import read_trajectories

        trajs = read_trajectories(args.data)
    else:
        trajs = expert_trajectories(args.env, args.expert_episodes, seed=args.seed, families=families,
                                    progress=not args.no_progress, env_kwargs=env_kwargs,
                                    expert_kwargs=expert_kwargs)
    model = tokenizer = None
    if args.init:
        from pathlib import Path

        from agents.lm.model import load_model
        from agents.lm.tokenizer import load_tokenizer

        if not (Path(args.init) / "config.json").is_file():
            raise ConfigError(f"--init {args.init}: not a model folder (no config.json)")
        model, tokenizer = load_model(args.init), load_tokenizer(args.init)
    agent, history = train_sft(args.env, trajs, cfg, out_dir=out, progress=not args.no_progress, model=model,
                               tokenizer=tokenizer)
    last = history[-1]
    print(f"sft: {len(trajs)} expert episodes, {cfg.steps} steps, final loss {last['loss']:.4f}, "
          f"dev success {last.get('eval_success', float('nan')):.3f} -> {agent.checkpoint}")
    return 0
