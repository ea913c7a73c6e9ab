"""Shopping-v0 options measured side by side with the defaults (the reference measured in the same run).

    python -m benchmarks.bench_shopping_options --quick          # 100 test tasks per family
    python -m benchmarks.bench_shopping_options                  # every test task (500 per family)
    python -m benchmarks.bench_shopping_options --json runs/bench/bench_shopping_options.json
    python -m benchmarks.bench_shopping_options --lm-checkpoint data/lm/sft    # + the shipped LM agent (minutes)
    python -m benchmarks.bench_shopping_options --lm-checkpoint data/lm/sft --results docs/results   # the table

* **Instructions** (``instruction_style``): over the test tasks of find_and_buy, clarify_and_buy and bundle, the
  share of tasks whose stated attribute and option values all appear word for word in the instruction
  (`shopsim.envs.shopping.paraphrase.verbatim_values`), and the BM25 recall@10 of the target product when the whole
  task line is the search query (find_and_buy, clarify_and_buy): how far copying the instruction goes. Reference:
  the template style.
* **personalized_buy**: success of the random text agent and of the scripted expert on its test tasks, next to
  the other families (reference).
* **Near-duplicate catalog** (``near_duplicates=k``): the expert's success, turns and product pages opened on
  find_and_buy test tasks with and without the near-duplicate clusters (reference: no clusters).

* **The shipped LM agent** (``--lm-checkpoint``): its find_and_buy success under each option, through
  ``python -m shopsim.app.cli eval`` (reference: the defaults it was trained on).

With ``--results DIR`` the tables go to ``DIR/shopping_options.md`` (and ``.json``) (``--results docs/results``: the
committed tables; generated: command, commit, seeds, wall time); without it no table is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def instructions(size: int, n: int) -> dict:
    from shopsim.catalog import load_catalog
    from shopsim.envs.shopping.paraphrase import verbatim_values
    from shopsim.envs.shopping.tasks import TEST_BASE, make_task

    cat = load_catalog(size, 0)
    index = cat.index()
    out = {}
    for style in ("template", "paraphrase"):
        verbatim, total, found, searched, values, values_total = 0, 0, 0, 0, 0, 0
        for fam in ("find_and_buy", "clarify_and_buy", "bundle"):
            for tid in range(TEST_BASE, TEST_BASE + n):
                t = make_task(cat, fam, "test", tid, style)
                counts = [verbatim_values(g, t.instruction, t.hidden) for g in t.goals]
                verbatim += all(k == m for k, m in counts)
                values += sum(k for k, _ in counts)
                values_total += sum(m for _, m in counts)
                total += 1
                if fam != "bundle":
                    hits = [i for i, _ in index.search(t.instruction, k=10)]
                    found += t.goals[0].target_id in hits
                    searched += 1
        out[style] = {"tasks": total, "all_values_verbatim": verbatim / total, "values_verbatim": values / values_total,
                      "bm25_recall_at_10": found / searched, "recall_tasks": searched}
    return out


def _run(env, agent, family: str, ids, seed: int = 0) -> dict:
    agent.reset(1, seed)
    ok, turns = 0, 0
    for k, tid in enumerate(ids):
        obs, info = env.reset(seed=seed * 100_000 + k, options={"family": family, "task_id": tid, "split": "test"})
        agent.begin_episode(0, obs, info)
        while True:
            a = agent.act_one(0, obs, info)
            obs, _r, term, trunc, info = env.step(a)
            if term or trunc:
                break
        ok += info["success"]
        turns += info["episode_metrics"]["turns"]
    return {"episodes": len(ids), "success": ok / len(ids), "turns": turns / len(ids)}


def personalized(size: int, n: int) -> dict:
    from agents.random_agent import RandomTextAgent
    from agents.shopping_expert import ShoppingExpert
    from shopsim.envs.shopping import ALL_FAMILIES, ShoppingEnv
    from shopsim.envs.shopping.tasks import TEST_BASE

    env = ShoppingEnv(catalog_size=size)
    ids = list(range(TEST_BASE, TEST_BASE + n))
    out = {}
    for fam in ALL_FAMILIES:
        out[fam] = {"expert": _run(env, ShoppingExpert(), fam, ids),
                    "random": _run(env, RandomTextAgent(env_id="shopsim/Shopping-v0"), fam, ids)}
    return out


def near_duplicates(size: int, n: int, k: int) -> dict:
    from agents.shopping_expert import ShoppingExpert
    from shopsim.envs.shopping import ShoppingEnv
    from shopsim.envs.shopping.tasks import TEST_BASE

    ids = list(range(TEST_BASE, TEST_BASE + n))
    out = {}
    for dup in (0, k):
        env = ShoppingEnv(catalog_size=size, near_duplicates=dup)
        out[f"near_duplicates={dup}"] = _run(env, ShoppingExpert(), "find_and_buy", ids)
    return out


LM_VARIANTS = {"default": {}, "near_duplicates=4": {"near_duplicates": 4},
               "instruction_style=paraphrase": {"instruction_style": "paraphrase"}}


def lm_agent(checkpoint: Path, n: int) -> dict:
    """The shipped LM agent on find_and_buy test tasks under each option, through ``python -m shopsim.app.cli eval``
    (one subprocess per variant; the checkpoint's presentation options apply)."""
    import subprocess
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, kw in LM_VARIANTS.items():
            dest = Path(tmp) / "r.json"
            cmd = [sys.executable, "-m", "shopsim.app.cli", "eval", "--env", "shopsim/Shopping-v0", "--checkpoint",
                   str(checkpoint), "--tasks", str(n), "--tries", "1", "--seeds", "0", "--no-progress",
                   "--env-kwargs", json.dumps({"family": "find_and_buy", **kw}), "--out", str(dest)]
            subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
            m = json.loads(dest.read_text())["metrics"]
            out[name] = {k: m[k]["mean"] for k in ("success_rate", "score", "turns", "invalid_rate")}
    return out


def write_markdown(res: dict, path: Path) -> None:
    from shopsim.paths import write_text_atomic

    ins = res["instructions"]
    ref = ins["template"]
    lines = ["# Shopping-v0 options against the defaults", "",
             "Generated by `benchmarks/bench_shopping_options.py`; do not edit by hand.", "",
             f"- command: `{res['command']}`", f"- commit: `{res['commit'][:7]}`",
             f"- catalog: {res['catalog_size']:,} products, seed 0; eval seed 0; {res['tasks']} test tasks per family",
             f"- wall time: {res['wall_s']:.0f} s", "",
             "## Instructions (`instruction_style`)", "",
             "All values verbatim: share of find_and_buy, clarify_and_buy and bundle test tasks whose stated attribute "
             "and option values all appear word for word in the instruction. Recall@10: the target is among the first "
             "10 BM25 hits when the whole task line is the query (find_and_buy, clarify_and_buy). Ratio: against the "
             "template style.", "",
             "| style | tasks | all values verbatim | values verbatim | BM25 recall@10 | recall ratio |",
             "|---|---|---|---|---|---|"]
    for style, r in ins.items():
        ratio = r["bm25_recall_at_10"] / max(1e-9, ref["bm25_recall_at_10"])
        lines.append(f"| {style} | {r['tasks']} | {r['all_values_verbatim']:.3f} | {r['values_verbatim']:.3f} | "
                     f"{r['bm25_recall_at_10']:.3f} | {ratio:.2f}x |")
    if "personalized" in res:
        lines += ["", "## personalized_buy", "", "Success on the same test task ids, every family (the four default "
                  "families are the reference).", "",
                  "| family | expert success | expert turns | random success |", "|---|---|---|---|"]
        for fam, r in res["personalized"].items():
            lines.append(f"| {fam} | {r['expert']['success']:.3f} | {r['expert']['turns']:.1f} | "
                         f"{r['random']['success']:.3f} |")
    if "near_duplicates" in res:
        lines += ["", "## Near-duplicate catalog (`near_duplicates`)", "",
                  "The scripted expert on find_and_buy test tasks (reference: the plain catalog).", "",
                  "| catalog | expert success | turns |", "|---|---|---|"]
        for name, r in res["near_duplicates"].items():
            lines.append(f"| {name} | {r['success']:.3f} | {r['turns']:.1f} |")
    if "lm_agent" in res:
        ref = res["lm_agent"]["default"]["success_rate"]
        lines += ["", "## The shipped LM agent", "",
                  f"`python -m shopsim.app.cli eval --checkpoint {res['lm_checkpoint']}` on the first "
                  f"{res['lm_tasks']} "
                  "find_and_buy test tasks, one try, eval seed 0, with each option in `--env-kwargs` (reference: "
                  "the defaults it was trained on). The task ids are the same; the near-duplicate catalog draws "
                  "other targets for them (cluster targets).", "",
                  "| env option | success | ratio | score | turns | invalid rate |", "|---|---|---|---|---|---|"]
        for name, r in res["lm_agent"].items():
            lines.append(f"| {name} | {r['success_rate']:.3f} | {r['success_rate'] / max(1e-9, ref):.2f}x | "
                         f"{r['score']:.3f} | {r['turns']:.2f} | {r['invalid_rate']:.3f} |")
    write_text_atomic(path, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 test tasks per family instead of 500")
    p.add_argument("--size", type=int, default=10_000, help="catalog size (default: the env's 10,000)")
    p.add_argument("--near-duplicates", type=int, default=4, help="cluster size of the near-duplicate catalog")
    p.add_argument("--lm-checkpoint", type=Path, default=None, metavar="DIR",
                   help="also evaluate this LM checkpoint (e.g. data/lm/sft) under each option (minutes)")
    p.add_argument("--lm-tasks", type=int, default=200, help="find_and_buy test tasks for the LM agent")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON here")
    p.add_argument("--results", type=Path, default=None, metavar="DIR",
                   help="write the tables DIR/shopping_options.{md,json} (the committed ones: docs/results; "
                        "default: none)")
    a = p.parse_args(argv)
    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import write_text_atomic

    n = 100 if a.quick else 500
    t0 = time.perf_counter()
    res = {"command": "python -m benchmarks.bench_shopping_options " + " ".join(argv if argv is not None
                                                                              else sys.argv[1:]),
           "commit": git_commit(), "catalog_size": a.size, "tasks": n, "seeds": [0]}
    res["instructions"] = instructions(a.size, n)
    for style, r in res["instructions"].items():
        print(f"{style:10s} all values verbatim {r['all_values_verbatim']:.3f}  values verbatim "
              f"{r['values_verbatim']:.3f}  BM25 recall@10 {r['bm25_recall_at_10']:.3f}", flush=True)
    res["personalized"] = personalized(a.size, n)
    for fam, r in res["personalized"].items():
        print(f"{fam:16s} expert {r['expert']['success']:.3f}  random {r['random']['success']:.3f}", flush=True)
    res["near_duplicates"] = near_duplicates(a.size, n, a.near_duplicates)
    for name, r in res["near_duplicates"].items():
        print(f"{name:20s} expert success {r['success']:.3f}  turns {r['turns']:.1f}", flush=True)
    if a.lm_checkpoint is not None:
        res["lm_checkpoint"] = str(a.lm_checkpoint)
        res["lm_tasks"] = a.lm_tasks
        res["lm_agent"] = lm_agent(a.lm_checkpoint, a.lm_tasks)
        for name, r in res["lm_agent"].items():
            print(f"LM agent, {name:28s} success {r['success_rate']:.3f}", flush=True)
    res["wall_s"] = time.perf_counter() - t0
    if a.results is not None:
        a.results.mkdir(parents=True, exist_ok=True)
        write_markdown(res, a.results / "shopping_options.md")
        write_text_atomic(a.results / "shopping_options.json", json.dumps(res, indent=2))
        print(f"wrote {a.results / 'shopping_options.md'} and shopping_options.json")
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(a.json, json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
