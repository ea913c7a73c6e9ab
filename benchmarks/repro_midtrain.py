"""Reproduction check of mid-training (card §14, docs/algorithms/midtrain.md) on Shopping-v0 against GRPO.

    python -m benchmarks.repro_midtrain [--out runs/seedcheck] [--arms diverse more_tasks star incorrect]
        [--seeds 0 1 2] [--iterations 10] [--num-tasks 8] [--quick] [--results DIR]
    python -m benchmarks.repro_midtrain --out runs/seedcheck --results docs/results    # the committed check

The claims (RRV et al., arXiv 2605.08472, through the card's shopsim reading):

* at an equal mid-training budget (the same number of (task, strategy) pairs generated), fewer tasks × n strategies
  ("diverse") gives a higher success after GRPO than more tasks × 1 strategy ("more_tasks");
* diverse but incorrect variants ("incorrect") give no gain over plain GRPO; STaR-style data ("star": correct own
  samples, no strategy prompt) is the other control;
* the share of test trajectories that combine strategies (adhere to two or more of `baselines.midtrain.MARKED`)
  rises from after mid-training to after RL.

Protocol: `benchmarks.learning_lm`'s (the shipped SFT weakened to ~0.30 dev success in ``OUT/start``, the same lr,
rollout temperature, rollouts per iteration, group size, update schedule and evaluation episodes). Plain GRPO is
``OUT/grpo/seed<S>`` (a finished run there is reused, never retrained; a missing one is trained); each arm is
``midtrain`` with the same RL budget in ``OUT/midtrain_check/<arm>/seed<S>``. The arms' generation pools: diverse,
star and incorrect use ``--num-tasks`` tasks × every strategy, more_tasks uses ``--num-tasks × n`` tasks × 1 strategy
(in rotation), so all four generate the same number of candidates. Every finished run under OUT is summarised, so
the arms can be run in several invocations. Besides the trainers' own dev/test evaluation, the script evaluates
(greedy, the same test episodes) the start, each mid-trained checkpoint (before RL) and each final checkpoint, GRPO's
included, for the strategy-mix share. Prints the summary; with ``--results DIR`` writes ``DIR/midtrain_check.md``
and .json (generated; ``--results docs/results``: the committed check); without it no table is written.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.learning_lm import (
    ENV,
    EVAL_SEED,
    FAMILIES,
    _algo,
    _train_one,
    add_protocol_arguments,
    protocol_env_kwargs,
    weaken,
)
from shopsim.leaderboard.results import git_commit

ARMS = ("diverse", "more_tasks", "star", "incorrect")


def arm_overrides(arm: str, args) -> dict:
    """The `MidTrainConfig` fields of one arm (equal generation budget: num_tasks × n pairs for every arm)."""
    from baselines.midtrain import SUPPORTED

    common = dict(candidates=args.candidates, gen_temperature=args.gen_temperature, exemplar=not args.no_exemplar,
                  strategy_prompt=not args.no_strategy_prompt)
    if arm == "more_tasks":
        return {**common, "data": "diverse", "num_tasks": args.num_tasks * len(SUPPORTED), "strategies_per_task": 1}
    return {**common, "data": arm, "num_tasks": args.num_tasks}


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def finished(run_dir: Path, iterations: int) -> dict | None:
    """The last metrics row of a run with `iterations` rows and a test evaluation, else None."""
    rows = _rows(run_dir / "metrics.csv")
    if len(rows) >= iterations and rows[iterations - 1].get("test_success") not in (None, ""):
        return rows[iterations - 1]
    return None


def mix_eval(checkpoint: Path, args, env_kwargs: dict, cache: Path) -> dict:
    """Greedy test success and strategy-mix share of a checkpoint on the benchmark's test episodes (cached)."""
    if cache.is_file():
        return json.loads(cache.read_text())
    from agents.lm.agent import LMAgent
    from shopsim.paths import write_text_atomic

    agent = LMAgent(env_id=ENV, checkpoint=checkpoint)
    algo = _algo("midtrain", args, env_kwargs, eval_split="test", eval_episodes=args.eval_episodes)
    m = algo.evaluate(ENV, agent, seed=EVAL_SEED, env_kwargs=env_kwargs)
    write_text_atomic(cache, json.dumps(m))
    return m


def _stat(xs) -> dict:
    from shopsim.leaderboard.metrics import stat

    return stat([float(x) for x in xs]) if xs else None


