"""ProRL's ablation ladder on ProactiveRec-v0 at the standard tier's setting, and why ProRL's paths shrink there.

ProRL (Hou et al., arXiv 2605.28293; docs/algorithms/prorl.md) claims: REINFORCE on the raw fused step rewards
drifts to the maximum path length and its paths collapse across users; centring the step rewards stops the drift;
position-specific advantages lower the gradient variance and raise IoI and CTR over the pre-trained policy. Every
rung is the one `prorl` module one option away (`baselines.prorl.ProRLConfig`):

| arm | centering | credit | item log-prob | β |
|---|---|---|---|---|
| raw | none (the env's fused step reward) | path (return − group mean) | sum | 0 |
| +centering | component (ProRL's) | path | sum | 0 |
| +position | component | position (ProRL's) | sum | 0 |
| prorl | component | position | mean (ProRL's) | 0.01 (ProRL's) |
| prorl-poscentre | position ([derived]) | position | mean | 0.01 |

Each arm trains `--seeds` runs of `--iterations` from the standard tier's start (`shopsim.app.bench`:
SFT on 1500 users for 100 steps, 4 prompts × 8 rollouts per iteration, lr 1e-4, real and unseen items only) with
`grad_var=True`, which logs the per-prompt gradient variance of every iteration. Reported per arm (mean ± sd over
seeds): greedy path length, share of distinct paths across users, IoI and CTR of the final policy on `--eval-tasks`
dev users (the same users as the SFT start's row: in-training evaluation at iteration 0); the sampled path length of
the last 10 iterations; the mean credit of stopping (EOS advantage) over the first 10 iterations; the gradient
variance (trace, per prompt) and its ratio to the squared mean gradient, averaged over iterations.

The diagnosis table: per path position k, the mean raw components of the SFT start's sampled paths (16 per dev
user) and the centred step reward r_k under ProRL's component statistics fitted on those same items, i.e. what an
item at position k earns after ProRL charges it the mean item (r_k < 0: stopping before k beats continuing).

With ``--results DIR`` writes ``DIR/prorl_ladder.md`` and ``DIR/prorl_ladder.json`` with the command, commit, seeds
and wall time; ``--json PATH`` writes the figures to a further file; without either, nothing is written.
Run: ``python -m benchmarks.prorl_ladder [--quick] [--json PATH] [--results DIR]``; the committed table:
``python -m benchmarks.prorl_ladder --results docs/results`` (about 20 minutes on one core).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ENV_ID = "shopsim/ProactiveRec-v0"
ROOT = Path(__file__).resolve().parents[1]
TABLE = "prorl_ladder.md"
#: the standard tier's ProactiveRec setting (`shopsim.app.bench._REC_STD`), in-training evaluation aside
STANDARD = {"sft_steps": 100, "group_size": 8, "prompts_per_iter": 4, "valid_only": True, "no_repeat": True}
_RAW_FORM = {"item_logprob": "sum", "beta": 0.0}
ARMS: dict[str, dict] = {
    "raw": {"centering": "none", "credit": "path", **_RAW_FORM},
    "+centering": {"centering": "component", "credit": "path", **_RAW_FORM},
    "+position": {"centering": "component", "credit": "position", **_RAW_FORM},
    "prorl": {},
    "prorl-poscentre": {"centering": "position"},
}


def run_arm(name: str, seed: int, args, out: Path) -> dict:
    """Train one arm for one seed; the figures of its first and last evaluation and of its training rows."""
    from baselines.prorl import ProRL

    cfg = {**STANDARD, "eval_tasks": args.eval_tasks, "eval_every": max(1, args.iterations // 2), "grad_var": True,
           **ARMS[name]}
    t0 = time.perf_counter()
    res = ProRL(**cfg).train(ENV_ID, iterations=args.iterations, seed=seed, out_dir=out / f"{name}-s{seed}",
                             progress=False)
    h = res.history
    ev = [r for r in h if "eval_IoI" in r]
    first, last = ev[0], ev[-1]
    tail = h[-min(10, len(h)):]
    head = h[:min(10, len(h))]
    return {"arm": name, "seed": seed, "seconds": time.perf_counter() - t0,
            **{f"start_{k}": first[f"eval_{k}"] for k in ("IoI", "CTR", "length", "distinct")},
            **{k: last[f"eval_{k}"] for k in ("IoI", "CTR", "length", "distinct")},
            "sample_length": float(np.mean([r["sample_length"] for r in tail])),
            "sample_distinct": float(np.mean([r["sample_distinct"] for r in tail])),
            "eos_adv_early": float(np.mean([r["eos_adv_mean"] for r in head])),
            "grad_var": float(np.mean([r["grad_var"] for r in h])),
            "grad_var_rel": float(np.mean([r["grad_var_rel"] for r in h])),
            "curve_sample_length": [r["sample_length"] for r in h]}


def diagnosis(args) -> dict:
    """Position profile of the SFT start's sampled paths, the charge ProRL's centring subtracts, and the references."""
    import copy

    import torch

    from agents.rec_policies import RecPolicyAgent, policy_paths, pretrained_policy, random_paths
    from baselines.prorl import ProRL, evaluate, position_profile
    from shopsim.envs.proactive_rec import PathScorer
    from shopsim.envs.proactive_rec.env import load_split
    from shopsim.envs.proactive_rec.scoring import path_metrics

    init = pretrained_policy(catalog_size=5000, n_users=1500, sft_steps=STANDARD["sft_steps"], seed=0)
    agent = RecPolicyAgent(model=copy.deepcopy(init.model), valid_only=True, no_repeat=True, catalog_size=5000)
    world, scorer = agent.world, PathScorer(agent.world)
    dev = np.array(load_split()["dev"][: args.eval_tasks])
    hist, tgt = world.tasks(dev)
    rollouts = 16
    h_rep, t_rep = np.repeat(hist, rollouts, 0), np.repeat(tgt, rollouts)
    items = policy_paths(agent, h_rep, t_rep, greedy=False, generator=torch.Generator().manual_seed(0))[3]
    scores = scorer.score(h_rep, t_rep, items, invalid="batch_min")
    algo = ProRL(**STANDARD)
    algo._n_items = world.n_items
    algo.stats = algo._new_stats()
    algo.centred_rewards(scores, update=True)  # component statistics of exactly these items
    real = scores.valid & ~scores.duplicate & scores.step_mask
    ioi, ior, ctr = (x[real] for x in (scores.ioi, scores.ior, scores.ctr))
    corr = [float(np.corrcoef(ioi, ctr)[0, 1]), float(np.corrcoef(ior, ctr)[0, 1]), float(np.corrcoef(ioi, ior)[0, 1])]
    rnd = path_metrics(scorer.score(hist, tgt, random_paths(world, len(dev), np.random.default_rng(0))))
    return {"profile": position_profile(algo, scores), "mu": dict(zip(("IoI", "IoR", "CTR"), algo.stats.mean.tolist(),
                                                                        strict=True)),
            "sigma": dict(zip(("IoI", "IoR", "CTR"), algo.stats.std.tolist(), strict=True)),
            "corr_IoI_CTR": corr[0], "corr_IoR_CTR": corr[1], "corr_IoI_IoR": corr[2],
            "sampled_rollouts": int(len(items)), "random": rnd, "sft_greedy": evaluate(agent, scorer, dev)}


def summarise(runs: list[dict]) -> dict[str, dict]:
    out = {}
    for name in ARMS:
        rs = [r for r in runs if r["arm"] == name]
        if not rs:
            continue
        keys = [k for k, v in rs[0].items() if isinstance(v, float)]
        out[name] = {k: {"mean": float(np.mean([r[k] for r in rs])), "sd": float(np.std([r[k] for r in rs], ddof=1))
                         if len(rs) > 1 else None, "per_seed": [r[k] for r in rs]} for k in keys}
    return out


def _ms(cell: dict, fmt: str = ".2f") -> str:
    sd = "" if cell["sd"] is None else f" ± {cell['sd']:{fmt}}"
    return f"{cell['mean']:{fmt}}{sd}"


def write_table(res: dict, path: Path) -> None:
    from shopsim.paths import write_text_atomic

    d, s = res["diagnosis"], res["summary"]
    start = s[next(iter(s))]
    lines = ["# ProRL's ablation ladder on ProactiveRec-v0 (standard tier setting)", "",
             "Generated by `benchmarks/prorl_ladder.py`; do not edit by hand.", "",
             f"- command: `{res['command']}`", f"- commit: `{res['commit']}`", f"- machine: {res['machine']}",
             f"- seeds: {', '.join(map(str, res['seeds']))}; {res['iterations']} iterations per run; the standard "
             f"tier's start and batch (SFT 100 steps, 4 prompts × 8 rollouts, lr 1e-4, real unseen items); "
             f"evaluation: greedy decoding on {res['eval_tasks']} dev users", f"- wall time: {res['wall_s']:.0f} s",
             "", "## Where the step rewards fall along the path (SFT start, sampled paths)", "",
             f"{d['sampled_rollouts']} sampled paths (16 per dev user). ProRL's component statistics of these items: "
             f"μ = IoI {d['mu']['IoI']:.3f}, IoR {d['mu']['IoR']:.1f}, CTR {d['mu']['CTR']:.3f}; σ = IoI "
             f"{d['sigma']['IoI']:.3f}, IoR {d['sigma']['IoR']:.1f}, CTR {d['sigma']['CTR']:.3f}. r_k = centred "
             "step reward (w_ctr·r̃_CTR/L_max + r̃_IoI + r̃_IoR) of an item at position k; stopping earns 0.", "",
             "| position k | items | IoI | IoR | CTR | r_k |", "|---|---|---|---|---|---|"]
    for p in d["profile"]:
        lines.append(f"| {p['position']} | {p['n']} | {p['IoI']:.3f} | {p['IoR']:.1f} | {p['CTR']:.3f} | "
                     f"{p['r_centred']:+.2f} |")
    lines += ["", f"Correlation over these items: IoI–CTR {d['corr_IoI_CTR']:+.2f}, IoR–CTR {d['corr_IoR_CTR']:+.2f}, "
              f"IoI–IoR {d['corr_IoI_IoR']:+.2f}.", "",
              "## The ladder", "",
              "Greedy decoding on the dev users after training (mean ± sd over seeds); sampled length: the last 10 "
              "iterations' rollouts; EOS credit: mean advantage of stopping over the first 10 iterations; gradient "
              "variance: trace of the per-prompt policy-gradient covariance, averaged over iterations (relative: "
              "divided by the squared norm of the mean gradient).", "",
              "| arm | greedy length | distinct paths | IoI | CTR | sampled length | sampled distinct | EOS credit | "
              "grad var | grad var (rel.) |", "|---|---|---|---|---|---|---|---|---|---|",
              f"| SFT start | {start['start_length']['mean']:.2f} | {start['start_distinct']['mean']:.2f} | "
              f"{start['start_IoI']['mean']:.2f} | {start['start_CTR']['mean']:.3f} | | | | | |",
              f"| random | {d['random']['length']:.2f} | | {d['random']['IoI']:.2f} | {d['random']['CTR']:.3f} "
              "| | | | | |"]
    for name, c in s.items():
        lines.append(f"| {name} | {_ms(c['length'])} | {_ms(c['distinct'])} | {_ms(c['IoI'])} | "
                     f"{_ms(c['CTR'], '.3f')} | {_ms(c['sample_length'])} | {_ms(c['sample_distinct'])} | "
                     f"{_ms(c['eos_adv_early'])} | {_ms(c['grad_var'], '.3g')} | {_ms(c['grad_var_rel'])} |")
    lines += ["", "Arms: " + "; ".join(f"`{k}` = {json.dumps(v) if v else 'ProRL defaults'}" for k, v in ARMS.items())
              + " (options of `baselines.prorl.ProRLConfig`).", ""]
    write_text_atomic(path, "\n".join(lines))


def main(argv=None) -> int:
    import torch

    from benchmarks.bench_lm_rl import _commit
    from shopsim.paths import write_text_atomic

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=100, help="per run (the standard tier's budget: 100)")
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/prorl_ladder", help="training runs (metrics.csv per run)")
    p.add_argument("--quick", action="store_true", help="4 iterations, one seed, 8 dev users")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument("--results", default=None, metavar="DIR",
                   help=f"write the table DIR/{TABLE} and its .json (the committed one: docs/results; default: none)")
    args = p.parse_args(argv)
    if args.quick:
        args.iterations, args.seeds, args.eval_tasks = 4, args.seeds[:1], 8
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    diag = diagnosis(args)
    runs = []
    for name in args.arms:
        for seed in args.seeds:
            r = run_arm(name, seed, args, Path(args.out))
            print(f"{name} seed {seed}: length {r['length']:.2f}, distinct {r['distinct']:.2f}, IoI {r['IoI']:.3f}, "
                  f"CTR {r['CTR']:.3f}, sampled length {r['sample_length']:.2f}, grad var {r['grad_var']:.3g} "
                  f"({r['seconds']:.0f} s)", flush=True)
            runs.append(r)
    res = {"command": "python -m benchmarks.prorl_ladder " + " ".join(sys.argv[1:] if argv is None else argv),
           "commit": _commit(), "machine": f"{platform.machine()}, torch {torch.__version__}, threads {args.threads}",
           "seeds": args.seeds, "iterations": args.iterations, "eval_tasks": args.eval_tasks, "arms": ARMS,
           "config": STANDARD, "diagnosis": diag, "summary": summarise(runs), "runs": runs,
           "wall_s": time.perf_counter() - t0}
    if args.json:
        write_text_atomic(args.json, json.dumps(res, indent=2))
    if args.results:
        out = Path(args.results)
        write_table(res, out / TABLE)
        write_text_atomic(out / "prorl_ladder.json", json.dumps(res, indent=2))
        print(f"wrote {out / TABLE}")
    if not (args.json or args.results):
        print("no table written (pass --results DIR, e.g. --results docs/results, or --json PATH)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
