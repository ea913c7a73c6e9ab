"""Small reproduction of the CA-PG results (arXiv 2605.26385; docs/algorithms/capg.md) on TwoStageRetrieval-v0.

    python -m benchmarks.repro_capg [--quick] [--ks 5 10 20 50] [--steps N] [--seeds S] [--out runs/repro_capg]
                                    [--results DIR]

For each K (L = 1, optimal LSR, catalog 1000, the released code's optimiser, learning rates and numerics) it
trains v-pg, v-pg-swr, ca-pg and top1 (M = 1; ``--estimators`` adds ca-pg-swr, M = 5) for `--seeds` seeds and
reports per seed:

* the value (softplus(q) + 1 of the shown item, deterministic top-K and LSR, the first `--n-eval` dev contexts) at
  ten points of training, its mean over those points (the area under the curve, a convergence-speed measure), the
  step at which a NaN/Inf gradient stopped the run ("gradient overflow"), and the steps needed to close half of the
  gap between the random and the oracle retriever;
* seconds per 1K gradient steps (cost), also at (K, L) = (20, 5) where the paper compares costs;
* the gradient variance of each M = 1 estimator at fixed parameters, the seed's initial policy and the policy that
  seed's ca-pg run reached: tr Cov of the batch gradient over `--var-batches` independent batches of 128 contexts,
  and tr Cov / ‖mean‖² (scale-free).

What the paper reports: v-pg overflows or stalls as K grows; ca-pg and top1 converge faster than v-pg-swr; top1 is the
cheapest per step; ca-pg's gradient variance is far below v-pg's. The paper's runs use 500K steps and 5 seeds; the
default here (2,000 steps, sized so that 48 runs fit in about 40 minutes on a shared 2-core machine; the standard tier
trains 3,000) is the early part of those curves.

Every run writes ``OUT/K<k>_L<l>/<estimator>_s<seed>/result.json`` (and every variance measurement
``OUT/K<k>_L1/variance_s<seed>.json``); a later call with the same settings reuses them, so a sweep can be stopped
and extended (more seeds, more K) without retraining. Writes ``OUT/results.json`` and ``OUT/repro_capg.png``; with
``--results DIR`` also ``DIR/capg_k.md`` and ``DIR/capg_k.json`` (command, commit, seeds, wall time).
The committed table: ``python -m benchmarks.repro_capg --results docs/results``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from shopsim.paths import write_text_atomic

ENV = "shopsim/TwoStageRetrieval-v0"
ESTIMATORS = ("vpg", "vpg_swr", "capg", "top1", "capg_swr")
#: the estimators of the K sweep by default: the card's K claims compare these (ca-pg-swr is its MoE variant)
K_ESTIMATORS = ("vpg", "vpg_swr", "capg", "top1")
ROOT = Path(__file__).resolve().parents[1]
TABLE = "capg_k.md"


def reference_values(k: int, n_shown: int, n_eval: int) -> dict:
    from agents.retrieval_policies import RandomRetriever
    from shopsim.envs.two_stage_retrieval import TwoStageRetrievalSim, load_splits

    sim = TwoStageRetrievalSim(k=k, l=n_shown)
    ids = np.asarray(load_splits()["dev"][:n_eval])
    x, rng = sim.contexts(ids), np.random.default_rng(0)
    rand = RandomRetriever(env_kwargs={"k": k, "l": n_shown}, seed=0).sample(len(x))
    return {"random": float(sim.evaluate_batch(x, rand, rng, deterministic=True).value.mean()),
            "oracle": float(sim.evaluate_batch(x, sim.oracle_candidates(x), rng, deterministic=True).value.mean())}


def _run_dir(out: Path, name: str, k: int, n_shown: int, seed: int) -> Path:
    return out / f"K{k}_L{n_shown}" / f"{name}_s{seed}"


def run_one(name: str, k: int, n_shown: int, steps: int, seed: int, eval_steps: int, n_eval: int, out: Path,
            user_tower: str = "linear") -> dict:
    """Train one run (or reuse its ``result.json`` when it was recorded with the same settings)."""
    import baselines

    d = _run_dir(out, name, k, n_shown, seed)
    key = {"steps": steps, "eval_steps": eval_steps, "n_eval": n_eval, "user_tower": user_tower}
    path = d / "result.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("key") == key:
            old["reused"] = True
            return old
    iterations = max(1, steps // 10)
    algo = baselines.make(name, env_id=ENV, env_kwargs={"k": k, "l": n_shown},
                          eval_every=max(1, eval_steps // 10), eval_contexts=n_eval, user_tower=user_tower)
    algo.config.checkpoint_every = iterations  # read by the shared loop: save the checkpoint after the last only
    t0 = time.perf_counter()
    res = algo.train(ENV, iterations=iterations, seed=seed, out_dir=d, progress=False, resume=False)
    h = res.history
    curve = [(r["step"], r["value"]) for r in h if "value" in r]
    overflow = h[-1]["overflow"] == 1
    rec = {"key": key, "estimator": name, "k": k, "l": n_shown, "seed": seed, "curve": curve,
           "overflow_step": h[-1]["step"] if overflow else None, "steps": h[-1]["step"],
           "sec_per_1k": 1000 * h[-1]["train_seconds"] / max(h[-1]["step"], 1),
           "final": curve[-1][1] if curve else float("nan"),
           "auc": float(np.mean([v for _, v in curve])) if curve else float("nan"),
           "score_max": h[-1].get("score_max", float("nan")),
           "checkpoint": None if res.checkpoint is None else str(Path(res.checkpoint).relative_to(out)),
           "wall_s": time.perf_counter() - t0}
    write_text_atomic(path, json.dumps(rec, default=float))
    rec["reused"] = False
    return rec


def variance(name: str, k: int, agent, batches: int, user_tower: str = "linear", seed: int = 0) -> dict:
    import baselines
    from baselines.capg import gradient_variance
    from shopsim.envs.two_stage_retrieval import TwoStageRetrievalSim

    trainer = baselines.make(name, env_id=ENV, env_kwargs={"k": k}, user_tower=user_tower)
    return gradient_variance(trainer, agent, TwoStageRetrievalSim(k=k), batches=batches, batch_size=128, seed=seed)


def variance_at(k: int, seed: int, names, batches: int, tower: str, capg_run: dict | None, out: Path) -> dict:
    """tr Cov of each M = 1 estimator at the seed's initial policy and at its trained ca-pg policy (cached)."""
    from agents.retrieval_policies import PLRetriever

    path = out / f"K{k}_L1" / f"variance_s{seed}.json"
    key = {"batches": batches, "user_tower": tower, "estimators": list(names),
           "trained_from": None if capg_run is None else capg_run["checkpoint"]}
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("key") == key:
            return old
    t0 = time.perf_counter()
    init = PLRetriever(env_kwargs={"k": k}, num_experts=1, seed=seed, n_users=1000 if tower == "id" else None)
    rec: dict = {"key": key, "init": {n: variance(n, k, init, batches, tower, seed) for n in names}}
    if capg_run is not None and capg_run["checkpoint"] is not None:
        trained = PLRetriever.from_checkpoint(out / capg_run["checkpoint"], env_id=ENV)
        rec["trained"] = {n: variance(n, k, trained, batches, tower, seed) for n in names}
    rec["wall_s"] = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(rec, default=float))
    return rec


