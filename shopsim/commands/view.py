"""`shopsim view`: a static HTML trajectory viewer for a shopsim Parquet dataset."""

from __future__ import annotations

import argparse

from shopsim.commands import positive_int, writable_output


def add_parser(sub) -> None:
    p = sub.add_parser("view", help="write a static HTML page to read a dataset's episodes turn by turn",
                       description="Render a Parquet dataset (from shopsim rollout) as one self-contained HTML "
                                   "page: episode list, and per episode every observation, action, reward, "
                                   "invalid-action flag and info.")
    p.add_argument("dataset", help="a shopsim Parquet dataset")
    p.add_argument("--out", required=True, help="HTML file to write")
    p.add_argument("--max-episodes", type=positive_int, default=500, help="show at most N episodes")
    p.add_argument("--max-chars", type=positive_int, default=4000, help="cut longer observations/actions")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shopsim.leaderboard.viewer import write_viewer

    out = writable_output(args.out)
    write_viewer(args.dataset, out, max_episodes=args.max_episodes, max_chars=args.max_chars)
    print(f"wrote {out}")
    return 0
