"""Reproduction check of BASIS (docs/algorithms/basis.md) on Shopping-v0: baseline accuracy and success at a
fraction of the rollouts.

    python -m benchmarks.repro_basis [--out runs/seedcheck] [--seeds 0 1 2] [--iterations 10] [--rollouts 32]
        [--group-size 8] [--eval-episodes 50] [--eval-every 10] [--task-pool 16] [--mse-tasks 64] [--equal]
        [--results DIR]
    python -m benchmarks.repro_basis --results docs/results    # the committed check
    python -m benchmarks.repro_basis --quick    # 1 seed, 2 iterations, into runs/repro_basis_quick

The claims (Gong et al., arXiv 2605.27293): BASIS's baseline predicts the realised reward far better than a batch
mean and, from one rollout, better than the group mean of 8 rollouts; trained with one rollout per task it reaches
success close to GRPO with G = 8 at a fraction of the rollouts and wall-clock time.

What it does, from the learning benchmark's start (`benchmarks.learning_lm`: the shipped SFT checkpoint weakened to
about 0.30 dev success, in ``OUT/start``; built there if missing) and with its settings (learning rate, rollout
temperature, per-turn token limit, turn limit, optimizer steps per iteration, paired evaluation episodes):

(a) **Baseline MSE, no training.** For ``--mse-tasks`` training tasks (task id + seed) the start policy plays each
    task 17 times: 8 rollouts form the offline table (N_ref), 1 is the online rollout r_i, 8 more give the group
    mean. The tasks are cut into batches of ``rollouts / group_size`` (the training batch) and of all tasks, over
    ``--mse-perms`` random orders, and each baseline's mean squared error against r_i is reported: BASIS (its
    default reading, the ``active_set="offline_mean"`` reading, ``fallback_high=False`` and the ``kernel``
    alternative), the batch mean
    (r_i included, REINFORCE++-style), the leave-one-out batch mean, the group mean of 8 and the offline mean.
(b) **Success.** BASIS trained with one rollout on each of ``rollouts / group_size`` tasks per iteration (the same
    number of tasks as GRPO, 1/8 of its online rollouts) from a pool of ``--task-pool`` tasks whose offline table
    costs ``task_pool × 8`` more rollouts, ``--seeds`` seeds, into ``OUT/basis/seed<S>``; ``--equal`` also trains
    BASIS on ``rollouts`` tasks per iteration (GRPO's online rollout count) into ``OUT/basis-equal/seed<S>``
    (``--equal-seeds``; the same seed's table is reused and its rollouts counted again). The
    GRPO and GiGPO runs of the learning benchmark found in ``OUT/grpo`` and ``OUT/gigpo`` (same start, iterations
    and evaluation) are the references; this script never trains them. A finished run is reused, not retrained.

Prints the tables; with ``--results DIR`` writes ``DIR/basis_check.md`` and ``DIR/basis_check.json`` (tables,
command, git commit, seeds, wall time; ``--results docs/results``: the committed check; ``--quick`` without
``--results``: into OUT; otherwise no table is written). Always writes ``OUT/basis_mse/rewards.json`` (the rewards
of (a), reused by a rerun).
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
    FAMILIES,
    _algo,
    add_protocol_arguments,
    evaluate_metrics,
    protocol_env_kwargs,
    weaken,
)
from shopsim.leaderboard.results import git_commit

N_REF = 8
N_GROUP = 8




# ---------------------------------------------------------------------------------------------------- (a) MSE
def mse_rewards(args, env_kwargs: dict, out: Path) -> dict:
    """17 rollouts of the start policy per task (8 table, 1 online, 8 group), cached in OUT/basis_mse."""
    from shopsim.rollout import collect

    path = out / "basis_mse" / "rewards.json"
    if path.is_file():
        data = json.loads(path.read_text())
        if data.get("tasks") == args.mse_tasks and data.get("seed") == args.mse_seed:
            return data
    algo = _algo("basis", args, env_kwargs, task_pool=args.mse_tasks)
    agent = algo.make_agent(ENV, out / "start", args.mse_seed)
    pool = algo.draw_pool(ENV, args.mse_seed + 1000)  # other tasks than any training run's pool
    t0 = time.perf_counter()
    trajs = collect(ENV, agent, tasks=[p[0] for p in pool], seeds=[p[1] for p in pool], episodes=len(pool),
                    split="train", group_size=N_REF + 1 + N_GROUP, num_envs=8, env_kwargs=env_kwargs,
                    progress=not args.no_progress, agent_seed=args.mse_seed)
    per: dict[str, list[float]] = {}
    for tr in trajs:
        per.setdefault(f"{tr.task_id}|{tr.seed}", []).append(float(tr.success))
    rows = [per[f"{t}|{s}"] for t, s in pool]
    data = {"tasks": args.mse_tasks, "seed": args.mse_seed, "pool": pool, "rewards": rows,
            "rollouts": len(trajs), "seconds": time.perf_counter() - t0}
    path.parent.mkdir(parents=True, exist_ok=True)
    from shopsim.paths import write_text_atomic

    write_text_atomic(path, json.dumps(data))
    return data


def mse_table(data: dict, batch_sizes: list[int], perms: int, seed: int) -> list[dict]:
    """Each baseline's MSE against the online reward, per batch size, averaged over `perms` random batchings."""
    from baselines.basis import BASISConfig, basis_baselines

    R = torch.tensor(data["rewards"], dtype=torch.float64)  # [M, 17]
    table, online, group = R[:, :N_REF], R[:, N_REF], R[:, N_REF + 1:]
    M = R.shape[0]
    variants = {"BASIS (card: per-β active set)": BASISConfig(),
                "BASIS (active set at offline mean)": BASISConfig(active_set="offline_mean"),
                "BASIS (zero fallback near 0 only)": BASISConfig(fallback_high=False),
                "BASIS kernel alternative": BASISConfig(baseline="kernel")}
    rng = np.random.default_rng(seed)
    out = []
    for B in batch_sizes:
        acc: dict[str, list[float]] = {}
        act: list[float] = []
        for _ in range(perms):
            order = torch.as_tensor(rng.permutation(M))
            sq: dict[str, list[torch.Tensor]] = {}
            for s in range(0, M - B + 1, B):
                idx = order[s:s + B]
                r = online[idx]
                mask = torch.ones(len(idx), N_REF, dtype=torch.bool)
                for name, cfg in variants.items():
                    res = basis_baselines(r, table[idx], mask, cfg)
                    sq.setdefault(name, []).append((r - res.b) ** 2)
                    if name.startswith("BASIS (card"):
                        act.append(float(res.active.double().mean()))
                sq.setdefault("batch mean (r_i included)", []).append((r - r.mean()) ** 2)
                loo = (r.sum() - r) / max(len(idx) - 1, 1)
                sq.setdefault("leave-one-out batch mean", []).append((r - loo) ** 2)
                sq.setdefault(f"group mean of {N_GROUP} more rollouts", []).append((r - group[idx].mean(1)) ** 2)
                sq.setdefault(f"offline mean of the {N_REF} table rollouts", []).append(
                    (r - table[idx].mean(1)) ** 2)
                sq.setdefault("zero", []).append(r ** 2)
            for k, v in sq.items():
                acc.setdefault(k, []).append(float(torch.cat(v).mean()))
        for k, v in acc.items():
            out.append({"batch": B, "baseline": k, "mse": float(np.mean(v)),
                        "mse_std_over_batchings": float(np.std(v))})
        out.append({"batch": B, "baseline": "(BASIS active share)", "mse": float(np.mean(act)),
                    "mse_std_over_batchings": float(np.std(act))})
    return out


