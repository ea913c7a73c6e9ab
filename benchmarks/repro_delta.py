"""Reproduction check of DelTA (docs/algorithms/delta.md) on Shopping-v0: DelTA against DAPO and the own-side-only
ablation at the same budget, from the learning benchmark's weakened start.

    python -m benchmarks.repro_delta [--out runs/seedcheck] [--seeds 0 1 2] [--iterations 10] [--arms ...]
        [--results DIR]
    python -m benchmarks.repro_delta --results docs/results   # the committed check
    python -m benchmarks.repro_delta --quick     # 1 seed, 3 short iterations: a few CPU minutes, not a result

The claims (Zhang, Wu, Lin, arXiv 2605.21467; the card's Shopping reading):

* against DAPO with dynamic sampling off in both, DelTA keeps improving where DAPO plateaus;
* the opposite-side comparison is necessary: own-side centrality alone is about equal to DAPO;
* coefficients fall below 1 on shared scaffolding (JSON braces, tool names, common words) and rise above 1 on
  discriminative tokens (product ids, option values, the choice to ask).

Protocol: `benchmarks.learning_lm`'s (its helpers `weaken`, `_algo`, `evaluate_metrics` and constants): the start
is the shipped SFT checkpoint weakened to ≈0.30 dev success, kept in ``OUT/start`` and reused when present; every
arm gets ``--iterations`` × ``--rollouts`` rollouts (G = ``--group-size``), the same learning rate, temperature,
token limit and update schedule, and greedy dev/test evaluation on the same ``--eval-episodes`` episodes. Arms:

* ``delta``      — `baselines.delta` with its defaults (dynamic sampling off);
* ``dapo``       — `baselines.dapo` with dynamic sampling off and DelTA's overlong buffer (0.2), so that the token
  coefficients are the only difference;
* ``delta_own``  — DelTA with ``contrast="own"`` (own-side centrality only).

GRPO runs at the same budget found in ``OUT/grpo/seed*`` (the learning benchmark's) are added to the table as a
reference, never trained here. Runs go to ``OUT/delta_check/<arm>/seed<S>``; a finished run is reused, an
unfinished one resumes. After the runs, one batch of rollouts of the start checkpoint is scored with DelTA's
coefficients and the tokens with the highest and lowest mean λ are decoded.

With ``--results DIR`` writes ``DIR/delta_check.md`` and ``delta_check.json`` (``--results docs/results``: the
committed check; ``--quick`` without it: ``OUT/results``; otherwise no table is written): final success, gain over
the start with 95% intervals, the reward curve (mean train return per iteration, first and second half), the λ
statistics, the decoded tokens, the command, commit, seeds and wall time. Results are rewritten after every finished
run.
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
    summarise,
    weaken,
)
from shopsim.leaderboard.results import git_commit

ARMS = {"delta": ("delta", {}),
        "dapo": ("dapo", {"dynamic_sampling": False, "overlong_buffer_frac": 0.2}),
        "delta_own": ("delta", {"contrast": "own"})}
LAMBDA_KEYS = ("delta_lambda_pos_mean", "delta_lambda_pos_std", "delta_lambda_neg_mean", "delta_lambda_neg_std",
               "delta_lambda_pos_min", "delta_lambda_pos_max", "delta_lambda_neg_min", "delta_lambda_neg_max",
               "delta_lambda_above1", "delta_gamma_pos", "delta_gamma_neg", "delta_fallback")


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def _finished(run_dir: Path, iterations: int) -> bool:
    rows = _rows(run_dir / "metrics.csv")
    return len(rows) >= iterations and rows[iterations - 1].get("test_success") not in (None, "")


def train_arm(arm: str, seed: int, args, env_kwargs: dict, out: Path) -> float:
    """One (arm, seed) run from OUT/start; returns its wall time (0 when a finished run is reused)."""
    run_dir = out / "delta_check" / arm / f"seed{seed}"
    if _finished(run_dir, args.iterations):
        return 0.0
    name, over = ARMS[arm]
    t0 = time.perf_counter()
    _algo(name, args, env_kwargs, **over).train(ENV, iterations=args.iterations, seed=seed, out_dir=run_dir,
                                                init=out / "start", progress=not args.no_progress)
    return time.perf_counter() - t0


def _curves(out: Path, start: dict, iterations: int) -> list[dict]:
    """learning_lm-style evaluation rows for every finished run of the arms and of the reference GRPO."""
    curves = []
    dirs = [(arm, out / "delta_check" / arm) for arm in ARMS] + [("grpo (reference)", out / "grpo")]
    for label, d in dirs:
        for path in sorted(d.glob("seed*/metrics.csv")):
            if not _finished(path.parent, iterations):
                continue
            used = 0
            for row in _rows(path)[:iterations]:
                used += int(float(row.get("rollouts") or 0))
                if row.get("test_success") not in (None, ""):
                    curves.append({"algo": label, "seed": int(path.parent.name[4:]),
                                   "iteration": int(row["iteration"]), "dev_success": float(row["dev_success"]),
                                   "test_success": float(row["test_success"]), "rollouts": used,
                                   **{f"test_success/{f}": float(row[f"test_success/{f}"])
                                      for f in FAMILIES if row.get(f"test_success/{f}") not in (None, "")}})
    return curves


def reward_curves(out: Path, iterations: int) -> dict:
    """Per arm: mean train return and success per iteration (mean over finished seeds), the λ statistics averaged
    over iterations and seeds."""
    res = {}
    dirs = [(arm, out / "delta_check" / arm) for arm in ARMS] + [("grpo (reference)", out / "grpo")]
    for label, d in dirs:
        runs = [_rows(p)[:iterations] for p in sorted(d.glob("seed*/metrics.csv")) if _finished(p.parent, iterations)]
        if not runs:
            continue
        ret = np.array([[float(r["train_return"]) for r in run] for run in runs])
        suc = np.array([[float(r["train_success"]) for r in run] for run in runs])
        lam = {k: float(np.mean([float(r[k]) for run in runs for r in run if r.get(k) not in (None, "")]))
               for k in LAMBDA_KEYS if any(r.get(k) not in (None, "") for run in runs for r in run)}
        half = iterations // 2
        res[label] = {"seeds": len(runs), "train_return": ret.mean(0).tolist(),
                      "train_success": suc.mean(0).tolist(), "return_first_half": float(ret[:, :half].mean()),
                      "return_second_half": float(ret[:, half:].mean()),
                      "success_first_half": float(suc[:, :half].mean()),
                      "success_second_half": float(suc[:, half:].mean()), "lambda": lam}
    return res


def token_table(out: Path, args, env_kwargs: dict, n_show: int = 12, min_count: int = 5) -> dict:
    """Score one batch of rollouts of the start checkpoint with DelTA's coefficients; mean λ per token string."""
    from baselines.core.batch import build_batch
    from baselines.dapo import DAPO

    algo = _algo("delta", args, env_kwargs)
    agent = algo.make_agent(ENV, out / "start", 0)
    algo.setup(agent)
    rng = np.random.default_rng(12345)
    trajs, _ = algo.collect_batch(ENV, agent, 0, rng, env_kwargs=env_kwargs)
    batch = build_batch(trajs, pad_id=algo.pad_id, max_length=algo.config.max_length)
    ctx = algo.prepare(batch)
    adv = algo.compute_advantages(batch, ctx)
    lam = algo.last_token_weights
    base = DAPO.compute_advantages(algo, batch, ctx).adv * batch.gen_mask  # A before the coefficients
    keep = batch.gen_mask & (base != 0)
    tok = agent.tokenizer
    ids = batch.input_ids[keep].tolist()
    vals = lam[keep].tolist()
    side = (base[keep] > 0).tolist()
    agg: dict[str, list] = {}
    for i, v, s in zip(ids, vals, side, strict=True):
        agg.setdefault(tok.decode([i]), []).append((v, s))
    rows = [{"token": t, "count": len(x), "mean_lambda": float(np.mean([v for v, _ in x])),
             "share_above1": float(np.mean([v > 1 for v, _ in x])), "share_pos": float(np.mean([s for _, s in x]))}
            for t, x in agg.items() if len(x) >= min_count]
    rows.sort(key=lambda r: r["mean_lambda"])
    return {"rollouts": len(trajs), "tokens_scored": len(ids), "min_count": min_count,
            "success": float(np.mean([t.success for t in trajs])),
            "fallback": adv.metrics.get("delta_fallback", float("nan")),
            "top": rows[::-1][:n_show], "bottom": rows[:n_show]}


