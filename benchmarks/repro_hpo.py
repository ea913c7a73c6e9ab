"""Reproduction: HPO versus Gaussian PPO on Replenishment-v0 at 5, 12 and 50 SKUs, and HPO versus tuned (s, S).

    .venv/bin/python -m benchmarks.repro_hpo [--quick] [--skus 5 12 50] [--seeds 0 1 2] [--out runs/repro_hpo]
                                             [--long-iterations 300] [--results DIR]

The claim (HPO paper, Alvo, Russo, Kanoria, arXiv 2605.14297; docs/algorithms/hpo.md): for the same number of
simulated periods HPO reaches a lower average test cost than Gaussian PPO, and the gap grows with the number of
SKUs. Both algorithms get the same budget (iterations × batch_scenarios × horizon simulated periods) and the same
[64, 64] policy size (the paper's config uses [512, 512] for HPO; we shrink it so the run fits a CPU); all other
hyperparameters are the config defaults (HPO: paper config; PPO: the HPO repo's Gaussian PPO template). The test
cost is the reported cost (periods 16..99) of the deterministic policy on each of the first `n_test` test scenarios
with reset seed 0 (the same demand paths for every arm), evaluated every `eval_every` updates.

The second part (``--long-iterations``, 0 to skip) trains HPO alone at 5 SKUs on stationary demand with the standard
tier's HPO setting (`shopsim.app.bench`: [128, 128] policy, 32 scenarios per update) for many more updates, to see
whether its cost gap to tuned (s, S) closes with budget or levels off above it.

(s, S) is tuned per SKU per scenario by simulation (agents.inventory_policies) on the same test scenarios and seed;
the perfect-information bound is the best order sequence in hindsight of each test demand path (a lower bound).
Both cost about 2.5 s per scenario at 50 SKUs, so they are computed for `--ref-skus` only (default 5).

Every run writes ``OUT/N<n>/<algo>_s<seed>.json`` (curve and per-scenario final costs) and ``.pt`` (the policy,
value net, optimiser and generator states); a later call reuses finished runs and continues shorter ones from their
state, so a sweep can be stopped, given more seeds or more updates. Writes ``OUT/summary.md``, ``OUT/curves.png``;
with ``--results DIR`` also ``DIR/hpo_n.md`` and ``DIR/hpo_n.json`` (command, commit, seeds, wall time).
The committed table: ``python -m benchmarks.repro_hpo --results docs/results`` (with the options it records).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shopsim.paths import atomic_write, write_text_atomic

ENV = "shopsim/Replenishment-v0"
ROOT = Path(__file__).resolve().parents[1]
TABLE = "hpo_n.md"


def reference_costs(n_skus: int, tasks: list[int], with_bounds: bool = True) -> dict:
    """Per test scenario: the constant-order cost and (with_bounds) tuned (s, S) and the perfect-information bound."""
    import gymnasium as gym

    import shopsim  # noqa: F401
    from agents.inventory_policies import ConstantOrderAgent, SSPolicyAgent, perfect_information_episode_cost

    env: Any = gym.make(ENV, n_skus=n_skus).unwrapped
    out: dict = {}
    agents: list[tuple[str, Any]] = [("constant", ConstantOrderAgent())]
    if with_bounds:
        agents.insert(0, ("s_S", SSPolicyAgent(env_id=ENV)))
    for name, agent in agents:
        costs = []
        for t in tasks:
            obs, info = env.reset(seed=0, options={"task_id": t})
            agent.begin_episode(0, obs, info)
            done = False
            while not done:
                obs, _, done, _, info = env.step(agent.act_one(0, obs, info))
            costs.append(float(info["episode_metrics"]["cost"]))
        out[name] = costs
    if with_bounds:
        out["pi_bound"] = [float(perfect_information_episode_cost(t, 0, env.config)) for t in tasks]
    return out


def test_costs(policy, sim, tasks: list[int], mode: str) -> list[float]:
    """Reported cost of the deterministic policy on each test scenario (reset seed 0), as `hybrid_ppo.evaluate`."""
    from baselines.hybrid_ppo import reported_cost

    b = sim.batch(list(tasks), [0] * len(tasks))
    ro = sim.rollout(policy, b, mode=mode, deterministic=True)
    return [float(c) for c in reported_cost(ro["cost"], sim.cfg.warmup).sum(-1)]


def train_curve(algo, n_skus: int, iterations: int, seed: int, eval_every: int, tasks: list[int], path: Path,
                key: dict) -> dict:
    """Train like `Algorithm.train`, evaluating the deterministic policy on `tasks` every `eval_every` updates.

    The record lives in ``path`` (.json) with its state (.pt); a finished record with the same `key` is returned as
    it is, a shorter one is continued from its state."""
    from baselines.hybrid_ppo import InventorySim

    sim = InventorySim(ENV, {"n_skus": n_skus})
    policy, value = algo.build(sim, seed)
    c = algo.config
    opt = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=c.lr,
                           weight_decay=getattr(c, "weight_decay", 0.0))
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    rec: dict[str, Any] = {"key": key, "iterations": 0, "curve": [], "seconds": 0.0}
    if path.is_file() and path.with_suffix(".pt").is_file():
        old = json.loads(path.read_text())
        if old["key"] == key and old["iterations"] <= iterations and "rng" in old:
            # tensors and plain containers only (the numpy stream's state, 128-bit ints, lives in the JSON record)
            st = torch.load(path.with_suffix(".pt"), weights_only=True)
            policy.load_state_dict(st["policy"]), value.load_state_dict(st["value"])
            opt.load_state_dict(st["opt"]), gen.set_state(st["gen"])
            rng.bit_generator.state = old.pop("rng")
            # the critic's output bias is calibrated once, from the first batch (`HybridPPO.advantages`)
            value.calibrated = bool(old.pop("value_calibrated", False))
            rec = old
            if old["iterations"] == iterations:
                return rec
    t0 = time.perf_counter() - rec["seconds"]

    def ev(it):
        per_task = test_costs(policy, sim, tasks, algo.mode)
        rec["curve"].append({"iteration": it, "simulated_periods": it * c.batch_scenarios * sim.cfg.horizon,
                             "test_cost": float(np.mean(per_task)), "per_task": per_task,
                             "seconds": time.perf_counter() - t0})

    if not rec["curve"]:
        ev(0)
    for it in range(rec["iterations"] + 1, iterations + 1):
        algo.update_iteration(sim, sim.sample_train(c.batch_scenarios, rng), policy, value, opt, gen)
        if it % eval_every == 0 or it == iterations:
            ev(it)
    rec.update(iterations=iterations, seconds=time.perf_counter() - t0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path.with_suffix(".pt")) as tmp:
        torch.save({"policy": policy.state_dict(), "value": value.state_dict(), "opt": opt.state_dict(),
                    "gen": gen.get_state()}, tmp)
    write_text_atomic(path, json.dumps({**rec, "rng": rng.bit_generator.state,
                                        "value_calibrated": bool(getattr(value, "calibrated", False))}))
    return rec


def _refs(out: Path, n: int, tasks: list[int], with_bounds: bool) -> dict:
    path = out / f"N{n}" / "references.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if old["tasks"] == list(tasks) and (old["with_bounds"] or not with_bounds):
            return old
    t0 = time.perf_counter()
    ref = {"tasks": list(tasks), "with_bounds": with_bounds, **reference_costs(n, tasks, with_bounds)}
    ref["seconds"] = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(ref))
    return ref


def _commit() -> str:
    from shopsim.leaderboard.results import git_commit

    return git_commit(ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds, 30 updates of 32 scenarios, 32 test scenarios")
    ap.add_argument("--skus", type=int, nargs="+", default=[5, 12, 50])
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--iterations", type=int, default=None, help="updates per run of the N sweep (default 30)")
    ap.add_argument("--batch", type=int, default=None, help="scenarios per update (default 32)")
    ap.add_argument("--n-test", type=int, default=None, help="test scenarios (default 128)")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--ref-skus", type=int, nargs="*", default=[5],
                    help="SKU counts whose (s, S) and perfect-information bound are computed")
    ap.add_argument("--long-iterations", type=int, default=None,
                    help="updates of the HPO-vs-(s, S) learning curve at 5 SKUs (default 300; quick 0 = skip)")
    ap.add_argument("--long-eval-every", type=int, default=25)
    ap.add_argument("--out", default="runs/repro_hpo")
    ap.add_argument("--results", default=None,
                    help=f"write DIR/{TABLE} and DIR/hpo_n.json (the committed table: docs/results)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    seeds = args.seeds or ([0, 1] if args.quick else [0, 1, 2])
    iterations = args.iterations or 30
    batch = args.batch or 32
    n_test = args.n_test or (32 if args.quick else 128)
    long_its = args.long_iterations if args.long_iterations is not None else (0 if args.quick else 300)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from baselines.hpo import HPO
    from baselines.hybrid_ppo import HybridPPO
    from shopsim.envs.replenishment import load_split

    tasks = [int(t) for t in load_split()["test"][:n_test]]
    t_start = time.perf_counter()
    res: dict = {"command": "python -m benchmarks.repro_hpo " + shlex.join(sys.argv[1:] if argv is None else argv),
                 "commit": _commit(), "machine": f"{platform.machine()}, torch {torch.__version__}, threads 1",
                 "seeds": seeds, "iterations": iterations, "batch": batch, "n_test": n_test, "hidden": [64, 64],
                 "tasks": tasks, "per_n": {}}
    compute = 0.0
    for n in args.skus:
        ref = _refs(out, n, tasks, n in args.ref_skus)
        compute += ref["seconds"]
        per: dict = {"references": {k: float(np.mean(v)) for k, v in ref.items()
                                    if k in ("s_S", "constant", "pi_bound")},
                     "s_S_per_task": ref.get("s_S"), "runs": {}}
        print(f"N={n}: " + "  ".join(f"{k} {v:.0f}" for k, v in per["references"].items()), flush=True)
        for name, cls in (("hpo", HPO), ("ppo", HybridPPO)):
            for seed in seeds:
                key = {"algo": name, "n_skus": n, "batch": batch, "hidden": [64, 64], "tasks": n_test,
                       "eval_every": args.eval_every}
                algo = cls(batch_scenarios=batch, hidden=(64, 64), eval_scenarios=0)
                rec = train_curve(algo, n, iterations, seed, args.eval_every, tasks, out / f"N{n}" /
                                  f"{name}_s{seed}.json", key)
                compute += rec["seconds"]
                last = rec["curve"][-1]
                per["runs"].setdefault(name, []).append(
                    {"seed": seed, "final": last["test_cost"], "final_per_task": last["per_task"],
                     "seconds": rec["seconds"],
                     "curve": [(p["simulated_periods"], p["test_cost"]) for p in rec["curve"]]})
                print(f"  {name} seed {seed}: test cost {last['test_cost']:.0f} after "
                      f"{last['simulated_periods']} periods, {rec['seconds']:.0f}s "
                      f"[{time.perf_counter() - t_start:.0f}s]", flush=True)
        res["per_n"][str(n)] = per
    if long_its:
        ref = _refs(out, 5, tasks, True)
        long: dict = {"iterations": long_its, "eval_every": args.long_eval_every, "batch": 32, "hidden": [128, 128],
                      "s_S": float(np.mean(ref["s_S"])), "s_S_per_task": ref["s_S"],
                      "pi_bound": float(np.mean(ref["pi_bound"])), "runs": []}
        for seed in seeds:
            key = {"algo": "hpo", "n_skus": 5, "batch": 32, "hidden": [128, 128], "tasks": n_test,
                   "eval_every": args.long_eval_every}
            algo = HPO(batch_scenarios=32, hidden=(128, 128), eval_scenarios=0)
            rec = train_curve(algo, 5, long_its, seed, args.long_eval_every, tasks, out / "long_N5" /
                              f"hpo_s{seed}.json", key)
            compute += rec["seconds"]
            long["runs"].append({"seed": seed, "seconds": rec["seconds"],
                                 "curve": [{"iteration": p["iteration"], "simulated_periods": p["simulated_periods"],
                                            "test_cost": p["test_cost"], "per_task": p["per_task"]}
                                           for p in rec["curve"]]})
            print(f"  long hpo seed {seed}: test cost {rec['curve'][-1]['test_cost']:.0f} after {long_its} updates "
                  f"(s,S) {long['s_S']:.0f}, {rec['seconds']:.0f}s [{time.perf_counter() - t_start:.0f}s]",
                  flush=True)
        res["long"] = long
    res["wall_s"] = time.perf_counter() - t_start
    res["compute_s"] = compute
    md = to_markdown(res)
    write_text_atomic(out / "summary.md", md)
    print(md)
    plot(res, out / "curves.png")
    if args.results:
        d = Path(args.results)
        d.mkdir(parents=True, exist_ok=True)
        write_text_atomic(d / "hpo_n.json", json.dumps(res) + "\n")
        write_text_atomic(d / TABLE, md)
        print(f"wrote {d / TABLE} and {d / 'hpo_n.json'}")
    return 0


def _ms(vals, fmt: str = ",.0f") -> str:
    v = np.asarray(vals, dtype=float)
    return f"{v.mean():{fmt}} ± {v.std(ddof=1):{fmt}}" if len(v) > 1 else f"{v.mean():{fmt}}"


def paired_gap(arm: list[float], ref: list[float]) -> dict:
    """Per seed 100·(arm − ref)/ref, their mean and the Student-t 95% interval of that mean (paired by seed)."""
    from benchmarks.seed_claims import t_interval

    d = [100.0 * (a - r) / r for a, r in zip(arm, ref, strict=True)]
    return {"per_seed": d, "mean": float(np.mean(d)), "ci95": t_interval(d)}


def to_markdown(res: dict) -> str:
    lines = ["# HPO versus Gaussian PPO as the number of SKUs grows, and HPO versus (s, S) with budget", "",
             "Generated by `benchmarks/repro_hpo.py`; do not edit by hand.", "",
             f"- command: `{res['command']}`", f"- commit: `{res['commit']}`", f"- machine: {res['machine']}",
             f"- seeds: {', '.join(map(str, res['seeds']))}; N sweep: {res['iterations']} updates × {res['batch']} "
             f"scenarios × 100 periods per run, [64, 64] policies for both; test cost: mean reported cost "
             f"(periods 16..99) over the first {res['n_test']} test scenarios, reset seed 0",
             f"- wall time: {res['wall_s']:.0f} s this call; {res['compute_s']:.0f} s of training, evaluation and "
             "references in all (runs reused from earlier calls count with their own time)", "",
             "## HPO versus PPO per N", "",
             "Mean ± sd over seeds. *gap*: 100·(HPO − PPO)/PPO per seed (paired by seed: both train on the same "
             "scenario draws), mean and Student-t 95% interval over seeds; negative = HPO cheaper.", "",
             "| SKUs | (s,S) | perfect-info bound | constant | HPO | PPO | gap % [95% CI] | HPO gap to (s,S) |",
             "|---|---|---|---|---|---|---|---|"]
    for n, per in res["per_n"].items():
        runs = per["runs"]
        if not runs.get("hpo") or not runs.get("ppo"):
            continue
        h, p = [r["final"] for r in runs["hpo"]], [r["final"] for r in runs["ppo"]]
        g = paired_gap(h, p)
        refs = per["references"]
        ss, pib = refs.get("s_S"), refs.get("pi_bound")
        ss_cell = f"{ss:,.0f}" if ss else "-"
        pi_cell = f"{pib:,.0f}" if pib else "-"
        gap_ss = f"{100 * (np.mean(h) / ss - 1):+.1f}%" if ss else "-"
        lines.append(f"| {n} | {ss_cell} | {pi_cell} | {refs['constant']:,.0f} | {_ms(h)} | {_ms(p)} | "
                     f"{g['mean']:+.1f} [{g['ci95'][0]:+.1f}, {g['ci95'][1]:+.1f}] | {gap_ss} |")
    if "long" in res:
        lg = res["long"]
        lines += ["", f"## HPO versus (s, S) on stationary demand, 5 SKUs ({lg['iterations']} updates)", "",
                  f"The standard tier's HPO setting ({lg['hidden']} policy, {lg['batch']} scenarios per update). "
                  f"(s, S): {lg['s_S']:,.0f}; perfect-information bound: {lg['pi_bound']:,.0f}. Gap to (s, S) "
                  "per evaluation: 100·(HPO − (s,S))/(s,S) on the same test scenarios, mean ± sd over seeds.", "",
                  "| updates | simulated periods | HPO cost | gap to (s,S) % |", "|---|---|---|---|"]
        its = [p["iteration"] for p in lg["runs"][0]["curve"]]
        for i, it in enumerate(its):
            costs = [r["curve"][i]["test_cost"] for r in lg["runs"] if i < len(r["curve"])]
            gaps = [100 * (c / lg["s_S"] - 1) for c in costs]
            lines.append(f"| {it} | {lg['runs'][0]['curve'][i]['simulated_periods']:,} | {_ms(costs)} | "
                         f"{_ms(gaps, '+.1f')} |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ns = list(res["per_n"])
        fig, axes = plt.subplots(1, len(ns) + 1, figsize=(5 * (len(ns) + 1), 4), squeeze=False)
        for ax, n in zip(axes[0], ns, strict=False):
            for a, col in (("hpo", "C0"), ("ppo", "C1")):
                for i, r in enumerate(res["per_n"][n]["runs"].get(a, [])):
                    ax.plot(*zip(*r["curve"], strict=False), color=col, alpha=0.8, label=a.upper() if i == 0 else None)
            ss = res["per_n"][n]["references"].get("s_S")
            if ss:
                ax.axhline(ss, color="k", ls="--", label="(s,S)")
            ax.set_yscale("log")
            ax.set_title(f"{n} SKUs")
            ax.set_xlabel("simulated periods")
            ax.set_ylabel("test cost")
            ax.legend()
        ax = axes[0][-1]
        if "long" in res:
            lg = res["long"]
            for r in lg["runs"]:
                ax.plot([p["simulated_periods"] for p in r["curve"]],
                        [100 * (p["test_cost"] / lg["s_S"] - 1) for p in r["curve"]], color="C0", alpha=0.8)
            ax.axhline(0, color="k", ls="--")
            ax.set_ylim(-20, 100)
            ax.set_title("HPO gap to (s,S), 5 SKUs, stationary")
            ax.set_xlabel("simulated periods")
            ax.set_ylabel("% above (s,S)")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001 - the table is the primary output; say why the plot is missing
        print(f"plot not written: {exc}")


if __name__ == "__main__":
    raise SystemExit(main())