# ---------------------------------------------------------------------------------------------------- (b) success
def train_basis(args, env_kwargs: dict, out: Path, seed: int, tasks: int, folder: str) -> dict:
    """One BASIS run from OUT/start (reused when finished); returns its final metrics and costs."""
    torch.set_num_threads(args.threads)
    run_dir = out / folder / f"seed{seed}"
    shared = out / "basis" / f"seed{seed}" / "basis_table.json"
    if folder != "basis" and shared.is_file() and not (run_dir / "basis_table.json").exists():
        # same seed → same task pool and start: the trainer reuses the table (it checks pool, N_ref and start)
        from shopsim.paths import write_text_atomic

        write_text_atomic(run_dir / "basis_table.json", shared.read_text())
    algo = _algo("basis", args, env_kwargs, group_size=1, tasks_per_iter=tasks, task_pool=args.task_pool,
                 n_ref=N_REF)
    t0 = time.perf_counter()
    res = algo.train(ENV, iterations=args.iterations, seed=seed, out_dir=run_dir, init=out / "start",
                     progress=not args.no_progress)
    secs = time.perf_counter() - t0
    return _run_summary(run_dir, secs if not res.already_complete else None)


def _run_summary(run_dir: Path, process_s: float | None) -> dict | None:
    """Final dev/test success, rollouts and the loop's own time (rollout_s + update_s) of a finished run."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return None
    rows = list(csv.DictReader(path.open()))
    if not rows or rows[-1].get("test_success") in (None, ""):
        return None
    last = rows[-1]
    pre = run_dir / "pretrain.json"
    pre = json.loads(pre.read_text()) if pre.is_file() else {}
    table = run_dir / "basis_table.json"
    offline_s = json.loads(table.read_text()).get("seconds", 0.0) if table.is_file() else 0.0

    def mean(k):
        vals = [float(r[k]) for r in rows if r.get(k) not in (None, "")]
        return float(np.mean(vals)) if vals else None

    return {"iterations": int(last["iteration"]), "test": float(last["test_success"]),
            "dev": float(last["dev_success"]),
            "online_rollouts": int(sum(float(r.get("rollouts") or 0) for r in rows)),
            "offline_rollouts": int(pre.get("offline_rollouts", 0)),
            "loop_s": float(sum(float(r.get("rollout_s") or 0) + float(r.get("update_s") or 0) for r in rows)),
            "offline_s": float(offline_s), "process_s": process_s,
            "gen_tokens": int(sum(float(r.get("gen_tokens") or 0) for r in rows)),
            **{k: mean(k) for k in ("basis_baseline_mse", "batch_mean_baseline_mse", "offline_mean_baseline_mse",
                                    "basis_active_share", "beta_star_log10_mean", "train_success")}}


def _fmt(x, spec=".2f"):
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def write_results(args, start: dict, mse: list[dict], mse_data: dict | None, runs: dict, wall: float) -> None:
    lines = ["# BASIS reproduction check (Shopping-v0)", "",
             "Generated by `python -m benchmarks.repro_basis` (docs/algorithms/basis.md); do not edit by hand.", "",
             f"Command: `{' '.join(['python -m benchmarks.repro_basis', *sys.argv[1:]])}`  ",
             f"Commit: `{git_commit()}`, seeds {' '.join(map(str, args.seeds))}, script wall time {wall:.0f} s.  ",
             f"Start: the learning benchmark's weakened SFT checkpoint (`OUT/start`), test success "
             f"{start['test']:.2f}, dev {start['dev']:.2f} on {args.eval_episodes} paired greedy episodes "
             f"({' + '.join(FAMILIES)}). Rollout temperature {args.temperature}, lr {args.lr}, {args.minibatches} "
             "optimizer steps per iteration.", ""]
    if mse:
        n = mse_data["tasks"] if mse_data else 0
        lines += ["## (a) Baseline MSE against the realised reward (start policy, no training)", "",
                  f"{n} training tasks, each played {N_REF + 1 + N_GROUP} times by the start policy: {N_REF} "
                  f"rollouts form the offline table, 1 is the online reward r_i, {N_GROUP} more give the group "
                  f"mean ({mse_data['rollouts'] if mse_data else 0} rollouts). Mean over {args.mse_perms} random "
                  "batchings (± std over batchings). Lower is better; the reward is the success flag.", ""]
        sizes = sorted({r["batch"] for r in mse})
        names = list(dict.fromkeys(r["baseline"] for r in mse))
        lines += ["| baseline | " + " | ".join(f"batch of {b}" for b in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for nm in names:
            cells = []
            for b in sizes:
                r = next((x for x in mse if x["batch"] == b and x["baseline"] == nm), None)
                cells.append("–" if r is None else f"{r['mse']:.4f} ± {r['mse_std_over_batchings']:.4f}")
            lines.append(f"| {nm} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## (b) Success after training", "",
              f"{args.iterations} iterations, test/dev success at the end (mean ± std over seeds, per seed). "
              "Rollouts: online = generated during training; offline = BASIS's table (task_pool × 8, once). "
              "Time: the training loop's own rollout + update seconds summed over iterations (the offline table "
              "separately); the machine's 2 cores were shared with other jobs, so times are indicative only.", "",
              "| run | tasks × G per iter | seeds | test final | per seed | dev final | online rollouts | "
              "offline rollouts | total rollouts | loop s | offline s |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, info in runs.items():
        done = [r for r in info["runs"] if r is not None]
        if not done:
            lines.append(f"| {name} | {info['shape']} | 0 | – | not found | – | – | – | – | – | – |")
            continue
        te = np.array([r["test"] for r in done])
        dv = np.array([r["dev"] for r in done])
        on = int(np.mean([r["online_rollouts"] for r in done]))
        off = int(np.mean([r["offline_rollouts"] for r in done]))
        lines.append(f"| {name} | {info['shape']} | {len(done)} | {te.mean():.2f} ± {te.std():.2f} | "
                     f"{' '.join(f'{x:.2f}' for x in te)} | {dv.mean():.2f} ± {dv.std():.2f} | {on} | {off} | "
                     f"{on + off} | {np.mean([r['loop_s'] for r in done]):.0f} | "
                     f"{np.mean([r['offline_s'] for r in done]):.0f} |")
    lines += ["", "BASIS's own training metrics (mean over iterations and seeds): baseline MSE against the online "
              "reward of BASIS's b vs the batch mean vs the offline mean, active share, mean log10 β*.", "",
              "| run | BASIS b MSE | batch-mean MSE | offline-mean MSE | active share | log10 β* | train success |",
              "|---|---|---|---|---|---|---|"]
    for name, info in runs.items():
        done = [r for r in info["runs"] if r is not None and r.get("basis_baseline_mse") is not None]
        if not done:
            continue

        def m(k, rs=done):
            vals = [r[k] for r in rs if r.get(k) is not None]
            return float(np.mean(vals)) if vals else None

        lines.append(f"| {name} | {_fmt(m('basis_baseline_mse'), '.4f')} | {_fmt(m('batch_mean_baseline_mse'), '.4f')}"
                     f" | {_fmt(m('offline_mean_baseline_mse'), '.4f')} | {_fmt(m('basis_active_share'))} | "
                     f"{_fmt(m('beta_star_log10_mean'))} | {_fmt(m('train_success'))} |")
    lines.append("")
    if args.results:
        results = Path(args.results)
        from shopsim.paths import write_text_atomic

        write_text_atomic(results / "basis_check.md", "\n".join(lines))
        payload = {"command": ["python", "-m", "benchmarks.repro_basis", *sys.argv[1:]], "commit": git_commit(),
                   "seeds": args.seeds, "wall_s": wall, "start": start,
                   "settings": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, list))},
                   "mse": mse, "mse_rollouts": mse_data["rollouts"] if mse_data else 0,
                   "runs": {k: v for k, v in runs.items()}}
        write_text_atomic(results / "basis_check.json", json.dumps(payload, indent=2, default=float))
    print("\n".join(lines))


def run(args) -> None:
    from agents.lm.agent import default_checkpoint_dir

    t_all = time.perf_counter()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    init = Path(args.init) if args.init else default_checkpoint_dir()
    env_kwargs = protocol_env_kwargs(init, args)
    weaken(init, out / "start", args.target, args.calib, env_kwargs, args.bisect_steps, args)
    start_file = out / "start" / f"eval-{args.eval_episodes}.json"
    if start_file.is_file():
        start = json.loads(start_file.read_text())
    else:
        from agents.lm.agent import LMAgent

        agent = LMAgent(env_id=ENV, checkpoint=out / "start")
        start = {s: evaluate_metrics(agent, s, args.eval_episodes, env_kwargs, args)[f"{s}_success"]
                 for s in ("dev", "test")}
        start_file.write_text(json.dumps(start))
    mse, mse_data = [], None
    if args.mse_tasks:
        mse_data = mse_rewards(args, env_kwargs, out)
        B = max(1, args.rollouts // args.group_size)
        mse = mse_table(mse_data, sorted({B, args.mse_tasks}), args.mse_perms, args.mse_seed)
    G = args.group_size
    tasks = max(1, args.rollouts // G)
    runs = {f"BASIS (1 rollout × {tasks} tasks)": {"shape": f"{tasks} × 1", "folder": "basis", "tasks": tasks}}
    if args.equal:
        runs[f"BASIS (1 rollout × {args.rollouts} tasks)"] = {"shape": f"{args.rollouts} × 1",
                                                                "folder": "basis-equal", "tasks": args.rollouts}
    for info in runs.values():
        seeds = args.equal_seeds if info["folder"] == "basis-equal" and args.equal_seeds else args.seeds
        info["runs"] = [train_basis(args, env_kwargs, out, s, info["tasks"], info["folder"]) if not args.no_train
                        else _run_summary(out / info["folder"] / f"seed{s}", None) for s in seeds]
    for ref in ("grpo", "gigpo"):  # the learning benchmark's runs, read only
        runs[f"{ref} (G = {G}, reference)"] = {"shape": f"{tasks} × {G}", "folder": ref,
                                               "runs": [_run_summary(out / ref / f"seed{s}", None)
                                                        for s in args.seeds]}
    write_results(args, start, mse, mse_data, runs, time.perf_counter() - t_all)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="BASIS reproduction check (see module docstring)")
    p.add_argument("--init", default=None, help="SFT checkpoint folder (default data/lm/sft)")
    p.add_argument("--out", default="runs/seedcheck")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rollouts", type=int, default=32, help="GRPO's rollouts per iteration (the budget unit)")
    p.add_argument("--group-size", type=int, default=8, help="GRPO's G; BASIS gets rollouts/G tasks, 1 rollout each")
    p.add_argument("--task-pool", type=int, default=16,
                   help="BASIS's fixed task pool (its offline table costs task_pool × 8 rollouts)")
    p.add_argument("--equal", action="store_true", help="also train BASIS on `rollouts` tasks per iteration "
                   "(reusing the offline table of the same seed's basis run)")
    p.add_argument("--equal-seeds", nargs="+", type=int, default=None, help="seeds of the --equal runs")
    p.add_argument("--no-train", action="store_true", help="only (a) and the tables of runs already in OUT")
    p.add_argument("--mse-tasks", type=int, default=64, help="tasks of the baseline-MSE check (0: skip it)")
    p.add_argument("--mse-perms", type=int, default=50)
    p.add_argument("--mse-seed", type=int, default=0)
    # the learning benchmark's settings (benchmarks.learning_lm), which the GRPO reference runs used
    add_protocol_arguments(p)
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write DIR/basis_check.md and .json (the committed check: docs/results; default: none, OUT "
                        "with --quick)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="1 seed, 2 iterations, 8 rollouts (G = 4), 4-task pool, 8 MSE tasks, 12 eval episodes")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.iterations, args.rollouts, args.group_size, args.task_pool = [0], 2, 8, 4, 4
        args.mse_tasks, args.mse_perms, args.eval_episodes, args.eval_every = 8, 5, 12, 1
        args.calib, args.bisect_steps, args.max_turns = 12, 4, 10
        if args.out == "runs/seedcheck":
            args.out = "runs/repro_basis_quick"
        if args.results is None:  # a smoke run's tables stay beside its runs
            args.results = args.out
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
