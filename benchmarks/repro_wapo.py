"""WAPO's reproduction check on Shopping-v0: stability and entropy of WAPO against GRPO at the same budget.

    python -m benchmarks.repro_wapo [--out runs/seedcheck] [--seeds 0 1 2] [--iterations 10] [--no-grpo-bins]
        [--results DIR]
    python -m benchmarks.repro_wapo --out runs/seedcheck --results docs/results    # the committed check

The card's claim (arXiv 2606.16154; docs/algorithms/wapo.md): trained on positive-advantage trajectories only, WAPO
trains stably (no entropy collapse or blow-up, no grad-norm spikes) and ends at or above GRPO; in GRPO runs that
destabilise, negative-advantage updates dominate before the entropy moves sharply.

Protocol: the learning benchmark's (`benchmarks.learning_lm`): the shipped SFT checkpoint weakened to about 0.30
dev success (``OUT/start``, built or reused), ``--iterations`` × ``--rollouts`` rollouts in groups of
``--group-size``, the same learning rate for every arm (``--lr``, the benchmark's common 1e-4, not WAPO's card
default 1e-5), ``--minibatches`` optimizer steps per iteration, rollout temperature 0.5, greedy dev/test evaluation
on fixed episodes. Arms, each with ``--seeds``:

* ``wapo``: `baselines.wapo.WAPO`, in ``OUT/wapo/seed<S>``;
* ``grpo``: the learning benchmark's GRPO runs in ``OUT/grpo/seed<S>``, read only (run them with
  ``python -m benchmarks.learning_lm --algos grpo``; the seeds not finished yet are left out of the table). Their
  metrics hold no entropy and no token bins;
* ``grpo+bins``: the same GRPO with WAPO's logging (the four token bins and the entropy over every generated token,
  `TokenBinLogging`; the update is unchanged), in ``OUT/wapo_check/grpo/seed<S>`` (``--no-grpo-bins``: skipped).

A finished run in OUT is reused, not retrained. Prints the table; with ``--results DIR`` writes
``DIR/wapo_check.md`` and ``wapo_check.json`` (``--results docs/results``: the committed check; without it no table
is written): final dev/test success, per-iteration means over seeds of train success, grad norm, entropy and the
bins, and stability indicators (largest grad norm, largest iteration-to-iteration entropy change), with the command,
git commit, seeds and wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from baselines.grpo import GRPO
from baselines.wapo import TokenBinLogging
from benchmarks.learning_lm import (
    ENV,
    FAMILIES,
    _algo,
    _train_one,
    add_protocol_arguments,
    evaluate_metrics,
    protocol_env_kwargs,
    weaken,
)
from shopsim.leaderboard.results import git_commit

BINS = ("pos_peak", "pos_valley", "neg_peak", "neg_valley", "zero_adv_tokens")


class GRPOBins(TokenBinLogging, GRPO):
    """GRPO with WAPO's logging-only token bins and entropy over all generated tokens (same update as GRPO)."""

    name = "grpo"




def _read(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: float(v) if v not in ("", None) else None for k, v in row.items()} for row in csv.DictReader(f)]


def _train_grpo_bins(seed: int, args, env_kwargs: dict, out: Path) -> float:
    torch.set_num_threads(args.threads)
    base = _algo("grpo", args, env_kwargs)  # the learning benchmark's GRPO settings, unchanged
    cfg = {f: getattr(base.config, f) for f in base.config.__dataclass_fields__}
    t = time.perf_counter()
    GRPOBins(**cfg).train(ENV, iterations=args.iterations, seed=seed, out_dir=out / "wapo_check" / "grpo" /
                          f"seed{seed}", init=out / "start", progress=not args.no_progress)
    return time.perf_counter() - t


def _finished(path: Path, iterations: int) -> bool:
    return path.is_file() and len(_read(path)) >= iterations


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    return float(np.mean(xs)) if xs else float("nan")


def _arm_summary(runs: dict[int, list[dict]], iterations: int, start: dict) -> dict:
    """Per-iteration means over seeds and end-of-run numbers of one arm."""
    its = list(range(1, iterations + 1))

    def col(key):
        return [[next((r.get(key) for r in rows if int(r["iteration"]) == i), None) for rows in runs.values()]
                for i in its]

    curve = {k: [_mean(v) for v in col(k)] for k in ("train_success", "grad_norm", "entropy", "entropy_gen",
                                                     "zero_variance_groups", "no_winner_groups", "loss_policy",
                                                     *BINS)}
    final = {}
    for split in ("dev", "test"):
        vals = [next((r.get(f"{split}_success") for r in rows if int(r["iteration"]) == iterations), None)
                for rows in runs.values()]
        final[split] = {"per_seed": vals, "mean": _mean(vals),
                        "std": float(np.std([v for v in vals if v is not None])) if any(v is not None for v in vals)
                        else float("nan"), "start": start.get(split)}
    per_seed = {}
    for seed, rows in runs.items():
        gn = [r.get("grad_norm") for r in rows]
        ent = [r.get("entropy_gen") for r in rows]
        ent = [e for e in ent if e is not None]
        per_seed[seed] = {
            "grad_norm_max": max((g for g in gn if g is not None), default=float("nan")),
            "entropy_first": ent[0] if ent else None, "entropy_last": ent[-1] if ent else None,
            "entropy_max_step_change": max((abs(b - a) for a, b in zip(ent, ent[1:], strict=False)), default=None)
            if ent else None,
            "neg_share_mean": _mean([(r.get("neg_peak") or 0) + (r.get("neg_valley") or 0) for r in rows])
            if rows and rows[0].get("neg_peak") is not None else None,
            "wall_s": float(sum((r.get("rollout_s") or 0) + (r.get("update_s") or 0) for r in rows)),
        }
    return {"seeds": sorted(runs), "curve": curve, "final": final, "per_seed": per_seed}


