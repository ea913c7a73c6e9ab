"""`shopsim bench`: the main job — train baselines briefly, evaluate them and the reference agents, render the
leaderboard (see `shopsim.app.bench`)."""

from __future__ import annotations

import argparse

from shopsim.app.commands import positive_int, writable_output
from shopsim.app.commands.rollout import add_scale_arguments, ray_pool


def add_parser(sub) -> None:
    from shopsim.app.bench import MODES

    p = sub.add_parser("bench", help="the benchmark: train, evaluate and render the leaderboard",
                       description="For every env with an evaluation split: evaluate the reference agents, "
                                   "train the baselines within the mode's budget, evaluate them on the test "
                                   "split, and write results files plus the rendered leaderboard into --out.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="budget", action="store_const", const="quick",
                      help="the main job: short budgets (alias of --tier quick, the default)")
    mode.add_argument("--full", dest="budget", action="store_const", const="full",
                      help="the papers' budgets (alias of --tier full)")
    mode.add_argument("--tier", "--budget", dest="budget", choices=MODES,
                      help="a budget tier by name: standard (the shipped leaderboard: every baseline, 3 training "
                           "seeds), quick, full, tiny (CI smoke run)")
    p.add_argument("--out", default=None, help="output folder (default runs/<tier>)")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="where results files are written and resumed from (default OUT/results)")
    p.add_argument("--no-resume", action="store_true",
                   help="train and evaluate every entry again even if its results file exists")
    p.add_argument("--envs", nargs="+", default=None,
                   help="env ids or names (Name-vN), a scenario as Name-vN:scenario; default all")
    p.add_argument("--algo", nargs="+", action="extend", default=[], metavar="MODULE:CLASS",
                   help="also train and rank your own baselines.Algorithm subclass(es), e.g. mypkg.module:MyAlgo "
                        "(imported from the current folder or an installed package)")
    p.add_argument("--split", default="test", choices=["test", "dev"])
    p.add_argument("--seed", type=int, default=0, help="(first) training seed")
    p.add_argument("--train-seeds", type=positive_int, default=None,
                   help="independent training runs per baseline (default: the budget's; 1 quick, 3 full); "
                        "with more than one, trained entries' intervals are over training seeds")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default 1 for quick/tiny: the models are small and extra threads only "
                        "contend; torch's default for full)")
    add_scale_arguments(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p.set_defaults(func=run, budget="quick")


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from shopsim.app.bench import run_bench

    threads = args.threads if args.threads is not None else (None if args.budget == "full" else 1)
    if threads:
        import torch

        torch.set_num_threads(threads)
    if args.algo and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--algo mypkg.module:MyAlgo` resolves like `python -m` would
    out = writable_output(args.out or f"runs/{args.budget}", is_dir=True)
    import contextlib

    from shopsim.distributed import using

    # --workers / --ray-address: every evaluation runs on Ray actors
    with ray_pool(args) or contextlib.nullcontext() as pool, using(pool):
        outcome = run_bench(args.budget, out, envs=args.envs, user_algos=args.algo, split=args.split,
                            train_seed=args.seed, progress=not args.no_progress, plots=not args.no_plots,
                            train_seeds=args.train_seeds, results_dir=args.results, resume=not args.no_resume)
    print(outcome.markdown)
    print(f"leaderboard: {outcome.written['html']} (also leaderboard.md, leaderboard.csv, plots/) "
          f"in {outcome.wall_s:.0f}s")
    if outcome.reference_failed:
        print("error: a reference agent failed (see the error rows and OUT/logs/)", file=sys.stderr)
    return outcome.exit_code
