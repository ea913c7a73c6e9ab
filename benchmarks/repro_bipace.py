"""Reproduction check of BiPACE (docs/algorithms/bipace.md) against GiGPO on Shopping-v0 at the same budget.

    python -m benchmarks.repro_bipace [--out runs/seedcheck] [--seeds 0 1 2] [--iterations 10] [--rollouts 32]
        [--group-size 8] [--eval-episodes 50] [--eval-every 10] [--overhead-rollouts 32] [--results DIR]

Claims checked (Wang et al., arXiv 2606.25556): hidden-state clusters leave fewer singleton step groups than
GiGPO's exact anchor-state groups; success improves over GiGPO; no giant cluster forms (watch the P90 cluster size).

Protocol: `benchmarks.learning_lm`'s (the weakened SFT start in ``OUT/start``, the same rollouts, learning rate,
temperature, env settings, update schedule and paired greedy evaluation; `learning_lm._algo`). BiPACE trains in
``OUT/bipace/seed<S>`` (the card's defaults), plus two ablations: ``bipace-distinct`` (ε from the non-duplicate
pairs, `eps_pairs="distinct"`) and ``bipace-state`` (state-only step baseline, `baseline="state"`). GiGPO (and
GRPO, for context) are read from ``OUT/gigpo/seed<S>`` / ``OUT/grpo/seed<S>`` when present and never trained here
(``--train-refs`` trains the missing ones); a finished run is reused, an interrupted one resumes.

Singleton share = the share of step groups (GiGPO: anchor groups, metric ``anchor_singleton_share``; BiPACE:
hidden-state clusters, ``bipace_singleton_share``) that hold one step, averaged over iterations; "steps in
singletons" is the share of steps that get no step signal. The hidden-state recording cost is measured on the start
checkpoint: the same rollouts (tasks, seeds, sampling generator) collected with and without ``record_hidden``; the
same batches are grouped both ways (GiGPO's anchors, BiPACE's clusters) for paired singleton shares. That
measurement is saved in ``OUT/bipace-overhead.json`` and reused by later calls with the same settings.

Prints the table; with ``--results DIR`` writes ``DIR/bipace_check.md`` and ``DIR/bipace_check.json`` (table,
command, git commit, seeds, wall time; ``--results docs/results``: the committed check).
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

from benchmarks.learning_lm import (
    ENV,
    EVAL_SEED,
    FAMILIES,
    _algo,
    _train_one,
    add_protocol_arguments,
    evaluate_metrics,
    protocol_env_kwargs,
    weaken,
)
from shopsim.leaderboard.results import git_commit
from shopsim.paths import write_text_atomic

#: BiPACE arms: the card's defaults and two ablations (config overrides)
VARIANTS = {"bipace": {}, "bipace-distinct": {"eps_pairs": "distinct"}, "bipace-state": {"baseline": "state"}}
ARMS = ("grpo", "gigpo", *VARIANTS)


def _read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _f(row: dict, key: str) -> float | None:
    v = row.get(key)
    return None if v in (None, "") else float(v)


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    return float(np.mean(xs)) if xs else float("nan")


def _std(xs) -> float:
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    return float(np.std(xs)) if xs else float("nan")


def _finished(out: Path, name: str, seed: int, iterations: int) -> bool:
    path = out / name / f"seed{seed}" / "metrics.csv"
    return path.is_file() and len(_read(path)) >= iterations


def overhead(out: Path, env_kwargs: dict, args) -> dict:
    """On the start checkpoint: rollout time with and without hidden-state recording (same tasks, seeds and
    sampling generator, alternating; `reps` repetitions with different sampling seeds), and, on each recorded
    batch, GiGPO's exact anchor groups against BiPACE's clusters of the same steps (paired singleton shares)."""
    from agents.lm.agent import LMAgent
    from baselines.bipace import bipace_advantages, calibrate_epsilon
    from baselines.core.advantages import turn_returns_to_go
    from baselines.core.batch import build_batch
    from baselines.core.tasks import sample_tasks
    from baselines.gigpo import gigpo_advantages
    from shopsim.rollout import collect

    agent = LMAgent(env_id=ENV, checkpoint=out / "start", temperature=args.temperature)
    G = args.group_size
    n = max(1, args.overhead_rollouts // G)
    rng = np.random.default_rng(123)
    tasks = sample_tasks(ENV, "train", rng, n, families=FAMILIES)
    seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=n)]
    times: dict[bool, list[float]] = {False: [], True: []}
    turns: dict[bool, int] = {False: 0, True: 0}
    paired: dict[str, list[float]] = {}
    for rep in range(args.overhead_reps):
        for rec in (False, True):
            agent.sampling.record_hidden = rec
            t0 = time.perf_counter()
            trajs = collect(ENV, agent, tasks=tasks, seeds=seeds, split="train", group_size=G, num_envs=8,
                            env_kwargs=env_kwargs, progress=False, agent_seed=7 + rep)
            times[rec].append(time.perf_counter() - t0)
            turns[rec] += sum(t.num_turns for t in trajs)
        b = build_batch(trajs)
        R, Rk, mask = b.returns, turn_returns_to_go(b, 0.95), b.turn_mask.float()
        _, mg = gigpo_advantages(R, Rk, mask, b.group_ids, b.anchors)
        idx = b.turn_mask.nonzero()
        hid = b.turn_hidden["last"]
        acts = [[t.action for t in tr.turns] for tr in trajs]
        row = {"gigpo_singleton_share": mg["anchor_singleton_share"],
               "gigpo_steps_in_singletons": mg["anchor_steps_in_singletons"]}
        for tag, distinct in (("bipace", False), ("bipace-distinct", True)):
            eps = calibrate_epsilon(hid[idx[:, 0], idx[:, 1]], b.group_ids[idx[:, 0]], 10, distinct=distinct) or 0.0
            _, mb = bipace_advantages(R, Rk, mask, b.group_ids, hid, acts, eps)
            row.update({f"{tag}_singleton_share": mb["bipace_singleton_share"],
                        f"{tag}_steps_in_singletons": mb["bipace_steps_in_singletons"],
                        f"{tag}_epsilon": eps, f"{tag}_cluster_p90": mb["bipace_cluster_p90"]})
        for k, v in row.items():
            paired.setdefault(k, []).append(float(v))
    off, on = float(np.median(times[False])), float(np.median(times[True]))
    return {"rollouts": n * G, "reps": args.overhead_reps, "turns_off": turns[False], "turns_on": turns[True],
            "rollout_s_off": off, "rollout_s_on": on, "overhead": on / off - 1.0, "paired": paired}


def summarise(out: Path, start: dict, args) -> dict:
    """Per arm: final success, singleton shares, cluster sizes and timing over the finished seeds."""
    res = {}
    for name in ARMS:
        runs = [(s, _read(out / name / f"seed{s}" / "metrics.csv")) for s in args.seeds
                if _finished(out, name, s, args.iterations)]
        if not runs:
            continue
        finals = [r[-1] for _, r in runs]
        d = {"seeds": [s for s, _ in runs]}
        for split in ("dev", "test"):
            d[f"{split}_success"] = [_f(f, f"{split}_success") for f in finals]
            for fam in FAMILIES:
                d[f"{split}_success/{fam}"] = _mean(_f(f, f"{split}_success/{fam}") for f in finals)
        pre = "anchor_" if name == "gigpo" else "bipace_" if name in VARIANTS else None
        if pre:
            d["singleton_share"] = [_mean(_f(x, f"{pre}singleton_share") for x in r) for _, r in runs]
            d["steps_in_singletons"] = [_mean(_f(x, f"{pre}steps_in_singletons") for x in r) for _, r in runs]
            d["group_size_mean"] = _mean(_mean(_f(x, "anchor_group_size" if name == "gigpo" else
                                                  "bipace_cluster_size") for x in r) for _, r in runs)
        if name in VARIANTS:
            for k in ("cluster_p90", "pace_share", "rloo_share", "peer_count", "parse_rate", "epsilon",
                      "giant_clusters", "adv_s"):
                d[k] = _mean(_mean(_f(x, f"bipace_{k}") for x in r) for _, r in runs)
            d["cluster_p90_max"] = max(max(_f(x, "bipace_cluster_p90") or 0.0 for x in r) for _, r in runs)
        d["train_s"] = float(sum((_f(x, "rollout_s") or 0) + (_f(x, "update_s") or 0) for _, r in runs for x in r))
        d["iteration_s"] = _mean(_mean((_f(x, "rollout_s") or 0) + (_f(x, "update_s") or 0) for x in r)
                                 for _, r in runs)
        res[name] = d
    return res


def _fmt(xs) -> str:
    return f"{_mean(xs):.3f} ± {_std(xs):.3f}" if isinstance(xs, list) else f"{xs:.3f}"


def render(res: dict, start: dict, ov: dict | None, meta: dict) -> str:
    lines = ["# BiPACE reproduction check (Shopping-v0)", "",
             "Generated by `benchmarks/repro_bipace.py`; do not edit by hand.", "",
             f"Command: `{meta['command']}`  ", f"Commit: `{meta['commit']}`  ",
             f"Seeds: {meta['seeds']}; {meta['iterations']} iterations × {meta['rollouts']} rollouts "
             f"(G = {meta['group_size']}); {meta['eval_episodes']} greedy dev and test episodes; wall time "
             f"of this call {meta['wall_s']:.0f} s (finished runs are reused; each arm's rollout + update time "
             "summed over its seeds is `train_s` in the JSON).", "",
             "## Step groups and success (mean ± std over seeds; success after the last iteration)", "",
             "| arm | seeds | singleton share | steps in singletons | mean group size | dev success | test success | "
             + " | ".join(f"test {f}" for f in FAMILIES) + " | s / iteration |",
             "|---|---|---|---|---|---|---|" + "---|" * len(FAMILIES) + "---|",
             f"| start | - | - | - | - | {start['dev']:.3f} | {start['test']:.3f} | "
             + " | ".join(f"{start.get('test/' + f, float('nan')):.3f}" for f in FAMILIES) + " | - |"]
    for name, d in res.items():
        single = _fmt(d["singleton_share"]) if "singleton_share" in d else "-"
        steps = _fmt(d["steps_in_singletons"]) if "steps_in_singletons" in d else "-"
        gsz = f"{d['group_size_mean']:.2f}" if "group_size_mean" in d else "-"
        lines.append(f"| {name} | {len(d['seeds'])} | {single} | {steps} | {gsz} | {_fmt(d['dev_success'])} | "
                     f"{_fmt(d['test_success'])} | "
                     + " | ".join(f"{d['test_success/' + f]:.3f}" for f in FAMILIES) + f" | {d['iteration_s']:.0f} |")
    b = res.get("bipace")
    if any(v in res for v in VARIANTS):
        lines += ["", "## BiPACE internals (mean over iterations and seeds)", "",
                  "Arms: `bipace` = the card's defaults; `bipace-distinct` = ε from the distinct (non-duplicate) pairs "
                  "(`eps_pairs=distinct`); `bipace-state` = state-only step baseline (`baseline=state`).", "",
                  "| arm | ε | P90 cluster size (mean / max) | giant clusters per batch | PACE share | RLOO share | "
                  "same-action peers | action parse rate | advantage time (s) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for v in VARIANTS:
            if v in res:
                x = res[v]
                lines.append(f"| {v} | {x['epsilon']:.4g} | {x['cluster_p90']:.2f} / {x['cluster_p90_max']:.2f} | "
                             f"{x['giant_clusters']:.2f} | {x['pace_share']:.3f} | {x['rloo_share']:.3f} | "
                             f"{x['peer_count']:.2f} | {x['parse_rate']:.3f} | {x['adv_s']:.3f} |")
    if ov:
        pr = ov["paired"]
        lines += ["", "## Paired step groups on the same batches (start checkpoint)", "",
                  f"{ov['reps']} batches of {ov['rollouts']} rollouts (G = {meta['group_size']}) from the start "
                  "checkpoint, each grouped both ways: GiGPO's exact anchor states and BiPACE's hidden-state clusters "
                  "(ε calibrated on that batch). Mean over batches (per batch in the JSON).", "",
                  "| grouping | ε | singleton share | steps in singletons | P90 cluster size |",
                  "|---|---|---|---|---|",
                  f"| gigpo (anchor) | - | {_mean(pr['gigpo_singleton_share']):.3f} | "
                  f"{_mean(pr['gigpo_steps_in_singletons']):.3f} | - |"]
        for tag in ("bipace", "bipace-distinct"):
            lines.append(f"| {tag} | {_mean(pr[tag + '_epsilon']):.4g} | {_mean(pr[tag + '_singleton_share']):.3f} | "
                         f"{_mean(pr[tag + '_steps_in_singletons']):.3f} | {_mean(pr[tag + '_cluster_p90']):.2f} |")
        lines += ["", "## Hidden-state recording cost (start checkpoint, same rollouts)", "",
                  f"{ov['rollouts']} rollouts, median of {ov['reps']}: {ov['rollout_s_off']:.1f} s without, "
                  f"{ov['rollout_s_on']:.1f} s with `record_hidden` ({100 * ov['overhead']:+.1f}%; "
                  f"{ov['turns_off']} / {ov['turns_on']} turns in all). The s / iteration column above is not a "
                  "cost comparison: the runs shared 2 CPU cores with a varying number of other jobs."]
    lines += ["", "## Claims", ""]
    g = res.get("gigpo")
    if b and g:
        sb, sg = _mean(b["singleton_share"]), _mean(g["singleton_share"])
        sd = max(_std(b["singleton_share"]), _std(g["singleton_share"]))
        verdict = "within seed noise" if abs(sb - sg) <= sd else "shows" if sb < sg else "does not show (higher)"
        lines.append(f"- Singleton share lower than GiGPO's, in training (each arm's own rollouts): {verdict} "
                     f"({sb:.3f} vs {sg:.3f}, largest seed std {sd:.3f}; steps in singletons "
                     f"{_mean(b['steps_in_singletons']):.3f} vs {_mean(g['steps_in_singletons']):.3f}).")
        if ov:
            pr = ov["paired"]
            pb, pg = _mean(pr["bipace_singleton_share"]), _mean(pr["gigpo_singleton_share"])
            lines.append(f"- Singleton share lower than GiGPO's on the same batches: "
                         f"{'shows' if pb < pg else 'does not show'} ({pb:.3f} vs {pg:.3f}; with "
                         f"`eps_pairs=distinct` {_mean(pr['bipace-distinct_singleton_share']):.3f}).")
        for split in ("dev", "test"):
            xb, xg = _mean(b[f"{split}_success"]), _mean(g[f"{split}_success"])
            sd = max(_std(b[f"{split}_success"]), _std(g[f"{split}_success"]))
            verdict = ("within seed noise" if abs(xb - xg) <= sd else
                       "BiPACE higher" if xb > xg else "BiPACE lower")
            lines.append(f"- {split} success vs GiGPO: {xb:.3f} vs {xg:.3f} ({verdict}; largest seed std {sd:.3f}).")
        lines.append(f"- No giant cluster: {'shows' if b['giant_clusters'] == 0 else 'does not show'} "
                     f"(P90 cluster size {b['cluster_p90']:.2f}, max {b['cluster_p90_max']:.2f}).")
        for v in ("bipace-distinct", "bipace-state"):
            if v in res:
                x = res[v]
                lines.append(f"- {v}: singleton share {_mean(x['singleton_share']):.3f}, dev "
                             f"{_mean(x['dev_success']):.3f}, test {_mean(x['test_success']):.3f} "
                             f"(bipace: dev {_mean(b['dev_success']):.3f}, test {_mean(b['test_success']):.3f}).")
    else:
        lines.append("- GiGPO reference runs not finished in OUT: no comparison.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="BiPACE vs GiGPO reproduction check (module docstring)")
    p.add_argument("--init", default=None, help="SFT checkpoint folder (default data/lm/sft)")
    p.add_argument("--out", default="runs/seedcheck")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rollouts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--overhead-rollouts", type=int, default=32, help="0: skip the recording-cost measurement")
    p.add_argument("--overhead-reps", type=int, default=3)
    p.add_argument("--arms", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                   help="BiPACE arms to train (the card's defaults and two ablations; none: only summarise)")
    p.add_argument("--train-refs", action="store_true", help="also train missing grpo / gigpo runs")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write DIR/bipace_check.md and .json (the committed check: docs/results; default: none)")
    # learning_lm's protocol settings (same defaults)
    add_protocol_arguments(p)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    from agents.lm.agent import LMAgent, default_checkpoint_dir

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = Path(args.out)
    init = Path(args.init) if args.init else default_checkpoint_dir()
    env_kwargs = protocol_env_kwargs(init, args)
    weaken(init, out / "start", args.target, args.calib, env_kwargs, args.bisect_steps, args)
    start_file = out / "start" / f"eval-{args.eval_episodes}.json"
    if start_file.is_file():
        start = json.loads(start_file.read_text())
    else:
        agent = LMAgent(env_id=ENV, checkpoint=out / "start")
        start = {}
        for split in ("dev", "test"):
            m = evaluate_metrics(agent, split, args.eval_episodes, env_kwargs, args)
            start[split] = m[f"{split}_success"]
            start.update({f"{split}/{f}": m[f"{split}_success/{f}"] for f in FAMILIES if f"{split}_success/{f}" in m})
        write_text_atomic(start_file, json.dumps(start))
    ov = None
    if args.overhead_rollouts > 0:  # measured once per OUT and settings, then reused
        key = {"rollouts": args.overhead_rollouts, "reps": args.overhead_reps, "group_size": args.group_size,
               "temperature": args.temperature, "max_turns": args.max_turns}
        cache = out / "bipace-overhead.json"
        saved = json.loads(cache.read_text()) if cache.is_file() else {}
        if saved.get("key") == key:
            ov = saved["result"]
        else:
            ov = overhead(out, env_kwargs, args)
            write_text_atomic(cache, json.dumps({"key": key, "result": ov}, indent=2))
    if args.train_refs:
        for seed in args.seeds:
            for name in ("grpo", "gigpo"):
                if not _finished(out, name, seed, args.iterations):
                    _train_one((name, seed, args, env_kwargs, out, None))
    for name in args.arms:  # every seed of one arm before the next: the default arm finishes first
        for seed in args.seeds:
            if not _finished(out, name, seed, args.iterations):
                t1 = time.perf_counter()
                hist = _algo("bipace", args, env_kwargs, **VARIANTS[name]).train(
                    ENV, iterations=args.iterations, seed=seed, out_dir=out / name / f"seed{seed}",
                    init=out / "start", progress=not args.no_progress).history
                print(f"{name} seed {seed}: dev {hist[-1].get('dev_success', float('nan')):.2f} "
                      f"test {hist[-1].get('test_success', float('nan')):.2f} ({time.perf_counter() - t1:.0f}s)",
                      flush=True)
    res = summarise(out, start, args)
    commit = git_commit()
    meta = {"command": "python -m benchmarks.repro_bipace " + " ".join(sys.argv[1:] if argv is None else argv),
            "commit": commit, "seeds": args.seeds, "iterations": args.iterations, "rollouts": args.rollouts,
            "group_size": args.group_size, "eval_episodes": args.eval_episodes, "eval_seed": EVAL_SEED,
            "wall_s": time.perf_counter() - t0}
    text = render(res, start, ov, meta)
    if args.results:
        results = Path(args.results)
        write_text_atomic(results / "bipace_check.json", json.dumps({"meta": meta, "start": start, "arms": res,
                                                                     "overhead": ov}, indent=2, default=float))
        write_text_atomic(results / "bipace_check.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
