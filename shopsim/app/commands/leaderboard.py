"""`shopsim leaderboard`: render a folder of results files into Markdown, CSV, HTML and plots."""

from __future__ import annotations

import argparse

from shopsim.app.commands import writable_output


def add_parser(sub) -> None:
    p = sub.add_parser("leaderboard", help="render results files into a leaderboard (md, csv, html, plots)",
                       description="Read every results JSON under --results (recursively) and write "
                                   "leaderboard.md, leaderboard.csv, index.html and plots/ into --out.")
    p.add_argument("--results", required=True, help="folder of results files (from shopsim eval / bench), or one file")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shopsim.errors import DatasetError
    from shopsim.leaderboard.render import render_all, to_markdown
    from shopsim.leaderboard.results import find_results

    out = writable_output(args.out, is_dir=True)
    results = find_results(args.results)
    if not results:
        raise DatasetError(f"no results files under {args.results}; write them with `shopsim eval` or `shopsim bench`")
    written = render_all(results, out, plots=not args.no_plots)
    print(to_markdown(results))
    print(f"wrote {', '.join(str(p) for p in written.values())}")
    return 0
