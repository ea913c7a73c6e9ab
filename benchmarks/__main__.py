"""`python -m benchmarks` (`make bench`): run the benchmark modules of this folder, each in its own process.

    python -m benchmarks                        # the quick variant of every throughput benchmark (bench_*)
    python -m benchmarks --list                 # what would run, and which modules write JSON
    python -m benchmarks bench_lm bench_retrieval --full
    python -m benchmarks --repro                # also the quick reproductions (repro_*, learning_lm)
    python -m benchmarks --json runs/bench      # modules with a --json option write runs/bench/<module>.json

The modules are found on disk (``bench_*`` are throughput benchmarks; ``repro_*`` and ``learning_*`` are learning
reproductions, minutes to hours even when quick), so a new module joins without an edit here. Each runs as
``python -m benchmarks.<module> --quick`` in a fresh interpreter, so one module's torch threads, caches and peak
memory do not leak into the next; a failing module is reported and the rest still run.
"""

from __future__ import annotations

import argparse
import ast
import pkgutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
THROUGHPUT = ("bench_",)
REPRODUCTIONS = ("repro_", "learning_")


def discover() -> dict[str, str]:
    """Module name -> kind ("throughput" or "reproduction"), sorted by name; other modules are not benchmarks."""
    found = {}
    for info in sorted(pkgutil.iter_modules([str(HERE)]), key=lambda m: m.name):
        if info.name.startswith(THROUGHPUT):
            found[info.name] = "throughput"
        elif info.name.startswith(REPRODUCTIONS):
            found[info.name] = "reproduction"
    return found


def accepts_option(module: str, option: str) -> bool:
    """Whether the module's argument parser declares `option`, read from its source (importing the module would
    load torch and the envs just to ask)."""
    tree = ast.parse((HERE / f"{module}.py").read_text())
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "add_argument"
               and any(isinstance(a, ast.Constant) and a.value == option for a in node.args)
               for node in ast.walk(tree))


def command(module: str, *, full: bool, json_dir: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", f"benchmarks.{module}"]
    if not full:
        cmd.append("--quick")
    if json_dir is not None and accepts_option(module, "--json"):
        cmd += ["--json", str(json_dir / f"{module}.json")]
    return cmd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", help="modules to run (default: every bench_* module)")
    p.add_argument("--repro", action="store_true", help="also run the reproductions (repro_*, learning_*)")
    p.add_argument("--full", action="store_true", help="the full variants instead of --quick")
    p.add_argument("--json", type=Path, default=None, metavar="DIR",
                   help="modules with a --json option write DIR/<module>.json")
    p.add_argument("--list", action="store_true", help="list the modules that would run, then exit")
    args = p.parse_args(argv)

    known = discover()
    unknown = [m for m in args.modules if m not in known]
    if unknown:
        print(f"python -m benchmarks: unknown module {', '.join(unknown)}; choose from {', '.join(known)}",
              file=sys.stderr)
        return 2
    chosen = args.modules or [m for m, kind in known.items() if kind == "throughput" or args.repro]

    if args.list:
        for m in chosen:
            json_note = "  (--json)" if accepts_option(m, "--json") else ""
            print(f"{m:24s} {known[m]}{json_note}")
        return 0
    if args.json is not None:
        args.json.mkdir(parents=True, exist_ok=True)

    outcomes = []
    for m in chosen:
        if not args.full and not accepts_option(m, "--quick"):
            # a check without a quick variant takes hours on a CPU: run it on its own, not as part of a sweep
            print(f"\n=== {m}: skipped, it has no --quick variant (run `python -m benchmarks.{m}` on its own)")
            continue
        cmd = command(m, full=args.full, json_dir=args.json)
        print(f"\n=== {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=HERE.parent, check=False).returncode
        outcomes.append((m, rc, time.perf_counter() - t0))

    print("\nmodule                   exit      wall")
    for m, rc, wall in outcomes:
        print(f"{m:24s} {rc:4d} {wall:8.1f} s")
    failed = [m for m, rc, _ in outcomes if rc != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