def _fmt(x, nd=3) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def _markdown(res: dict) -> str:
    arms = res["arms"]
    a = res["args"]
    lines = ["# WAPO reproduction check: stability and entropy against GRPO (Shopping-v0)", "",
             "Generated by `benchmarks/repro_wapo.py`; do not edit by hand.", "",
             f"Command: `{res['command']}`  ", f"Git commit: `{res['git_commit']}`  ",
             f"Seeds: {a['seeds']}; {a['iterations']} iterations × {a['rollouts']} rollouts (G = {a['group_size']}), "
             f"lr {a['lr']} for every arm (the learning benchmark's common rate; WAPO's card default is 1e-5), "
             f"{a['minibatches']} optimizer steps per iteration, rollout temperature {a['temperature']}, "
             f"{a['eval_episodes']} greedy dev and test episodes at the end.  ",
             f"Wall time of this invocation: {res['wall_s']:.0f} s (finished runs are reused, not retrained; "
             f"rollout + update time of all the runs in the tables, summed from their metrics.csv: "
             f"{res['train_s']:.0f} s, per run in the last table).", "",
             "Arms: `wapo` (this repository's WAPO); `grpo` (the learning benchmark's GRPO runs, which log no "
             "entropy and no token bins); `grpo+bins` (the same GRPO update with WAPO's logging-only bins and "
             "entropy over every generated token).", "",
             "## Final success", "",
             "| arm | seeds | dev start | dev final (mean ± std) | dev per seed | test start | test final (mean ± std) "
             "| test per seed |", "|---|---|---|---|---|---|---|---|"]
    for name, s in arms.items():
        d, t = s["final"]["dev"], s["final"]["test"]
        lines.append(f"| {name} | {len(s['seeds'])} | {_fmt(d['start'], 2)} | "
                     f"{_fmt(d['mean'], 2)} ± {_fmt(d['std'], 2)} | {' '.join(_fmt(v, 2) for v in d['per_seed'])} | "
                     f"{_fmt(t['start'], 2)} | "
                     f"{_fmt(t['mean'], 2)} ± {_fmt(t['std'], 2)} | {' '.join(_fmt(v, 2) for v in t['per_seed'])} |")
    lines += ["", "## Over iterations (means over seeds)", "",
              "Train success of the rollouts, grad norm (before clipping at 1.0), entropy over every generated token "
              "(`entropy_gen`), share of generated tokens with negative advantage (neg_peak + neg_valley; only "
              "GRPO trains on them), share of groups with no signal.", ""]
    head = "| iteration |"
    sep = "|---|"
    for name in arms:
        head += f" {name} success | {name} grad norm | {name} entropy | {name} neg share |"
        sep += "---|---|---|---|"
    lines += [head, sep]
    for i in range(a["iterations"]):
        row = f"| {i + 1} |"
        for s in arms.values():
            c = s["curve"]
            neg = c["neg_peak"][i] + c["neg_valley"][i] if np.isfinite(c["neg_peak"][i]) else None
            row += (f" {_fmt(c['train_success'][i], 2)} | {_fmt(c['grad_norm'][i])} | {_fmt(c['entropy_gen'][i])} |"
                    f" {_fmt(neg)} |")
        lines.append(row)
    lines += ["", "## Token bins (mean over iterations and seeds)", "",
              "Shares of the generated tokens: peak = π(y_t) ≥ Σ_v π(v)², × sign of the advantage; WAPO trains only "
              "the `pos_*` tokens, GRPO all of them. Groups with no signal: all rewards equal.", "",
              "| arm | pos_peak | pos_valley | neg_peak | neg_valley | zero_adv_tokens | groups with no signal |",
              "|---|---|---|---|---|---|---|"]
    for name, s in arms.items():
        c = s["curve"]
        nosig = c["no_winner_groups"] if name == "wapo" else c["zero_variance_groups"]
        lines.append(f"| {name} | " + " | ".join(_fmt(_mean(c[b])) for b in BINS) + f" | {_fmt(_mean(nosig), 2)} |")
    lines += ["", "## Stability per run", "",
              "| arm | seed | largest grad norm | entropy first → last | largest change between iterations | "
              "mean neg share | train s |", "|---|---|---|---|---|---|---|"]
    for name, s in arms.items():
        for seed, p in s["per_seed"].items():
            lines.append(f"| {name} | {seed} | {_fmt(p['grad_norm_max'])} | {_fmt(p['entropy_first'])} → "
                         f"{_fmt(p['entropy_last'])} | {_fmt(p['entropy_max_step_change'])} | "
                         f"{_fmt(p['neg_share_mean'])} | {p['wall_s']:.0f} |")
    lines += ["", "## Reading", "", *res["reading"], ""]
    return "\n".join(lines)


