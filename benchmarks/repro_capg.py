"""Small reproduction of the CA-PG results (arXiv 2605.26385; docs/algorithms/capg.md) on TwoStageRetrieval-v0.

    python -m benchmarks.repro_capg [--quick] [--ks 5 10 20 50] [--steps N] [--seeds S] [--out runs/repro_capg]

For each K (L = 1, optimal LSR, catalog 1000, the released code's optimiser, learning rates and numerics) it
trains v-pg, v-pg-swr, ca-pg, top1 (M = 1) and ca-pg-swr (M = 5) and reports:

* the value (softplus(q) + 1 of the shown item, deterministic top-K and LSR, dev contexts) over training, the step at
  which a NaN/Inf gradient stopped the run ("gradient overflow"), and the steps needed to close half of the gap
  between the random and the oracle retriever (convergence speed);
* seconds per 1K gradient steps (cost), also at (K, L) = (20, 5) where the paper compares costs;
* the measured gradient variance of each estimator at fixed parameters (the initial policy, and the policy ca-pg
  reached): tr Cov of the batch gradient over independent batches, and tr Cov / ‖mean‖² (scale-free).

What the paper reports: v-pg overflows or stalls as K grows; ca-pg and top1 converge faster than v-pg-swr; top1 is the
cheapest per step; ca-pg's gradient variance is far below v-pg's. The paper's runs use 500K steps and 5 seeds; the
default here is far shorter (CPU, minutes), so the numbers are the early part of those curves.
Writes a table to stdout, `results.json` and `repro_capg.png` under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

ENV = "shopsim/TwoStageRetrieval-v0"
ESTIMATORS = ("vpg", "vpg_swr", "capg", "top1", "capg_swr")


def reference_values(k: int, n_shown: int, n_eval: int) -> dict:
    from agents.retrieval_policies import RandomRetriever
    from shopsim.envs.two_stage_retrieval import TwoStageRetrievalSim, load_splits

    sim = TwoStageRetrievalSim(k=k, l=n_shown)
    ids = np.asarray(load_splits()["dev"][:n_eval])
    x, rng = sim.contexts(ids), np.random.default_rng(0)
    rand = RandomRetriever(env_kwargs={"k": k, "l": n_shown}, seed=0).sample(len(x))
    return {"random": float(sim.evaluate_batch(x, rand, rng, deterministic=True).value.mean()),
            "oracle": float(sim.evaluate_batch(x, sim.oracle_candidates(x), rng, deterministic=True).value.mean())}


def run_one(name: str, k: int, n_shown: int, steps: int, seed: int, eval_steps: int, n_eval: int, out: Path,
            user_tower: str = "linear") -> dict:
    import baselines

    algo = baselines.make(name, env_id=ENV, env_kwargs={"k": k, "l": n_shown}, eval_every=max(1, eval_steps // 10),
                          eval_contexts=n_eval, user_tower=user_tower)
    res = algo.train(ENV, iterations=max(1, steps // 10), seed=seed,
                     out_dir=out / f"K{k}_L{n_shown}" / f"{name}_s{seed}", progress=False)
    h = res.history
    curve = [(r["step"], r["value"]) for r in h if "value" in r]
    overflow = h[-1]["overflow"] == 1
    return {"curve": curve, "overflow_step": h[-1]["step"] if overflow else None, "steps": h[-1]["step"],
            "sec_per_1k": 1000 * h[-1]["train_seconds"] / max(h[-1]["step"], 1), "agent": res.agent,
            "final": curve[-1][1] if curve else float("nan"), "score_max": h[-1].get("score_max", float("nan"))}


def variance(name: str, k: int, agent, batches: int, user_tower: str = "linear") -> dict:
    import baselines
    from baselines.capg import gradient_variance
    from shopsim.envs.two_stage_retrieval import TwoStageRetrievalSim

    trainer = baselines.make(name, env_id=ENV, env_kwargs={"k": k}, user_tower=user_tower)
    return gradient_variance(trainer, agent, TwoStageRetrievalSim(k=k), batches=batches, batch_size=128)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000 steps per run, 1 seed, small evaluation")
    ap.add_argument("--ks", type=int, nargs="+", default=[5, 10, 20, 50])
    ap.add_argument("--steps", type=int, default=None, help="gradient steps per run (default 5,000; quick 1,000)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per run (default 2; quick 1)")
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    ap.add_argument("--user-tower", default="linear", choices=["linear", "id"],
                    help="linear: u = Wx, evaluated on held-out dev users; id: one embedding per user of a pool of "
                         "1,000 (the released code's model), evaluated on fresh draws of that pool")
    ap.add_argument("--out", default="runs/repro_capg")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from agents.retrieval_policies import MoERetriever, PLRetriever

    steps = args.steps or (1000 if args.quick else 5000)
    seeds = args.seeds or (1 if args.quick else 2)
    n_eval = 2000 if args.quick else 10_000
    var_batches = 16 if args.quick else 64
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tower = args.user_tower
    results: dict = {"steps": steps, "seeds": seeds, "n_eval": n_eval, "user_tower": tower, "per_k": {}}
    t_start = time.perf_counter()
    for k in args.ks:
        ref = reference_values(k, 1, n_eval)
        half = ref["random"] + 0.5 * (ref["oracle"] - ref["random"])
        per = {"ref": ref, "runs": {}, "variance": {}}
        trained_capg = None
        for name in args.estimators:
            runs = [run_one(name, k, 1, steps, s, max(steps // 10, 10), n_eval, out, tower) for s in range(seeds)]
            to_half = [next((st for st, v in r["curve"] if v >= half), None) for r in runs]
            per["runs"][name] = {
                "final_value": float(np.mean([r["final"] for r in runs])),
                "best_value": float(np.mean([max(v for _, v in r["curve"]) for r in runs])),
                "overflow_steps": [r["overflow_step"] for r in runs],
                "steps_to_half_gap": to_half,
                "sec_per_1k_steps": float(np.mean([r["sec_per_1k"] for r in runs])),
                "final_score_max": float(np.max([r["score_max"] for r in runs])),
                "curves": [r["curve"] for r in runs],
            }
            if name == "capg":
                trained_capg = runs[0]["agent"]
            print(f"K={k:3d} {name:9s} final {per['runs'][name]['final_value']:.3f} overflow "
                  f"{per['runs'][name]['overflow_steps']} to-half {to_half} "
                  f"{per['runs'][name]['sec_per_1k_steps']:.1f}s/1k max|s| {per['runs'][name]['final_score_max']:.3g} "
                  f"[{time.perf_counter() - t_start:.0f}s]",
                  flush=True)
        for name in args.estimators:
            m = 5 if name == "capg_swr" else 1
            init = (MoERetriever if m > 1 else PLRetriever)(env_kwargs={"k": k}, num_experts=m, seed=123,
                                                            n_users=1000 if tower == "id" else None)
            per["variance"][name] = {"init": variance(name, k, init, var_batches, tower)}
            if trained_capg is not None and m == 1:
                per["variance"][name]["trained"] = variance(name, k, trained_capg, var_batches, tower)
        results["per_k"][str(k)] = per
    # cost at (K, L) = (20, 5), the paper's timing setting
    cost = {}
    for name in args.estimators:
        r = run_one(name, 20, 5, 200 if args.quick else 500, 0, 10_000, 500, out, tower)
        cost[name] = r["sec_per_1k"]
    results["cost_K20_L5"] = cost
    results["wall_seconds"] = time.perf_counter() - t_start
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
    print_tables(results, args.estimators)
    plot(results, args.estimators, out / "repro_capg.png")
    print(f"wrote {out / 'results.json'} and {out / 'repro_capg.png'}  ({results['wall_seconds']:.0f}s)")
    return 0


def _fmt(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def print_tables(results: dict, names) -> None:
    print(f"\nUser tower: {results['user_tower']}. Value (deterministic top-K + LSR) after {results['steps']} steps, "
          f"mean of {results['seeds']} seed(s); 'ovf@' = gradient overflow step; 'half@' = steps to close half the "
          "random->oracle gap")
    print(f"{'K':>3} {'random':>7} {'oracle':>7} | " + " | ".join(f"{n:>26}" for n in names))
    for k, per in results["per_k"].items():
        cells = []
        for n in names:
            r = per["runs"][n]
            ovf = [s for s in r["overflow_steps"] if s is not None]
            halfs = [s for s in r["steps_to_half_gap"] if s is not None]
            cells.append(f"{r['final_value']:6.3f} ovf@{_fmt(min(ovf) if ovf else None):>5} "
                         f"half@{_fmt(min(halfs) if halfs else None):>5}")
        print(f"{k:>3} {per['ref']['random']:7.3f} {per['ref']['oracle']:7.3f} | "
              + " | ".join(f"{c:>26}" for c in cells))
    print("\nSeconds per 1K steps (L = 1 runs above, and (K, L) = (20, 5)):")
    print(f"{'setting':>10} | " + " | ".join(f"{n:>9}" for n in names))
    for k, per in results["per_k"].items():
        print(f"{'K=' + k:>10} | " + " | ".join(f"{per['runs'][n]['sec_per_1k_steps']:9.1f}" for n in names))
    print(f"{'K=20,L=5':>10} | " + " | ".join(f"{results['cost_K20_L5'][n]:9.1f}" for n in names))
    print("\nGradient variance at fixed parameters: tr Cov (relative tr Cov / |mean|^2), 128 contexts per batch")
    for where in ("init", "trained"):
        print(f"  parameters: {where if where == 'init' else 'after ca-pg training'}")
        for k, per in results["per_k"].items():
            cells = [f"{_fmt(per['variance'][n][where]['trace_cov'])} ({_fmt(per['variance'][n][where]['relative'])})"
                     if where in per["variance"][n] else "-" for n in names]
            print(f"  K={k:>3} | " + " | ".join(f"{n}: {c}" for n, c in zip(names, cells, strict=False)))


def plot(results: dict, names, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(results["per_k"])
    fig, axes = plt.subplots(1, len(ks) + 1, figsize=(4.2 * (len(ks) + 1), 3.6))
    for ax, k in zip(axes, ks, strict=False):
        per = results["per_k"][k]
        for n in names:
            for i, curve in enumerate(per["runs"][n]["curves"]):
                if not curve:
                    continue
                st, v = zip(*curve, strict=False)
                line, = ax.plot(st, v, label=n if i == 0 else None, alpha=0.9)
                ovf = per["runs"][n]["overflow_steps"][i]
                if ovf is not None:
                    ax.plot([st[-1]], [v[-1]], "x", color=line.get_color(), markersize=9)
        ax.axhline(per["ref"]["oracle"], ls="--", c="k", lw=0.8)
        ax.axhline(per["ref"]["random"], ls=":", c="gray", lw=0.8)
        ax.set_title(f"K = {k}, L = 1 (x = gradient overflow)")
        ax.set_xlabel("gradient steps")
        ax.set_ylabel("value")
    axes[0].legend(fontsize=8)
    ax = axes[-1]
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        vals = [results["per_k"][k]["variance"][n]["init"]["trace_cov"] for k in ks]
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
