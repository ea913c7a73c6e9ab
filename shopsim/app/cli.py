"""The `shopsim` command line.

Each subcommand lives in its own module under `shopsim.app.commands` and exposes ``add_parser(subparsers)`` (which sets
``func`` to its runner). Errors the user can fix (`ShopsimError`, unwritable paths) end with one line that says what
to change and exit status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand modules, in the order `--help` lists them
COMMANDS = ["catalog", "rollout", "sft", "train", "eval", "model", "leaderboard", "view", "bench", "serve"]


def build_parser() -> argparse.ArgumentParser:
    from shopsim import __version__

    parser = argparse.ArgumentParser(prog="shopsim", description="Simulated e-commerce environments for RL.")
    parser.add_argument("--version", action="version", version=f"shopsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"shopsim.app.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"shopsim.app.commands.{name}":
                continue  # command not built (yet)
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from shopsim.errors import ShopsimError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from shopsim.app.commands import removing_unused_outputs

    try:
        with removing_unused_outputs():
            result = args.func(args)
    except ShopsimError as exc:
        print(f"shopsim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except PermissionError as exc:
        print(f"shopsim {args.command}: error: cannot write {exc.filename!s}: permission denied; "
              "choose a writable path", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `shopsim catalog info | head`: the reader went away, nothing to report
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"shopsim {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
