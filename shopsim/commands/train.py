"""`shopsim train`: train any registered algorithm on an env (docs/training.md).

Generic over env families: it resolves ``baselines.make(name, env_id=ENV, **overrides)`` and calls
``.train(ENV, iterations=..., seed=..., out_dir=..., init=...)``, so LM, recommendation, retrieval and inventory
algorithms all run through it. ``--set key=value`` overrides config fields (values parse as JSON when they can:
numbers, true/false, null, lists; otherwise they stay strings).
"""

from __future__ import annotations

import argparse
import json

from shopsim.commands import positive_int, writable_output
from shopsim.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a baseline algorithm on an env",
                       description="Train a registered algorithm (see baselines.available()) on an env; writes "
                                   "metrics.csv, TensorBoard logs and a checkpoint folder under --out.")
    p.add_argument("--env", required=True, help="env id, e.g. shopsim/Shopping-v0")
    p.add_argument("--algo", required=True, help="algorithm name (grpo, ppo, mpo, ...) or module:Class")
    p.add_argument("--init", default=None, help="start from this checkpoint folder (e.g. an SFT checkpoint)")
    p.add_argument("--iterations", type=positive_int, default=10, help="training iterations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output folder (default runs/<algo>-seed<S>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (repeatable), e.g. --set lr=1e-5 --set group_size=4")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def run(args: argparse.Namespace) -> int:
    import baselines
    from shopsim.envs import check_env_id

    check_env_id(args.env)
    overrides = parse_overrides(args.overrides)
    algo = baselines.make(args.algo, env_id=args.env, **overrides)
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