def write(results: Path, out: Path, start: dict, args, wall_s: float, command: str, tokens: dict | None) -> None:
    from benchmarks.learning_lm import summary_table
    from shopsim.paths import write_text_atomic

    rows = summarise(_curves(out, start, args.iterations), start, args.iterations)
    curves = reward_curves(out, args.iterations)
    meta = {"command": command, "commit": git_commit(), "seeds": list(args.seeds), "wall_s": round(wall_s, 1),
            "out": str(out), "protocol": {k: getattr(args, k) for k in (
                "iterations", "rollouts", "group_size", "minibatches", "lr", "temperature", "max_new_tokens",
                "max_turns", "eval_episodes", "eval_every")},
            "arms": {k: {"algo": a, **o} for k, (a, o) in ARMS.items()},
            "start": start}
    results.mkdir(parents=True, exist_ok=True)
    write_text_atomic(results / "delta_check.json", json.dumps(
        {**meta, "rows": rows, "reward_curves": curves, "tokens": tokens}, indent=2, default=float))
    md = ["# DelTA reproduction check (Shopping-v0)", "",
          "Generated by `benchmarks/repro_delta.py`; do not edit by hand.", "",
          f"- command: `{command}`", f"- commit: `{meta['commit']}`", f"- seeds: {', '.join(map(str, args.seeds))}",
          f"- wall time: {wall_s / 60:.1f} min (this invocation; finished runs found in the output folder are reused)",
          f"- start: the learning benchmark's weakened SFT checkpoint (`{out / 'start'}`); budget per run: "
          f"{args.iterations} iterations × {args.rollouts} rollouts (G = {args.group_size}), lr {args.lr}, rollout "
          f"temperature {args.temperature}, {args.minibatches} optimizer steps per iteration; greedy evaluation on "
          f"the first {args.eval_episodes} dev and test tasks of {', '.join(FAMILIES)}, the same episodes for every "
          "run", "- arms: `delta` (defaults, dynamic sampling off), `dapo` (dynamic sampling off, overlong buffer "
          "0.2 like delta), `delta_own` (contrast=own); `grpo (reference)`: the learning benchmark's GRPO runs at "
          "the same budget, when present", "",
          "## Final success", "",
          "Gain = final test success − the start's, per seed; the interval is the 95% Student-t interval of the mean "
          "over seeds.", "", *summary_table(rows), "",
          "## Reward curve", "",
          "Mean training return and success per iteration (sampled rollouts at the rollout temperature, mean over "
          "seeds); a plateau shows as a second half no better than the first.", "",
          "| arm | seeds | return per iteration | return 1st half → 2nd half | success 1st half → 2nd half |",
          "|---|---|---|---|---|"]
    for arm, c in curves.items():
        md.append(f"| {arm} | {c['seeds']} | {' '.join(f'{x:.2f}' for x in c['train_return'])} | "
                  f"{c['return_first_half']:.3f} → {c['return_second_half']:.3f} | "
                  f"{c['success_first_half']:.3f} → {c['success_second_half']:.3f} |")
    md += ["", "## Token coefficients λ", "",
           "Means over iterations and seeds of the per-step statistics (P: tokens of trajectories with A > 0, N: "
           "A < 0; γ± the margin temperatures; fallback: share of steps with only one side, λ = 1).", "",
           "| arm | λ P mean ± std | λ P min / max | λ N mean ± std | λ N min / max | share λ > 1 | γ+ | γ− | "
           "fallback |", "|---|---|---|---|---|---|---|---|---|"]
    for arm, c in curves.items():
        lam = c["lambda"]
        if not lam:
            continue
        md.append(f"| {arm} | {lam['delta_lambda_pos_mean']:.3f} ± {lam['delta_lambda_pos_std']:.3f} | "
                  f"{lam['delta_lambda_pos_min']:.3f} / {lam['delta_lambda_pos_max']:.3f} | "
                  f"{lam['delta_lambda_neg_mean']:.3f} ± {lam['delta_lambda_neg_std']:.3f} | "
                  f"{lam['delta_lambda_neg_min']:.3f} / {lam['delta_lambda_neg_max']:.3f} | "
                  f"{lam['delta_lambda_above1']:.3f} | {lam['delta_gamma_pos']:.3g} | {lam['delta_gamma_neg']:.3g} | "
                  f"{lam['delta_fallback']:.2f} |")
    if tokens:
        md += ["", "## Which tokens get λ > 1", "",
               f"One batch of {tokens['rollouts']} rollouts of the start checkpoint (train tasks, rollout "
               f"temperature, success {tokens['success']:.2f}) scored with DelTA's defaults; {tokens['tokens_scored']}"
               f" tokens with A ≠ 0; token strings seen at least {tokens['min_count']} times, by mean λ "
               "(share_pos: share of the occurrences on the A > 0 side).", ""]
        for title, key in (("highest mean λ", "top"), ("lowest mean λ", "bottom")):
            md += [f"**{title}**", "", "| token | count | mean λ | share λ > 1 | share_pos |", "|---|---|---|---|---|"]
            md += [f"| `{r['token']!r}` | {r['count']} | {r['mean_lambda']:.3f} | {r['share_above1']:.2f} | "
                   f"{r['share_pos']:.2f} |" for r in tokens[key]]
            md.append("")
    write_text_atomic(results / "delta_check.md", "\n".join(md) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="DelTA reproduction check (see module docstring)")
    p.add_argument("--init", default=None, help="SFT checkpoint folder (default data/lm/sft)")
    p.add_argument("--out", default="runs/seedcheck")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write DIR/delta_check.md and .json (the committed check: docs/results; default: none, "
                        "OUT/results with --quick)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rollouts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    add_protocol_arguments(p)
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--no-tokens", action="store_true",
                   help="do not decode tokens again (the table already in the results json is kept)")
    p.add_argument("--quick", action="store_true",
                   help="1 seed, 3 iterations × 8 rollouts (G = 4), 12 eval tasks, into runs/repro_delta_quick with "
                        "its table there (OUT/results unless --results)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.seeds, a.iterations, a.rollouts, a.group_size, a.minibatches = [0], 3, 8, 4, 2
        a.eval_episodes, a.eval_every, a.calib, a.bisect_steps, a.max_turns = 12, 3, 12, 4, 10
        if a.out == p.get_default("out"):
            a.out = "runs/repro_delta_quick"
        if a.results is None:  # a smoke run's table stays beside its runs
            a.results = str(Path(a.out) / "results")
    a.families, a.start = list(FAMILIES), "weaken"
    command = "python -m benchmarks.repro_delta " + shlex.join(sys.argv[1:] if argv is None else argv)
    from agents.lm.agent import LMAgent, default_checkpoint_dir
    from agents.registry import manifest_env_kwargs

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    out = Path(a.out)
    init = Path(a.init) if a.init else default_checkpoint_dir()
    env_kwargs = {**manifest_env_kwargs(init), "max_turns": a.max_turns}
    weaken(init, out / "start", a.target, a.calib, env_kwargs, a.bisect_steps, a)
    start_file = out / "start" / f"eval-{a.eval_episodes}.json"
    if start_file.is_file():
        start = json.loads(start_file.read_text())
    else:
        agent = LMAgent(env_id=ENV, checkpoint=out / "start")
        start = {}
        for split in ("dev", "test"):
            m = evaluate_metrics(agent, split, a.eval_episodes, env_kwargs, a)
            start[split] = m[f"{split}_success"]
            start.update({f"{split}/{f}": m[f"{split}_success/{f}"] for f in FAMILIES if f"{split}_success/{f}" in m})
        start_file.write_text(json.dumps(start))
    results = Path(a.results) if a.results else None
    tokens = None
    if not a.no_tokens:
        tokens = token_table(out, a, env_kwargs)
    elif results is not None and (results / "delta_check.json").is_file():  # keep the tokens an earlier run decoded
        tokens = json.loads((results / "delta_check.json").read_text()).get("tokens")
    for seed in a.seeds:  # seed-major: an interrupted check still compares the arms on the same seeds
        for arm in a.arms:
            secs = train_arm(arm, seed, a, env_kwargs, out)
            print(f"{arm} seed {seed}: {'reused' if secs == 0 else f'{secs:.0f}s'}", flush=True)
            if results is not None:
                write(results, out, start, a, time.perf_counter() - t0, command, tokens)
    if results is not None:
        write(results, out, start, a, time.perf_counter() - t0, command, tokens)
        print(f"wrote {results / 'delta_check.md'}")
    else:
        print("no table written (pass --results DIR, e.g. --results docs/results)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
