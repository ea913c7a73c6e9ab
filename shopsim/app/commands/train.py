"""`shopsim train`: train any registered algorithm on an env (docs/training.md).

Generic over env families: it resolves ``baselines.make(name, env_id=ENV, **overrides)`` and calls
``.train(ENV, iterations=..., seed=..., out_dir=..., init=...)``, so LM, recommendation, retrieval and inventory
algorithms all run through it. ``--set key=value`` overrides a field of the algorithm's config dataclass; the value
is parsed by the field's type (`shopsim.configs.parse_text`, the same parser `shopsim sft` builds its flags with:
numbers, true/false, none/null, JSON objects for dicts, comma-separated or JSON lists for tuples) and checked
against its options and bounds before anything runs. ``--show-config`` prints the fields, defaults and docs.
"""

from __future__ import annotations

import argparse

from shopsim.app.commands import env_help, positive_int, writable_output
from shopsim.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a baseline algorithm on an env",
                       description="Train a registered algorithm (see baselines.available()) on an env; writes "
                                   "metrics.csv, TensorBoard logs and a checkpoint folder under --out.")
    p.add_argument("--env", default=None, help=env_help() + " (required unless --show-config)")
    p.add_argument("--algo", required=True, help="algorithm name (grpo, ppo, mpo, ...) or module:Class")
    p.add_argument("--show-config", action="store_true",
                   help="print the algorithm's config fields with their defaults and docs, then exit")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="start from this folder: a checkpoint (e.g. an SFT checkpoint), or any local Hugging Face "
                        "causal-LM folder (e.g. from `shopsim model import`), which acts through its own chat "
                        "template like `shopsim eval --model` (text envs)")
    p.add_argument("--iterations", type=positive_int, default=10, help="training iterations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output folder (default runs/<algo>-seed<S>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (repeatable), e.g. --set lr=1e-5 --set group_size=4; "
                        "--show-config lists the fields")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def parse_overrides(items: list[str], config_cls: type, *, algo: str = "the algorithm") -> dict:
    """``KEY=VALUE`` strings as typed values of `config_cls`'s fields; raises a one-line ConfigError for a
    malformed item, an unknown key (listing the valid ones) or a value of the wrong type or out of range."""
    from shopsim.configs import check_field, config_fields, field_types, parse_text

    known = [f.name for f in config_fields(config_cls)]
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        if key not in known:
            raise ConfigError(f"{algo}: unknown option(s) {key}; valid options: {', '.join(sorted(known))}")
        out[key] = check_field(config_cls, key, parse_text(key, value, field_types(config_cls)[key]))
    return out


def run(args: argparse.Namespace) -> int:
    import baselines
    from shopsim.envs import check_env_id, check_env_kwargs

    if args.env is not None:
        check_env_id(args.env)
    cls = baselines.resolve(args.algo, env_id=args.env)
    config_cls = cls.Config
    if config_cls is None:  # (Algorithm() raises the same)
        raise ConfigError(f"{args.algo}: {cls.__name__} must define a Config dataclass")
    if args.show_config:
        from shopsim.configs import describe_config

        print(f"{args.algo} ({cls.__module__}:{cls.__qualname__}): set a field with --set KEY=VALUE\n")
        print(describe_config(config_cls))
        return 0
    if args.env is None:
        raise ConfigError(f"--env is required to train ({env_help()}); see shopsim train --help")
    overrides = parse_overrides(args.overrides, config_cls, algo=getattr(cls, "name", args.algo))
    if "env_kwargs" in overrides:  # an unknown or bad env option fails now, not iterations into the run
        check_env_kwargs(args.env, overrides["env_kwargs"])
    algo = cls(**overrides)
    out = writable_output(args.out or f"runs/{args.algo.replace(':', '_')}-seed{args.seed}", is_dir=True)
    if args.init is not None:
        from pathlib import Path

        if not Path(args.init).is_dir():
            raise ConfigError(f"--init {args.init}: no such checkpoint folder")
    result = algo.train(args.env, iterations=args.iterations, seed=args.seed, out_dir=out, init=args.init,
                        progress=not args.no_progress)
    if result.already_complete:  # the loop resumed a finished run: nothing was trained or rewritten
        print(f"{result.out_dir} already holds a complete {args.algo} run ({len(result.history)} iterations); "
              "nothing retrained (raise --iterations to continue it, or use another --out)")
        return 0
    last = result.history[-1] if result.history else {}
    shown = ", ".join(f"{k} {v:.4g}" for k, v in last.items()
                      if isinstance(v, float) and any(s in k for s in ("success", "score", "loss", "cost")))
    resumed = f" (resumed after iteration {result.resumed_from})" if result.resumed_from else ""
    print(f"trained {args.algo} on {args.env} for {len(result.history)} iterations{resumed} -> {result.out_dir}"
          + (f" (checkpoint {result.checkpoint})" if result.checkpoint else "") + (f": {shown}" if shown else ""))
    return 0