def _commit() -> str:
    from shopsim.leaderboard.results import git_commit

    return git_commit(ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000 steps per run, 1 seed, small evaluation")
    ap.add_argument("--ks", type=int, nargs="+", default=[5, 10, 20, 50])
    ap.add_argument("--steps", type=int, default=None, help="gradient steps per run (default 2,000; quick 1,000)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..S-1 per run (default 3; quick 1)")
    ap.add_argument("--estimators", nargs="+", default=list(K_ESTIMATORS), choices=ESTIMATORS)
    ap.add_argument("--n-eval", type=int, default=None, help="dev contexts per evaluation (default 2,000)")
    ap.add_argument("--var-batches", type=int, default=None, help="batches per gradient variance (default 64)")
    ap.add_argument("--cost-steps", type=int, default=None,
                    help="gradient steps of each timing run at (K, L) = (20, 5) (default 300; quick 100)")
    ap.add_argument("--user-tower", default="linear", choices=["linear", "id"],
                    help="linear: u = Wx, evaluated on held-out dev users; id: one embedding per user of a pool of "
                         "1,000 (the released code's model), evaluated on fresh draws of that pool")
    ap.add_argument("--out", default="runs/repro_capg", help="per-run results (reused when present)")
    ap.add_argument("--results", default=None,
                    help=f"write DIR/{TABLE} and DIR/capg_k.json (the committed table: docs/results)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    steps = args.steps or (1000 if args.quick else 2000)
    seeds = list(range(args.seeds or (1 if args.quick else 3)))
    n_eval = args.n_eval or (1000 if args.quick else 2000)
    var_batches = args.var_batches or (16 if args.quick else 64)
    cost_steps = args.cost_steps or (100 if args.quick else 300)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tower, names = args.user_tower, list(args.estimators)
    m1 = [n for n in names if n != "capg_swr"]
    results: dict = {"command": "python -m benchmarks.repro_capg " + shlex.join(sys.argv[1:] if argv is None else argv),
                     "commit": _commit(), "machine": f"{platform.machine()}, torch {torch.__version__}, threads 1",
                     "steps": steps, "seeds": seeds, "n_eval": n_eval, "var_batches": var_batches,
                     "cost_steps": cost_steps, "user_tower": tower, "estimators": names, "per_k": {}}
    t_start = time.perf_counter()
    compute = 0.0
    for k in args.ks:
        ref = reference_values(k, 1, n_eval)
        half = ref["random"] + 0.5 * (ref["oracle"] - ref["random"])
        per: dict = {"ref": ref, "runs": {}, "variance": {}}
        for name in names:
            runs = []
            for s in seeds:
                r = run_one(name, k, 1, steps, s, max(steps // 10, 10), n_eval, out, tower)
                r["steps_to_half_gap"] = next((st for st, v in r["curve"] if v >= half), None)
                compute += r["wall_s"]
                runs.append({key: v for key, v in r.items() if key not in ("key", "reused")})
                print(f"K={k:3d} {name:9s} seed {s}: final {r['final']:.3f} auc {r['auc']:.3f} overflow "
                      f"{r['overflow_step']} to-half {r['steps_to_half_gap']} {r['sec_per_1k']:.1f}s/1k "
                      f"max|s| {r['score_max']:.3g}{' (reused)' if r['reused'] else ''} "
                      f"[{time.perf_counter() - t_start:.0f}s]", flush=True)
            per["runs"][name] = runs
        for s in seeds:
            capg_run = next((r for r in per["runs"].get("capg", []) if r["seed"] == s), None)
            v = variance_at(k, s, m1, var_batches, tower, capg_run, out)
            compute += v["wall_s"]
            for n in m1:
                for where in ("init", "trained"):
                    if where in v:
                        per["variance"].setdefault(n, {}).setdefault(where, []).append(v[where][n])
        results["per_k"][str(k)] = per
    # cost at (K, L) = (20, 5), the paper's timing setting
    cost: dict = {}
    for name in names:
        for s in seeds:
            r = run_one(name, 20, 5, cost_steps, s, 10 * cost_steps, 500, out, tower)
            compute += r["wall_s"]
            cost.setdefault(name, []).append(r["sec_per_1k"])
    results["cost_K20_L5"] = cost
    results["wall_s"] = time.perf_counter() - t_start
    results["compute_s"] = compute
    write_text_atomic(out / "results.json", json.dumps(results, indent=1, default=float))
    print_tables(results, names)
    plot(results, names, out / "repro_capg.png")
    print(f"wrote {out / 'results.json'} and {out / 'repro_capg.png'}  ({results['wall_s']:.0f}s)")
    if args.results:
        d = Path(args.results)
        d.mkdir(parents=True, exist_ok=True)
        write_text_atomic(d / "capg_k.json", json.dumps(results, indent=1, default=float) + "\n")
        write_text_atomic(d / TABLE, to_markdown(results, names))
        print(f"wrote {d / TABLE} and {d / 'capg_k.json'}")
    return 0


def _fmt(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def _ms(vals) -> str:
    v = [x for x in vals if x is not None and math.isfinite(x)]
    if not v:
        return "-"
    return f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def to_markdown(results: dict, names) -> str:
    """The committed table: value, overflow, cost and gradient variance per K and estimator."""
    ks = list(results["per_k"])
    lines = ["# The CA-PG family as K grows (TwoStageRetrieval-v0, L = 1, optimal LSR)", "",
             "Generated by `benchmarks/repro_capg.py`; do not edit by hand.", "",
             f"- command: `{results['command']}`", f"- commit: `{results['commit']}`",
             f"- machine: {results['machine']}",
             f"- seeds: {', '.join(map(str, results['seeds']))}; {results['steps']:,} gradient steps of 128 contexts "
             f"per run (the paper: 500K steps, 5 seeds); value on the first {results['n_eval']:,} dev contexts at "
             "ten points of training",
             f"- wall time: {results['wall_s']:.0f} s this call; {results['compute_s']:.0f} s of training and "
             "measurement in all (runs reused from earlier calls count with their own time)", "",
             "## Value", "",
             "Mean ± sd over seeds. *final*: value after the last step (or at the overflow); *AUC*: mean of the ten "
             "evaluated values (higher = faster convergence); *ovf*: seeds stopped by a NaN/Inf gradient, with the "
             "earliest step; *half@*: steps to close half of the random → oracle gap (earliest seed; - = never).", "",
             "| K | random | oracle | estimator | final | AUC | ovf | half@ |", "|---|---|---|---|---|---|---|---|"]
    for k in ks:
        per = results["per_k"][k]
        for n in names:
            runs = per["runs"][n]
            ovf = [r["overflow_step"] for r in runs if r["overflow_step"] is not None]
            halfs = [r["steps_to_half_gap"] for r in runs if r["steps_to_half_gap"] is not None]
            lines.append(f"| {k} | {per['ref']['random']:.3f} | {per['ref']['oracle']:.3f} | {n} | "
                         f"{_ms([r['final'] for r in runs])} | {_ms([r['auc'] for r in runs])} | "
                         f"{len(ovf)}/{len(runs)}{f' (@{min(ovf)})' if ovf else ''} | "
                         f"{min(halfs) if halfs else '-'} |")
    lines += ["", "## Value curves (mean over seeds; runs stopped by overflow hold their last value)", ""]
    for k in ks:
        per = results["per_k"][k]
        steps = sorted({st for n in names for r in per["runs"][n] for st, _ in r["curve"]})
        grid = [st for st in steps if st % max(1, results["steps"] // 10) == 0] or steps
        lines += [f"K = {k}:", "", "| estimator | " + " | ".join(str(st) for st in grid) + " |",
                  "|---|" + "---|" * len(grid)]
        for n in names:
            cells = []
            for st in grid:
                vals = []
                for r in per["runs"][n]:
                    before = [v for s, v in r["curve"] if s <= st]
                    vals.append(before[-1] if before else float("nan"))
                cells.append(f"{np.nanmean(vals):.3f}" if any(math.isfinite(v) for v in vals) else "-")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Seconds per 1K gradient steps (mean ± sd over seeds)", "",
              "| setting | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in ks:
        lines.append(f"| K = {k}, L = 1 | " + " | ".join(
            _ms([r["sec_per_1k"] for r in results["per_k"][k]["runs"][n]]) for n in names) + " |")
    lines.append(f"| K = 20, L = 5 ({results['cost_steps']} steps) | "
                 + " | ".join(_ms(results["cost_K20_L5"][n]) for n in names) + " |")
    m1 = [n for n in names if n != "capg_swr"]
    lines += ["", "## Gradient variance at fixed parameters", "",
              f"tr Cov of the batch gradient over {results['var_batches']} batches of 128 contexts (geometric mean "
              "over seeds; in brackets tr Cov / ‖mean gradient‖²). *init*: each seed's initial policy; *trained*: the "
              "policy that seed's ca-pg run reached. inf: a NaN/Inf gradient in some batch.", "",
              "| K | parameters | " + " | ".join(m1) + " |", "|---|---|" + "---|" * len(m1)]
    for k in ks:
        var = results["per_k"][k]["variance"]
        for where in ("init", "trained"):
            if not all(where in var.get(n, {}) for n in m1):
                continue
            lines.append(f"| {k} | {where} | " + " | ".join(
                f"{_geo([c['trace_cov'] for c in var[n][where]])} ({_geo([c['relative'] for c in var[n][where]])})"
                for n in m1) + " |")
    return "\n".join(lines) + "\n"


def _geo(vals) -> str:
    v = np.asarray(vals, dtype=float)
    if not np.all(np.isfinite(v)):
        return "inf"
    return f"{float(np.exp(np.mean(np.log(np.maximum(v, 1e-300))))):.3g}"


def print_tables(results: dict, names) -> None:
    print("\n" + to_markdown(results, names))


def plot(results: dict, names, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(results["per_k"])
    fig, axes = plt.subplots(1, len(ks) + 1, figsize=(4.2 * (len(ks) + 1), 3.6))
    for ax, k in zip(axes, ks, strict=False):
        per = results["per_k"][k]
        for i_n, n in enumerate(names):
            for i, r in enumerate(per["runs"][n]):
                if not r["curve"]:
                    continue
                st, v = zip(*r["curve"], strict=False)
                ax.plot(st, v, label=n if i == 0 else None, alpha=0.8, color=f"C{i_n}")
                if r["overflow_step"] is not None:
                    ax.plot([st[-1]], [v[-1]], "x", color=f"C{i_n}", markersize=9)
        ax.axhline(per["ref"]["oracle"], ls="--", c="k", lw=0.8)
        ax.axhline(per["ref"]["random"], ls=":", c="gray", lw=0.8)
        ax.set_title(f"K = {k}, L = 1 (x = gradient overflow)")
        ax.set_xlabel("gradient steps")
        ax.set_ylabel("value")
    axes[0].legend(fontsize=8)
    ax = axes[-1]
    m1 = [n for n in names if n != "capg_swr"]
    width = 0.8 / max(len(m1), 1)
    for i, n in enumerate(m1):
        vals = [float(np.mean([c["trace_cov"] for c in results["per_k"][k]["variance"][n]["init"]])) for k in ks]
        ax.bar(np.arange(len(ks)) + i * width, vals, width, label=n)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(ks)) + 0.4, [f"K={k}" for k in ks])
    ax.set_title("gradient variance at init (tr Cov)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
