"""Test success per Shopping task family of LM checkpoints, by default the two shipped ones: the agent
``data/lm/sft`` and the larger TrOPD teacher ``data/lm/sft-small`` (docs/agents.md).

    python -m benchmarks.eval_shipped_lm [--checkpoints data/lm/sft data/lm/sft-small] [--tasks 100]
                                         [--families all] [--threads 2] [--results DIR] [--json PATH]
    python -m benchmarks.eval_shipped_lm --results docs/results    # the committed table

Each (checkpoint, family) cell is `shopsim eval`'s protocol with ``--env-kwargs '{"family": F}'``: the first
``--tasks`` test tasks, the protocol's eval seeds, greedy decoding, no reference run. clarify_and_buy gets
``--clarify-tries`` tries per task (its simulated customer answers differently under each reset seed); the other
families get one, because under greedy decoding their tries replay the same episode. Success carries its 95%
Wilson interval over the cell's episodes.

A finished cell is kept in ``OUT/<checkpoint name>-<weights digest>/<family>.json``, so an interrupted run resumes
and retrained weights are never reported from an old cell. With ``--results DIR`` writes ``DIR/shipped_lm.md`` and
``shipped_lm.json`` (the table, each checkpoint's parameters and bytes on disk, command, commit, wall time;
``--results docs/results``: the committed table); without it no table is written.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

ENV = "shopsim/Shopping-v0"
DEFAULT_CHECKPOINTS = ("data/lm/sft", "data/lm/sft-small")


def cell_protocol(family: str, tasks: int, tries: int):
    """The eval protocol of one family: the test split's first `tasks` tasks, `tries` tries, greedy."""
    from shopsim.leaderboard.protocols import load_protocol

    default = load_protocol(ENV, "test")
    whole = load_protocol(ENV, "test", sized=False)
    p = replace(whole.limited(tasks=tasks, seeds=list(default.seeds), tries=tries), decoding="greedy")
    return replace(p, env_kwargs={**p.env_kwargs, "family": family})


def evaluate_cell(checkpoint: Path, family: str, tasks: int, tries: int) -> dict:
    """Success (mean and 95% interval), mean turns and episodes of `checkpoint` on `family`."""
    import agents
    from shopsim.leaderboard.evaluate import evaluate

    protocol = cell_protocol(family, tasks, tries)
    agent = agents.load_checkpoint(checkpoint, env_id=ENV)  # its presentation options (obs_mode) apply in evaluate
    ev = evaluate(agent, protocol, reference=None, progress=False)
    m = ev.metrics
    return {"family": family, "tasks": tasks, "tries": tries, "seeds": list(protocol.seeds),
            "episodes": tasks * tries * len(protocol.seeds), "success": m["success_rate"],
            "turns": m.get("turns"), "invalid_rate": m.get("invalid_rate"), "wall_s": round(ev.wall_s, 1)}


def checkpoint_info(path: Path) -> dict:
    """Weights digest, bytes on disk, storage dtype, width, depth and parameters (millions) of a checkpoint."""
    from agents.lm.model import load_model, num_parameters, weights_digest

    weights = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    return {"digest": weights_digest(path), "weights_bytes": weights, "dtype": dtype,
            "hidden": cfg.get("hidden_size") or cfg.get("n_embd"),
            "layers": cfg.get("num_hidden_layers") or cfg.get("n_layer"),
            "params_m": round(num_parameters(load_model(path)) / 1e6, 2)}


