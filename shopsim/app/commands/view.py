"""`shopsim view`: a static HTML trajectory viewer for a shopsim Parquet dataset."""

from __future__ import annotations

import argparse

from shopsim.app.commands import positive_int, writable_output


def add_parser(sub) -> None:
    p = sub.add_parser("view", help="write a static HTML page to read a dataset's episodes turn by turn",
                       description="Render a Parquet dataset (from shopsim rollout) as one self-contained HTML "
                                   "page: episode list (task, family, strategy, agent, return, success), and per "
                                   "episode its task once and every observation, action, reward, invalid-action "
                                   "flag and info, numbers rounded; Replenishment episodes as a chart of stock, "
                                   "orders, demand and cost per period.")
    p.add_argument("dataset", help="a shopsim Parquet dataset")
    p.add_argument("--out", required=True, help="HTML file to write")
    p.add_argument("--max-episodes", type=positive_int, default=500, help="show at most N episodes")
    p.add_argument("--max-chars", type=positive_int, default=4000, help="cut longer observations/actions")
    p.add_argument("--max-charts", type=int, default=50,
                   help="draw a chart for at most N Replenishment episodes (each takes matplotlib ~0.2 s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shopsim.errors import ConfigError
    from shopsim.leaderboard.viewer import write_viewer

    if args.max_charts < 0:
        raise ConfigError(f"--max-charts must be >= 0 (0 draws no chart), got {args.max_charts}")
    out = writable_output(args.out)
    write_viewer(args.dataset, out, max_episodes=args.max_episodes, max_chars=args.max_chars,
                 max_charts=args.max_charts)
    print(f"wrote {out}")
    return 0