def _fmt(st, signed=False) -> str:
    if st is None:
        return "–"
    f = "{:+.2f}" if signed else "{:.2f}"
    s = f.format(st["mean"])
    if st.get("ci95") is not None:
        s += f" [{f.format(st['ci95'][0])}, {f.format(st['ci95'][1])}]"
    return s


def run(args, argv) -> dict:
    from agents.lm.agent import default_checkpoint_dir
    from shopsim.paths import write_text_atomic

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    init = Path(args.init) if args.init else default_checkpoint_dir()
    env_kwargs = protocol_env_kwargs(init, args)
    info = weaken(init, out / "start", args.target, args.calib, env_kwargs, args.bisect_steps, args)
    check = out / "midtrain_check"
    start = mix_eval(out / "start", args, env_kwargs, check / f"start-test-{args.eval_episodes}.json")
    print(f"start: test {start['test_success']:.2f}, strategy mix {start['test_strategy_mix']:.2f}")
    # plain GRPO: reused when finished; trained only where no run folder exists (a folder another process may be
    # filling is never touched)
    for seed in [] if args.summary_only else args.seeds:
        d = out / "grpo" / f"seed{seed}"
        if not d.exists():
            print(f"training grpo seed {seed}")
            _train_one(("grpo", seed, args, env_kwargs, out, None))
        elif finished(d, args.iterations) is None:
            print(f"WARNING: {d} exists but has no finished {args.iterations}-iteration run; left out of the table")
    for arm in [] if args.summary_only else args.arms:
        for seed in args.seeds:
            run_dir = check / arm / f"seed{seed}"
            if finished(run_dir, args.iterations) is not None:
                continue
            t1 = time.perf_counter()
            _algo("midtrain", args, env_kwargs, **arm_overrides(arm, args)).train(
                ENV, iterations=args.iterations, seed=seed, out_dir=run_dir, init=out / "start",
                progress=not args.no_progress)
            print(f"{arm} seed {seed}: {time.perf_counter() - t1:.0f}s")
    # summary over every finished run found
    results = {"grpo": {}, **{a: {} for a in ARMS}}
    for seed in sorted({int(p.name[4:]) for p in (out / "grpo").glob("seed*")}):
        d = out / "grpo" / f"seed{seed}"
        last = finished(d, args.iterations)
        if last is None:
            continue
        mix = mix_eval(d / "checkpoint", args, env_kwargs, check / "grpo_eval" / f"seed{seed}.json")
        results["grpo"][seed] = {"test": float(last["test_success"]), "dev": float(last["dev_success"]),
                                 "mix_rl": mix["test_strategy_mix"]}
    for arm in ARMS:
        for d in sorted((check / arm).glob("seed*")):
            last = finished(d, args.iterations)
            if last is None:
                continue
            seed = int(d.name[4:])
            gen = json.loads((d / "midtrain" / "generate.json").read_text())
            sft = json.loads((d / "midtrain" / "sft.json").read_text())
            r = {"test": float(last["test_success"]), "dev": float(last["dev_success"]),
                 "mix_rl": float(last["test_strategy_mix"]), "pairs": gen["gen_pairs"], "tasks": gen["gen_tasks"],
                 "gen_success": gen["gen_success"], "gen_adherence": gen["gen_adherence"], "kept": gen["gen_kept"],
                 "kept_mix": gen.get("gen_kept_strategy_mix"), "sft_steps": sft["sft_steps"]}
            if sft.get("examples"):
                m = mix_eval(d / "midtrain" / "sft" / "checkpoint", args, env_kwargs, d / "midtrain" / "test_eval.json")
                r.update(test_mid=m["test_success"], mix_mid=m["test_strategy_mix"])
            else:  # nothing kept: the mid-trained checkpoint is the start
                r.update(test_mid=start["test_success"], mix_mid=start["test_strategy_mix"])
            results[arm][seed] = r
    summary = summarise(results, start)
    doc = {"claims": claims(summary, results), "note": args.note, "summary": summary,
           "runs": {a: {str(s): v for s, v in r.items()} for a, r in results.items()},
           "start": {"test_success": start["test_success"], "test_strategy_mix": start["test_strategy_mix"],
                     "weaken": {k: info[k] for k in ("alpha", "calib_success", "sft_success")}},
           "protocol": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
           "command": "python -m benchmarks.repro_midtrain " + shlex.join(argv if argv is not None else sys.argv[1:]),
           "commit": git_commit(), "wall_s": time.perf_counter() - t0}
    if args.results:
        res = Path(args.results)
        res.mkdir(parents=True, exist_ok=True)
        write_text_atomic(res / "midtrain_check.json", json.dumps(doc, indent=2, default=float))
        write_text_atomic(res / "midtrain_check.md", markdown(doc))
        print(f"wrote {res / 'midtrain_check.md'}")
    print("\n".join(table(summary)))
    return doc