def run(args, argv=None) -> dict:
    import torch

    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import shipped_path, write_text_atomic

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = Path(args.out)
    table: dict[str, dict] = {}
    for given in args.checkpoints:
        path = shipped_path(given)
        if not (path / "config.json").is_file():
            raise SystemExit(f"no LM checkpoint at {given} (no config.json); `make lm-teacher` makes "
                             "data/lm/sft-small")
        info = checkpoint_info(path)
        cells = {}
        folder = out / f"{Path(given).name}-{info['digest']}"
        for family in args.families:
            tries = args.clarify_tries if family == "clarify_and_buy" else 1
            cell_file = folder / f"{family}.json"
            cell = json.loads(cell_file.read_text()) if cell_file.is_file() else None
            if cell is None or (cell["tasks"], cell["tries"]) != (args.tasks, tries):
                cell = evaluate_cell(path, family, args.tasks, tries)
                folder.mkdir(parents=True, exist_ok=True)
                write_text_atomic(cell_file, json.dumps(cell, indent=2))
            s = cell["success"]
            print(f"{given} {family}: success {s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] "
                  f"({cell['episodes']} episodes, {cell['wall_s']:.0f}s)")
            cells[family] = cell
        table[given] = {**info, "families": cells}
    meta = {"command": "python -m benchmarks.eval_shipped_lm " + shlex.join(sys.argv[1:] if argv is None else argv),
            "commit": git_commit(), "wall_s": round(time.perf_counter() - t0, 1), "tasks": args.tasks,
            "clarify_tries": args.clarify_tries, "checkpoints": table}
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(meta, indent=2))
    if args.results:
        write_results(Path(args.results), meta)
        print(f"wrote {Path(args.results) / 'shipped_lm.md'} and shipped_lm.json")
    return meta


def _cell(c: dict | None) -> str:
    if not c:
        return "–"
    s = c["success"]
    return f"{s['mean']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"


def write_results(directory: Path, meta: dict) -> None:
    from shopsim.paths import write_text_atomic

    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / "shipped_lm.json", json.dumps(meta, indent=2))
    names = list(meta["checkpoints"])
    families = list(dict.fromkeys(f for c in meta["checkpoints"].values() for f in c["families"]))
    lines = ["# Shipped LM checkpoints: test success per Shopping family", "",
             "Generated by `benchmarks/eval_shipped_lm.py`; do not edit by hand.", "",
             f"- command: `{meta['command']}`", f"- commit: `{meta['commit']}`",
             f"- wall time: {meta['wall_s'] / 60:.1f} min (cells finished by an earlier invocation are reused)",
             f"- protocol: `shopsim eval`'s, per family: the first {meta['tasks']} test tasks, greedy decoding; "
             f"clarify_and_buy {meta['clarify_tries']} tries per task (its customer varies with the reset seed), "
             "the other families one (greedy replays the same episode); success with its 95% Wilson interval", "",
             "| checkpoint | parameters | weights on disk | " + " | ".join(families) + " |",
             "|---|---|---|" + "---|" * len(families)]
    for name in names:
        c = meta["checkpoints"][name]
        lines.append(f"| `{name}` | {c['params_m']:.1f}M | {c['weights_bytes'] / 1e6:.1f} MB ({c['dtype']}) | "
                     + " | ".join(_cell(c["families"].get(f)) for f in families) + " |")
    write_text_atomic(directory / "shipped_lm.md", "\n".join(lines) + "\n")


def main(argv=None) -> int:
    from benchmarks import shopping_families

    p = argparse.ArgumentParser(description="Test success per Shopping family of LM checkpoints (module docstring)")
    p.add_argument("--checkpoints", nargs="+", default=list(DEFAULT_CHECKPOINTS))
    p.add_argument("--families", default="all", help="comma-separated, or 'all' (default %(default)s)")
    p.add_argument("--tasks", type=int, default=100, help="test tasks per family")
    p.add_argument("--clarify-tries", type=int, default=4, help="tries per clarify_and_buy task")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="runs/eval_shipped_lm", help="finished cells (resume)")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write the table DIR/shipped_lm.md and .json (the committed one: docs/results; default: none)")
    p.add_argument("--json", default=None, help="also write the measurements to this JSON file")
    a = p.parse_args(argv)
    a.families = shopping_families(p, a.families)
    if a.tasks < 1 or a.clarify_tries < 1:
        p.error("--tasks and --clarify-tries must be at least 1")
    run(a, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
