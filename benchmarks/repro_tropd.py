"""Reproduction check of TrOPD (docs/algorithms/tropd.md): gradient-norm spikes of plain on-policy distillation
(OPD, K1 on every token) against TrOPD, with a student started on a different mode from the teacher.

    python -m benchmarks.repro_tropd [--out runs/seedcheck] [--seeds 0 1 2] [--iterations 10] [--rollouts 32]
                                     [--arms opd tropd] [--teacher data/lm/sft] [--results DIR]
    python -m benchmarks.repro_tropd --results docs/results    # the committed check

Protocol (the learning benchmark's, `benchmarks.learning_lm`):

* Student: the learning benchmark's start, the shipped SFT checkpoint weakened toward a random initialisation
  until ≈0.30 dev success (``OUT/start``, made once and reused). Teacher: ``--teacher`` (default the shipped SFT
  checkpoint itself), so the student starts on another mode of the same tokenizer and architecture.
* Every arm gets the same rollouts (``--iterations`` × ``--rollouts``, one rollout per task), learning rate,
  temperature, turn and token limits and update schedule (``--minibatches`` optimizer steps per iteration);
  ``--seeds`` seeds each. Arms: ``opd`` (objective="opd") and ``tropd`` (τ = 1, top-k forward KL on outliers),
  both without teacher-prefix guidance so that the trust region is the only difference; ``clip`` and ``mask``
  (the other outlier treatments) and ``tropd_prefix`` (every default, prefixes included) on request. Runs go to
  ``OUT/<name>/<arm>/seed<S>`` (``--name``, default ``tropd_check``); a finished run there is reused when it
  was trained under the same settings (its config digest), and stops the check otherwise.
* Reported per arm (mean over seeds): the pre-clip gradient norm, max and 95th percentile over every optimizer step
  of every seed (``grad_norm_max`` per iteration is the step maximum); the outlier share (tokens with p_T < p_S,
  logged for OPD too) in the first and last iteration; the reverse KL (mean K1 on the student's own samples) and the
  top-k forward KL to the teacher in the first and last iteration; dev/test success at the end. GRPO runs of the
  same budget found in ``OUT/grpo/seed<S>`` (the learning benchmark's) are added as a reference row, read-only.

With ``--results DIR`` writes ``DIR/<name>.md`` and ``<name>.json`` (table, command, commit, seeds, wall time,
teacher; ``--results docs/results``: the committed check); without it no table is written.
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
    FAMILIES,
    _algo,
    add_protocol_arguments,
    evaluate_metrics,
    protocol_env_kwargs,
    weaken,
)
from shopsim.leaderboard.results import git_commit

#: the arms; the check isolates the trust region and outlier treatment, so prefix guidance is off in the first
#: four ("tropd_prefix" is TrOPD with every default, teacher prefixes included)
ARMS = {"opd": {"objective": "opd", "prefix_guidance": False}, "tropd": {"prefix_guidance": False},
        "clip": {"outlier": "clip", "prefix_guidance": False}, "mask": {"outlier": "mask", "prefix_guidance": False},
        "tropd_prefix": {}}


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _f(row: dict, key: str) -> float | None:
    v = row.get(key)
    return float(v) if v not in (None, "") else None


def _finished(run_dir: Path, iterations: int) -> list[dict] | None:
    p = run_dir / "metrics.csv"
    if not p.is_file():
        return None
    rows = _rows(p)
    return rows if len(rows) >= iterations and rows[-1].get("dev_success") not in (None, "") else None


def train_arm(arm: str, seed: int, args, env_kwargs: dict, out: Path, teacher: str) -> list[dict] | None:
    """One (arm, seed) run from the shared start, or its finished metrics when OUT already holds them (None:
    not finished and ``--reuse-only``)."""
    run_dir = out / args.name / arm / f"seed{seed}"
    algo = _algo("tropd", args, env_kwargs, teacher=teacher, **ARMS[arm])
    done = _finished(run_dir, args.iterations)
    if done is not None:
        check_same_settings(run_dir, algo, seed)
    if done is not None or args.reuse_only:
        return done
    torch.set_num_threads(args.threads)
    algo.train(ENV, iterations=args.iterations, seed=seed, out_dir=run_dir, init=out / "start",
               progress=not args.no_progress)
    return _rows(run_dir / "metrics.csv")


def check_same_settings(run_dir: Path, algo, seed: int) -> None:
    """Stop when the finished run in `run_dir` was trained under other settings (another teacher, another arm's
    options: its `run.json` config digest differs from `algo`'s), instead of reporting it under these."""
    from baselines.core.loop import config_digest

    path = run_dir / "run.json"
    recorded = json.loads(path.read_text())["config"] if path.is_file() else None
    want = algo.run_identity(ENV, seed)["config"]
    if recorded is None or config_digest(recorded) != config_digest(want):
        differ = sorted(k for k in want if recorded is None or json.dumps(recorded.get(k), default=str)
                        != json.dumps(want[k], default=str)) if recorded else ["(no run.json)"]
        raise SystemExit(f"{run_dir} holds a run trained under other settings ({', '.join(differ)}); delete it or "
                         "pass another --out or --name")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def summarise(runs: dict[int, list[dict]], start: dict) -> dict:
    """The check's numbers for one arm from its runs' metrics rows (seed -> rows)."""
    step_max = [g for rows in runs.values() for r in rows for g in [_f(r, "grad_norm_max") or _f(r, "grad_norm")]
                if g is not None]
    it_mean = [g for rows in runs.values() for r in rows if (g := _f(r, "grad_norm")) is not None]
    first, last = [rows[0] for rows in runs.values()], [rows[-1] for rows in runs.values()]
    out = {
        "seeds": sorted(runs),
        "grad_norm_step_max": max(step_max) if step_max else None,
        "grad_norm_iter_p95": float(np.percentile(it_mean, 95)) if it_mean else None,
        "grad_norm_iter_max": max(it_mean) if it_mean else None,
        "grad_norm_iter_mean": _mean(it_mean),
        "grad_norm_max_per_seed": {s: max(_f(r, "grad_norm_max") or _f(r, "grad_norm") or 0.0 for r in rows)
                                   for s, rows in runs.items()},
        "final_test": _mean([_f(r, "test_success") for r in last]),
        "final_dev": _mean([_f(r, "dev_success") for r in last]),
        "final_test_per_seed": {s: _f(rows[-1], "test_success") for s, rows in runs.items()},
        "start_test": start.get("test"), "start_dev": start.get("dev"),
        "train_s_per_run": _mean([sum((_f(r, "rollout_s") or 0.0) + (_f(r, "update_s") or 0.0) for r in rows)
                                  for rows in runs.values()]),
    }
    for key in ("outlier_share", "reverse_kl_k1", "forward_kl_topk", "k1_max"):
        out[f"{key}_first"] = _mean([_f(r, key) for r in first])
        out[f"{key}_last"] = _mean([_f(r, key) for r in last])
    return out


def _fmt(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def _arrow(r: dict, key: str) -> str:
    """``first → last`` of a logged metric, '–' when the runs do not log it (GRPO)."""
    if r.get(f"{key}_first") is None:
        return "–"
    return f"{_fmt(r[f'{key}_first'])} → {_fmt(r[f'{key}_last'])}"


def write_results(directory: Path, table: dict, meta: dict) -> None:
    from shopsim.paths import write_text_atomic

    directory.mkdir(parents=True, exist_ok=True)
    name = meta.get("name", "tropd_check")
    write_text_atomic(directory / f"{name}.json", json.dumps({**meta, "arms": table}, indent=2, default=float))
    lines = ["# TrOPD reproduction check: plain OPD against TrOPD", "",
             "Generated by `benchmarks/repro_tropd.py`; do not edit by hand.", "",
             f"- command: `{meta['command']}`", f"- commit: `{meta['commit']}`",
             f"- seeds: {', '.join(map(str, meta['seeds']))}",
             f"- wall time: {meta['wall_s'] / 60:.1f} min (this invocation; finished runs found in OUT are reused); "
             "rollout + update time per run (evaluation excluded), mean over seeds: "
             + ", ".join(f"{arm} {r['train_s_per_run'] / 60:.1f} min" for arm, r in table.items()
                         if r.get("train_s_per_run") is not None),
             f"- student: the learning benchmark's weakened start (dev {_fmt(meta['start'].get('dev'), '.2f')}, "
             f"test {_fmt(meta['start'].get('test'), '.2f')}); teacher: `{meta['teacher']}`",
             f"- budget per run: {meta['protocol']['iterations']} iterations × {meta['protocol']['rollouts']} "
             f"rollouts (one per task), {meta['protocol']['minibatches']} optimizer steps per iteration, lr "
             f"{meta['protocol']['lr']}, temperature {meta['protocol']['temperature']}, max_grad_norm 1.0 (the "
             f"norms below are before clipping); evaluation: greedy, the first {meta['protocol']['eval_episodes']} "
             "dev and test tasks, the same episodes for every run", "",
             "Gradient norms: `step max` is the largest of every optimizer step of every seed; `p95` / `max` are "
             "over the per-iteration means (the only gradient statistic GRPO's runs log). Outlier share: tokens "
             "with p_T < p_S (the tokens TrOPD at τ = 1 moves to the forward KL; logged for OPD too). Reverse KL: "
             "the mean K1 = log p_S − log p_T on the student's own samples of that iteration; forward KL: the "
             "top-k (k = 16, renormalised) forward KL at the same tokens. first → last iteration, mean over seeds.",
             "",
             "| arm | seeds | grad norm step max | grad norm p95 (iter) | grad norm max (iter) | outlier share | "
             "reverse KL | forward KL top-k | dev final | test final (start) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm, r in table.items():
        lines.append(f"| {arm} | {len(r['seeds'])} | {_fmt(r['grad_norm_step_max'])} | "
                     f"{_fmt(r['grad_norm_iter_p95'])} | {_fmt(r['grad_norm_iter_max'])} | "
                     f"{_arrow(r, 'outlier_share')} | {_arrow(r, 'reverse_kl_k1')} | {_arrow(r, 'forward_kl_topk')} | "
                     f"{_fmt(r['final_dev'], '.2f')} | {_fmt(r['final_test'], '.2f')} "
                     f"({_fmt(r['start_test'], '.2f')}) |")
    lines += ["", "Per seed (step-max gradient norm; final test success):", ""]
    for arm, r in table.items():
        per = ", ".join(f"seed {s}: {_fmt(g)}; {_fmt(r['final_test_per_seed'].get(s), '.2f')}"
                        for s, g in r["grad_norm_max_per_seed"].items())
        lines.append(f"- {arm}: {per}")
    if meta.get("notes"):
        lines += ["", *[f"- {n}" for n in meta["notes"]]]
    write_text_atomic(directory / f"{name}.md", "\n".join(lines) + "\n")


def run(args, argv) -> dict:
    from agents.lm.agent import LMAgent, default_checkpoint_dir

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = Path(args.out)
    init = Path(args.init) if args.init else default_checkpoint_dir()
    env_kwargs = protocol_env_kwargs(init, args)
    info = weaken(init, out / "start", args.target, args.calib, env_kwargs, args.bisect_steps, args)
    print(f"start: alpha={info['alpha']:.3f}, calibration dev success {info['calib_success']:.2f}")
    start_file = out / "start" / f"eval-{args.eval_episodes}.json"
    if start_file.is_file():
        start = json.loads(start_file.read_text())
    else:
        agent = LMAgent(env_id=ENV, checkpoint=out / "start")
        start = {s: evaluate_metrics(agent, s, args.eval_episodes, env_kwargs, args)[f"{s}_success"]
                 for s in ("dev", "test")}
        start_file.write_text(json.dumps(start))
    teacher = args.teacher or str(init)
    shown_teacher = args.teacher or ("data/lm/sft" if args.init is None else str(init))
    runs: dict[str, dict[int, list[dict]]] = {arm: {} for arm in args.arms}
    for seed in args.seeds:  # seed-major: an interrupted check still holds paired arms
        for arm in args.arms:
            t1 = time.perf_counter()
            rows = train_arm(arm, seed, args, env_kwargs, out, teacher)
            if rows is None:
                print(f"{arm} seed {seed}: no finished run (--reuse-only)")
                continue
            runs[arm][seed] = rows
            print(f"{arm} seed {seed}: {len(rows)} iterations ({time.perf_counter() - t1:.0f}s)")
    table: dict[str, dict] = {arm: summarise(runs[arm], start) for arm in args.arms if runs[arm]}
    missing = [f"{arm} (seeds {sorted(runs[arm])} of {list(args.seeds)})" for arm in args.arms
               if len(runs[arm]) < len(args.seeds)]
    grpo = {s: rows for s in args.seeds if (rows := _finished(out / "grpo" / f"seed{s}", args.iterations))}
    notes = [f"Unfinished runs left out: {', '.join(missing)}."] if missing else []
    if grpo:
        table["grpo (reference)"] = summarise(grpo, start)
        if len(grpo) < len(args.seeds):
            notes.append(f"GRPO: only seeds {sorted(grpo)} had finished runs in {out / 'grpo'}.")
    else:
        notes.append(f"GRPO: no finished {args.iterations}-iteration run in {out / 'grpo'}; no reference row.")
    command = "python -m benchmarks.repro_tropd " + shlex.join(sys.argv[1:] if argv is None else argv)
    protocol = {k: getattr(args, k) for k in ("iterations", "rollouts", "minibatches", "lr", "temperature",
                                               "max_new_tokens", "max_turns", "eval_episodes", "families")}
    meta = {"command": command, "commit": git_commit(), "seeds": list(args.seeds),
            "wall_s": round(time.perf_counter() - t0, 1), "teacher": shown_teacher, "start": start, "name": args.name,
            "protocol": protocol,
            "notes": notes + list(args.note or [])}
    if args.results:
        write_results(Path(args.results), table, meta)
        print(f"wrote {Path(args.results) / args.name}.md and {args.name}.json")
    else:
        print("no table written (pass --results DIR, e.g. --results docs/results)")
    return table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="TrOPD reproduction check (see module docstring)")
    p.add_argument("--out", default="runs/seedcheck")
    p.add_argument("--init", default=None, help="SFT checkpoint the start is weakened from (default data/lm/sft)")
    p.add_argument("--teacher", default=None, help="teacher checkpoint (default: --init, the unweakened SFT)")
    p.add_argument("--arms", nargs="+", default=["opd", "tropd"], choices=sorted(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rollouts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8, help="unused by TrOPD (G = 1); kept for the shared protocol")
    add_protocol_arguments(p)
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--start", choices=("weaken", "init"), default="weaken")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write DIR/NAME.md and .json (the committed check: docs/results; default: none)")
    p.add_argument("--name", default="tropd_check",
                   help="runs go to OUT/NAME/<arm>/seed<S>, results to NAME.md / NAME.json (e.g. one name per teacher)")
    p.add_argument("--note", action="append", help="a line added to the results' notes (e.g. a reduced budget)")
    p.add_argument("--reuse-only", action="store_true",
                   help="train nothing: summarise the finished runs found in OUT (a check cut short)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    a.families = [f for f in str(a.families).split(",") if f]
    run(a, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