def summarise(results: dict, start: dict) -> list[dict]:
    """One row per arm with finished runs: final test success, its gain over the start and over GRPO (paired by
    seed), mid-trained (before RL) test success, generation statistics and the strategy-mix shares."""
    grpo = results["grpo"]
    rows = []
    for arm, runs in results.items():
        if not runs:
            continue
        seeds = sorted(runs)
        row = {"arm": arm, "seeds": seeds, "test": _stat([runs[s]["test"] for s in seeds]),
               "gain_start": _stat([runs[s]["test"] - start["test_success"] for s in seeds]),
               "mix_rl": _stat([runs[s]["mix_rl"] for s in seeds])}
        paired = [s for s in seeds if s in grpo]
        if arm != "grpo" and paired:
            row["gain_grpo"] = _stat([runs[s]["test"] - grpo[s]["test"] for s in paired])
            row["gain_grpo_per_seed"] = [runs[s]["test"] - grpo[s]["test"] for s in paired]
        if arm != "grpo":
            for k in ("pairs", "tasks", "kept", "gen_success", "gen_adherence", "kept_mix", "test_mid", "mix_mid"):
                vals = [runs[s][k] for s in seeds if runs[s].get(k) is not None]
                row[k] = float(np.mean(vals)) if vals else None
        rows.append(row)
    return rows


def claims(summary: list[dict], results: dict) -> list[dict]:
    """Each card claim with its numbers and whether these runs show it: a comparison shows only when it holds on
    every paired seed (``seeds`` says how many; one seed is no evidence either way)."""
    by = {r["arm"]: r for r in summary}
    out = []

    def paired(a: str, b: str, key: str = "test") -> list[float]:
        return [results[a][s][key] - results[b][s][key] for s in sorted(results[a]) if s in results[b]]

    if by.get("diverse") and by.get("more_tasks"):
        d = paired("diverse", "more_tasks")
        out.append({"claim": "diverse (fewer tasks x n strategies) beats more tasks x 1 strategy after GRPO",
                    "diverse": by["diverse"]["test"]["mean"], "more_tasks": by["more_tasks"]["test"]["mean"],
                    "per_seed_difference": d, "seeds": len(d), "shows": bool(d) and all(x > 0 for x in d)})
    if by.get("incorrect") and "gain_grpo" in by["incorrect"]:
        d = by["incorrect"]["gain_grpo_per_seed"]
        out.append({"claim": "diverse-but-incorrect variants give no gain over GRPO",
                    "gain_vs_grpo": by["incorrect"]["gain_grpo"]["mean"], "per_seed_difference": d,
                    "seeds": len(d), "shows": not all(x > 0 for x in d)})
    if by.get("diverse") and by["diverse"].get("mix_mid") is not None:
        d = [r["mix_rl"] - r["mix_mid"] for r in results["diverse"].values()]
        out.append({"claim": "the share of test traces combining strategies rises from mid-training to RL",
                    "after_midtraining": by["diverse"]["mix_mid"], "after_rl": by["diverse"]["mix_rl"]["mean"],
                    "per_seed_difference": d, "seeds": len(d), "shows": all(x > 0 for x in d)})
    if by.get("diverse") and "gain_grpo" in by["diverse"]:
        d = by["diverse"]["gain_grpo_per_seed"]
        out.append({"claim": "mid-training (diverse) + GRPO beats plain GRPO at the same RL budget",
                    "gain_vs_grpo": by["diverse"]["gain_grpo"]["mean"], "per_seed_difference": d,
                    "seeds": len(d), "shows": all(x > 0 for x in d)})
    return out