def _reading(arms: dict) -> list[str]:
    """Plain statements of what the numbers show, computed from them (no hand-written claims)."""
    out = []
    w = arms.get("wapo")
    for ref_name in ("grpo", "grpo+bins"):
        ref = arms.get(ref_name)
        if not (w and ref):
            continue
        for split in ("dev", "test"):
            dw, dg = w["final"][split]["mean"], ref["final"][split]["mean"]
            verdict = "at or above" if dw >= dg else "below"
            out.append(f"- Final {split} success: wapo {dw:.2f} vs {ref_name} {dg:.2f} ({verdict}; "
                       f"{len(w['seeds'])} vs {len(ref['seeds'])} seeds, std {w['final'][split]['std']:.2f} / "
                       f"{ref['final'][split]['std']:.2f}).")
    for name, s in arms.items():
        gn = [p["grad_norm_max"] for p in s["per_seed"].values()]
        ch = [p["entropy_max_step_change"] for p in s["per_seed"].values() if p["entropy_max_step_change"] is not None]
        first = [p["entropy_first"] for p in s["per_seed"].values() if p["entropy_first"] is not None]
        last = [p["entropy_last"] for p in s["per_seed"].values() if p["entropy_last"] is not None]
        msg = f"- {name}: largest grad norm over runs {max(gn):.3f}"
        if first:
            msg += f"; entropy over generated tokens {np.mean(first):.3f} → {np.mean(last):.3f} (mean over seeds)"
            if ch:
                msg += f", largest change between two iterations {max(ch):.3f}"
        else:
            msg += "; no entropy logged"
        out.append(msg + ".")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="WAPO vs GRPO stability check (see module docstring)")
    p.add_argument("--init", default=None, help="SFT checkpoint folder (default data/lm/sft)")
    p.add_argument("--out", default="runs/seedcheck")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write DIR/wapo_check.md and .json (the committed check: docs/results; default: none)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rollouts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    add_protocol_arguments(p)
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--no-grpo-bins", action="store_true", help="skip the GRPO runs with logged bins and entropy")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.value_pretrain_steps, args.max_gen_batches = 20, 3  # read by learning_lm._algo for vapo/dapo only
    from agents.lm.agent import LMAgent, default_checkpoint_dir

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    init = Path(args.init) if args.init else default_checkpoint_dir()
    env_kwargs = protocol_env_kwargs(init, args)
    weaken(init, out / "start", args.target, args.calib, env_kwargs, args.bisect_steps, args)
    start_file = out / "start" / f"eval-{args.eval_episodes}.json"
    if start_file.is_file():
        start = json.loads(start_file.read_text())
    else:
        agent = LMAgent(env_id=ENV, checkpoint=out / "start")
        start = {s: evaluate_metrics(agent, s, args.eval_episodes, env_kwargs, args)[f"{s}_success"]
                 for s in ("dev", "test")}
        start_file.write_text(json.dumps(start))
    for seed in args.seeds:
        print(f"wapo seed {seed}", flush=True)
        _train_one(("wapo", seed, args, env_kwargs, out, None))
    if not args.no_grpo_bins:
        for seed in args.seeds:
            print(f"grpo+bins seed {seed}", flush=True)
            _train_grpo_bins(seed, args, env_kwargs, out)
    paths = {"wapo": out / "wapo", "grpo": out / "grpo", "grpo+bins": out / "wapo_check" / "grpo"}
    arms = {}
    for name, folder in paths.items():
        runs = {s: _read(folder / f"seed{s}" / "metrics.csv") for s in args.seeds
                if _finished(folder / f"seed{s}" / "metrics.csv", args.iterations)}
        if runs:
            arms[name] = _arm_summary(runs, args.iterations, start)
    res = {"command": "python -m benchmarks.repro_wapo " + " ".join(sys.argv[1:] if argv is None else argv),
           "git_commit": git_commit(), "args": {k: v for k, v in vars(args).items()}, "start": start,
           "families": list(FAMILIES), "wall_s": time.perf_counter() - t0, "arms": arms}
    res["train_s"] = float(sum(p["wall_s"] for s in arms.values() for p in s["per_seed"].values()))
    res["reading"] = _reading(arms)
    md = _markdown(res)
    if args.results:
        results = Path(args.results)
        results.mkdir(parents=True, exist_ok=True)
        from shopsim.paths import write_text_atomic

        write_text_atomic(results / "wapo_check.json", json.dumps(res, indent=2, default=float))
        write_text_atomic(results / "wapo_check.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
