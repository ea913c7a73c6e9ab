"""`shopsim sft`: supervised warm start of the LM agent on scripted-expert trajectories (agents.lm.sft).

    shopsim sft --expert-episodes 1000 --out runs/sft [--env ENV] [--family find_and_buy] [--seed 0]
    shopsim sft --data expert.parquet --out runs/sft
    shopsim sft --data expert.parquet --init models/smollm2 --out runs/sft-smollm2

``--init`` takes a shopsim checkpoint or any local Hugging Face causal-LM folder (`shopsim model import`): such a
model keeps its tokenizer and chat template and is told the env's text grammar (the expert's action form) in its
system prompt, which the checkpoint keeps.

The training options are the fields of `agents.lm.sft.SFTConfig`, one ``--field-name`` flag each
(`shopsim.configs.add_config_arguments`), so their defaults are SFTConfig's: the recipe that lets the default
1.4M-parameter model reach the find_and_buy target on two CPU cores (copy-friendly expert data, a short-to-long
curriculum and prior-breaking copy augmentation, see the `agents.lm.sft` module docstring).
``--no-numbered-results --results-per-page none --expert-query full --no-arg-space --no-expert-price-clause
--curriculum-steps 0 --augment-copies 0 --order-refs id`` is plain behaviour cloning on the expert's default actions.

Writes OUT/checkpoint (a save_pretrained folder + shopsim manifest: `shopsim eval --checkpoint OUT/checkpoint`),
OUT/metrics.csv and OUT/sft_curve.png. Run again with the same options, start (``--init``) and data, a finished
OUT is reused (nothing is trained; `agents.lm.sft.finished_run`) and an interrupted one resumes from its latest
intermediate checkpoint, so a staged recipe (`make lm-agent`) run again continues where it stopped.
"""

from __future__ import annotations

import argparse

#: SFTConfig fields without a flag of their own (`--family` sets `families`)
_EXCLUDED = ("families",)


def add_parser(sub) -> None:
    from agents.lm.sft import SFTConfig
    from shopsim.app.commands import positive_int
    from shopsim.configs import add_config_arguments
    from shopsim.envs.record import text_env_ids

    p = sub.add_parser("sft", help="supervised warm start of the LM agent on expert trajectories",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default=text_env_ids()[0], help="env id: a text env (default: %(default)s)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="a Parquet dataset of expert trajectories (from `shopsim rollout`)")
    src.add_argument("--expert-episodes", type=positive_int, help="collect this many expert episodes first")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="start from this folder instead of a randomly initialised model: a shopsim checkpoint, or "
                        "any local Hugging Face causal-LM folder (e.g. from `shopsim model import`), which is then "
                        "told the env's text grammar in its system prompt; --arch/--size are then ignored")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    default_families = ",".join(SFTConfig.families) or "all"  # the field's default
    p.add_argument("--family", default=default_families,
                   help="task families of the expert episodes and of the dev evaluation, comma-separated, or 'all' "
                        "(default: %(default)s)")
    add_config_arguments(p.add_argument_group("training options (agents.lm.sft.SFTConfig)"), SFTConfig,
                         exclude=_EXCLUDED)
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace):
    """The SFTConfig of parsed `shopsim sft` arguments (checks --family against the env's task families)."""
    from agents.lm.sft import SFTConfig
    from shopsim.configs import config_from_args
    from shopsim.envs import RECORDS, task_families
    from shopsim.errors import ConfigError

    families = () if args.family in ("all", "") else tuple(f.strip() for f in args.family.split(",") if f.strip())
    known = task_families(args.env) if args.env in RECORDS else ()
    if known:
        bad = [f for f in families if f not in known]
        if bad:
            raise ConfigError(f"--family {','.join(bad)}: choose from {', '.join(known)} (comma-separated) or all")
    return config_from_args(SFTConfig, args, families=families)


def run(args) -> int:
    import torch

    from agents.lm import sft
    from shopsim.app.commands import writable_output
    from shopsim.envs import check_env_id
    from shopsim.errors import ConfigError
    from shopsim.paths import files_digest

    check_env_id(args.env)
    cfg = build_config(args)
    out = writable_output(args.out, is_dir=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    init = sft.init_record(args.init) if args.init else None
    data = {"path": str(args.data), "sha256": files_digest(args.data)} if args.data else {
        "expert_episodes": args.expert_episodes}
    done = sft.finished_run(out, cfg, init=init, data=data)
    if done is not None:  # a staged recipe run again (`make lm-agent`): this stage is already trained
        print(f"sft: {out} already holds this finished run (same options, start and data): {done}")
        return 0
    model = tokenizer = system_prompt = None
    if args.init:  # before the data: damaged weights are refused before expert episodes are collected
        from pathlib import Path

        from agents.lm.model import load_model
        from agents.lm.pretrained import is_model_folder, load_pretrained
        from agents.lm.tokenizer import load_tokenizer

        if not (Path(args.init) / "config.json").is_file():
            raise ConfigError(f"--init {args.init}: not a model folder (no config.json)")
        if is_model_folder(args.init):  # a pretrained model: its own tokenizer, told the expert's text grammar
            from shopsim.envs import env_record
            from shopsim.envs.record import text_env_ids
            from shopsim.envs.shopping.tools import system_prompt as env_prompt

            if not env_record(args.env).text:
                raise ConfigError(f"--init {args.init}: a language model acts only in "
                                  f"{' or '.join(text_env_ids())}, not {args.env}; pass --env {text_env_ids()[0]}")
            model, tokenizer = load_pretrained(args.init)
            system_prompt = env_prompt(form="text")
        else:
            model, tokenizer = load_model(args.init), load_tokenizer(args.init)
    if args.data:
        from shopsim.datasets import read_trajectories

        trajs = read_trajectories(args.data)
    else:
        trajs = sft.sft_expert_data(args.env, args.expert_episodes, cfg, progress=not args.no_progress)
    agent, history = sft.train_sft(args.env, trajs, cfg, out_dir=out, progress=not args.no_progress, model=model,
                                   tokenizer=tokenizer, init=init, data=data, system_prompt=system_prompt)
    last = history[-1]
    print(f"sft: {len(trajs)} expert episodes, {cfg.steps} steps, final loss {last['loss']:.4f}, "
          f"dev success {last.get('eval_success', float('nan')):.3f} -> {agent.checkpoint}")
    return 0