def table(summary: list[dict]) -> list[str]:
    def f(x):
        return "–" if x is None else f"{x:.2f}"

    lines = ["| arm | seeds | (task, strategy) pairs | kept | gen success | gen adherence | test after mid-training "
             "| test after RL [95% CI] | gain vs start | gain vs grpo (paired) | mix: kept data | mix: after "
             "mid-training | mix: after RL |", "|---" * 13 + "|"]
    for r in summary:
        pairs = "–" if r.get("pairs") is None else f"{r['pairs']:.0f} ({r['tasks']:.0f} tasks)"
        lines.append(
            f"| {r['arm']} | {len(r['seeds'])} | {pairs} | {f(r.get('kept'))} | {f(r.get('gen_success'))} | "
            f"{f(r.get('gen_adherence'))} | {f(r.get('test_mid'))} | {_fmt(r['test'])} | "
            f"{_fmt(r['gain_start'], True)} | {_fmt(r.get('gain_grpo'), True)} | {f(r.get('kept_mix'))} | "
            f"{f(r.get('mix_mid'))} | {_fmt(r['mix_rl'])} |")
    return lines


def markdown(doc: dict) -> str:
    p = doc["protocol"]
    lines = ["# Mid-training reproduction check (generated by benchmarks/repro_midtrain.py)", "",
             f"Command: `{doc['command']}`  ", f"Commit: {doc['commit']}; wall time {doc['wall_s']:.0f} s; seeds "
             f"{p['seeds']}; {p['iterations']} GRPO iterations × {p['rollouts']} rollouts (G = {p['group_size']}); "
             f"{p['eval_episodes']} greedy test episodes.  ",
             f"Generation: {p['num_tasks']} tasks per arm (x6 for more_tasks), {p['candidates']} candidates per "
             f"(task, strategy), temperature {p['gen_temperature']}, exemplar "
             f"{'off' if p['no_exemplar'] else 'on'}, strategy prompt "
             f"{'off' if p.get('no_strategy_prompt') else 'on'}.", "", *([doc["note"], ""] if doc.get("note") else []),
             f"Start (learning_lm's weakened SFT): test success {doc['start']['test_success']:.2f}, strategy mix "
             f"{doc['start']['test_strategy_mix']:.2f}.", "", *table(doc["summary"]), "",
             "Columns: kept = mid-training examples kept (mean over seeds); gen success / adherence = share of the "
             "generated candidates that succeeded / adhered to their strategy; mix = share of trajectories adhering "
             "to two or more of ask_first, confirm_before_buying, broad_then_filter, compare_two.", "", "## Claims", ""]
    for c in doc["claims"]:
        nums = ", ".join(f"{k} {v:.2f}" for k, v in c.items() if isinstance(v, float))
        per = " ".join(f"{x:+.2f}" for x in c["per_seed_difference"])
        n = c["seeds"]
        lines.append(f"- {c['claim']}: **{'shows' if c['shows'] else 'does not show'}** ({nums}; per seed {per}; "
                     f"{n} seed{'s' if n != 1 else ''}{', not conclusive' if n < 2 else ''})")
    if not doc["claims"]:
        lines.append("- no arm pair finished; nothing to compare")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Mid-training reproduction check (see module docstring)")
    p.add_argument("--init", default=None, help="SFT checkpoint folder (default data/lm/sft)")
    p.add_argument("--out", default="runs/seedcheck")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rollouts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    add_protocol_arguments(p)
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--num-tasks", type=int, default=8, help="generation tasks of the diverse arm (x n for more_tasks)")
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--gen-temperature", type=float, default=1.0)
    p.add_argument("--no-exemplar", action="store_true", help="strategy description only, no expert exemplar")
    p.add_argument("--no-strategy-prompt", action="store_true",
                   help="generate without strategy prompts; the adherence check assigns samples to strategies")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write DIR/midtrain_check.md and .json (the committed check: docs/results; default: none)")
    p.add_argument("--quick", action="store_true", help="diverse + more_tasks, seed 0, 3 iterations, 4 tasks, "
                                                        "20 eval episodes")
    p.add_argument("--note", default="", help="a sentence for the results page (e.g. what was not run)")
    p.add_argument("--summary-only", action="store_true", help="train nothing; summarise the finished runs")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.arms, a.seeds, a.iterations, a.num_tasks, a.eval_episodes, a.eval_every = (
            ["diverse", "more_tasks"], [0], 3, 4, 20, 3)
    a.families = list(FAMILIES)
    a.start = "weaken"
    a.value_pretrain_steps, a.max_gen_batches = 20, 3
    run(a, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
