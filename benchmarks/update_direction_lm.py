"""Does an LM update's effect on greedy success come from its direction or from its size?

    python -m benchmarks.update_direction_lm --run CKPT [--start data/lm/sft] [--alphas 1 -1 0.5]
                                             [--controls 2] [--eval-episodes 400] [--json PATH] [--results DIR]

For a trained checkpoint θ₁ (``--run``) and the checkpoint it started from θ₀ (``--start``, default the shipped
agent), Δ = θ₁ − θ₀. The script measures greedy test success f on the learning benchmark's paired test episodes
(`benchmarks.learning_lm`: the first ``--eval-episodes`` test tasks, families in turn, seeds ``EVAL_SEED + i``) at
θ₀ + αΔ for α in ``--alphas`` (0 and 1 always), and at θ₀ + Δ ⊙ s for ``--controls`` random sign patterns s with
one sign per output row of each weight matrix (the same per-row sizes as the update, a random direction); with
``--classes``, also at θ₀ ± Δ restricted to one parameter class (embedding, attention, MLP, norm weights).

A second-order expansion of f along the update separates the two:

* first order, the update's direction: (f(+1) − f(−1)) / 2 ≈ ∇f·Δ;
* second order, its size whatever its sign: (f(+1) + f(−1)) / 2 − f(0) ≈ ½ ΔᵀHΔ.

Both come with 95% Student-t intervals over the episodes' paired differences, overall and per family, with the
number of episodes whose outcome changed. An update that has learned something greedy decoding uses has a first
order part above 0. When both f(+1) and f(−1) fall below f(0) by about the same amount, the update's cost is its
size along directions where greedy success is curved (near-tied decisions), not what it learned; the random-sign
controls say whether a step of that size in any direction costs as much.

Writes ``--json PATH``, and ``DIR/update_direction_lm.{md,json}`` only with ``--results DIR``; ``--from-json A.json
B.json ... --results DIR`` writes that table from saved results, one block per run, with a summary of them all.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

ENV = "shopsim/Shopping-v0"


def _interval(xs: list[float]) -> dict:
    """Mean and 95% Student-t interval over the episodes (`shopsim.leaderboard.metrics.stat`)."""
    from shopsim.leaderboard.metrics import stat

    st = stat(xs)
    return {"mean": st["mean"], "ci95": st["ci95"] or [st["mean"], st["mean"]], "n": st["n"]}


def play(agent, tasks: list[int], env_kwargs: dict, num_envs: int) -> list:
    """The greedy trajectories of the paired test episodes (the trainers' evaluation episodes)."""
    from benchmarks.learning_lm import EVAL_SEED
    from shopsim.rollout import collect

    agent.sampling.greedy = True
    return collect(ENV, agent, tasks=tasks, seeds=[EVAL_SEED + i for i in range(len(tasks))], split="test",
                   num_envs=num_envs, env_kwargs=env_kwargs, progress=False, agent_seed=EVAL_SEED)


def evaluate(agent, tasks: list[int], env_kwargs: dict, num_envs: int) -> list[tuple[str, bool]]:
    """(family, success) of each paired test episode, greedy."""
    return [(str(t.meta.get("family")), bool(t.success)) for t in play(agent, tasks, env_kwargs, num_envs)]


def paired_setup(args) -> tuple[Path, dict, list[int]]:
    """``(start folder, env options, test tasks)`` of a comparison of ``args.run`` with its start: the start is
    ``args.start`` or the shipped agent, both must be model folders, the env options are the start's manifest's
    with ``args.max_turns``, the tasks the first ``args.eval_episodes`` test tasks. Sets the torch threads."""
    import torch

    from agents.lm.agent import default_checkpoint_dir
    from agents.registry import manifest_env_kwargs
    from baselines.core.tasks import eval_tasks
    from shopsim.errors import ConfigError

    torch.set_num_threads(args.threads)
    start_dir = Path(args.start) if args.start else default_checkpoint_dir()
    for d in (start_dir, Path(args.run)):
        if not (d / "config.json").is_file():
            raise ConfigError(f"{d}: not a model folder (no config.json); pass a checkpoint folder")
    env_kwargs = {**manifest_env_kwargs(start_dir), "max_turns": args.max_turns}
    return start_dir, env_kwargs, eval_tasks(ENV, "test", args.eval_episodes)


def row_signs(delta, generator):
    """±1 per output row of a weight matrix (one sign for a vector)."""
    import torch

    shape = (delta.shape[0],) + (1,) * (delta.dim() - 1) if delta.dim() >= 2 else (1,)
    return torch.randint(0, 2, shape, generator=generator).to(delta.dtype) * 2 - 1


def run(args) -> dict:
    import torch

    from agents.lm.agent import LMAgent
    from shopsim.errors import ConfigError

    start_dir, env_kwargs, tasks = paired_setup(args)
    agent = LMAgent(env_id=ENV, checkpoint=start_dir, max_new_tokens=args.max_new_tokens)
    theta0 = {k: v.detach().clone() for k, v in agent.model.state_dict().items()}
    trained = LMAgent(env_id=ENV, checkpoint=Path(args.run), max_new_tokens=args.max_new_tokens).model.state_dict()
    if set(trained) != set(theta0) or any(trained[k].shape != theta0[k].shape for k in theta0):
        raise ConfigError(f"{args.run} is not the same architecture as {start_dir}")
    delta = {k: trained[k].detach() - theta0[k] for k in theta0 if theta0[k].is_floating_point()}

    def at(step) -> list[tuple[str, bool]]:
        agent.model.load_state_dict({k: theta0[k] + step(k, delta[k]) if k in delta else theta0[k] for k in theta0})
        return evaluate(agent, tasks, env_kwargs, args.num_envs)

    points: dict[str, list[tuple[str, bool]]] = {}
    for a in sorted({0.0, 1.0, *args.alphas}):
        points[f"alpha={a:g}"] = at(lambda k, d, a=a: a * d)
        print(f"alpha {a:g}: {sum(s for _, s in points[f'alpha={a:g}']) / len(tasks):.4f}", flush=True)
    if getattr(args, "classes", False):  # ±Δ restricted to one parameter class (grad_noise_lm's classes)
        from benchmarks.grad_noise_lm import MODULE_CLASSES

        for cls, marks in MODULE_CLASSES.items():
            part = {k for k in delta if any(m in k for m in marks)}
            for sign in (1.0, -1.0):
                key = f"{cls}:alpha={sign:g}"
                points[key] = at(lambda k, d, part=part, sign=sign: sign * d if k in part else 0.0 * d)
                print(f"{cls} only, alpha {sign:g}: {sum(s for _, s in points[key]) / len(tasks):.4f}", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    for i in range(args.controls):
        signs = {k: row_signs(d, gen) for k, d in delta.items()}
        points[f"row-signs-{i}"] = at(lambda k, d, signs=signs: d * signs[k])
        print(f"random row signs {i}: {sum(s for _, s in points[f'row-signs-{i}']) / len(tasks):.4f}", flush=True)

    fams = sorted({f for f, _ in points["alpha=0"]})
    base = [float(s) for _, s in points["alpha=0"]]
    out: dict = {"start": str(start_dir), "run": str(args.run), "episodes": len(tasks), "families": fams,
                 "delta_norm": math.sqrt(sum(float((d.double() ** 2).sum()) for d in delta.values())),
                 "points": {}}
    for name, res in points.items():
        xs = [float(s) for _, s in res]
        out["points"][name] = {
            "success": sum(xs) / len(xs), "changed": sum(x != b for x, b in zip(xs, base, strict=True)),
            "gain": _interval([x - b for x, b in zip(xs, base, strict=True)]),
            "success_family": {f: sum(x for (g, _), x in zip(res, xs, strict=True) if g == f)
                               / sum(1 for g, _ in res if g == f) for f in fams}}
    classes = sorted({k.split(":")[0] for k in points if ":" in k})
    if classes:
        out["classes"] = {}
        for cls in classes:
            plus = [float(s) for _, s in points[f"{cls}:alpha=1"]]
            minus = [float(s) for _, s in points[f"{cls}:alpha=-1"]]
            out["classes"][cls] = {
                "first_order": _interval([(a - b) / 2 for a, b in zip(plus, minus, strict=True)]),
                "second_order": _interval([(a + b) / 2 - c for a, b, c in zip(plus, minus, base, strict=True)])}
    if "alpha=-1" in points:
        plus = [float(s) for _, s in points["alpha=1"]]
        minus = [float(s) for _, s in points["alpha=-1"]]
        fam_of = [f for f, _ in points["alpha=0"]]
        first = [(p - m) / 2 for p, m in zip(plus, minus, strict=True)]
        second = [(p + m) / 2 - b for p, m, b in zip(plus, minus, base, strict=True)]
        out["first_order"] = _interval(first)
        out["second_order"] = _interval(second)
        out["first_order_family"] = {f: _interval([x for x, g in zip(first, fam_of, strict=True) if g == f])
                                     for f in fams}
        out["second_order_family"] = {f: _interval([x for x, g in zip(second, fam_of, strict=True) if g == f])
                                      for f in fams}
    return out


def _ci(st: dict) -> str:
    lo, hi = st["ci95"]
    return f"{st['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def write_table(results: list[dict], directory: Path) -> None:
    """``DIR/update_direction_lm.{md,json}``: one block per decomposed run, then the first/second-order summary."""
    from shopsim.paths import write_text_atomic

    lines = ["# Direction or size: what an LM update does to greedy success", "",
             "Generated by `benchmarks/update_direction_lm.py`; do not edit by hand. Each block takes one trained "
             "checkpoint θ₁ and its start θ₀ (Δ = θ₁ − θ₀) and evaluates greedy test success on the learning "
             "benchmark's paired test episodes at θ₀ + αΔ and at θ₀ + Δ ⊙ s (s: a random sign per output row). "
             "First order (f(+Δ) − f(−Δ))/2 ≈ ∇f·Δ is what the update's direction gives; second order "
             "(f(+Δ) + f(−Δ))/2 − f(θ₀) ≈ ½ΔᵀHΔ what its size costs whatever its sign. Intervals: 95% Student-t "
             "over the episodes' paired differences.", ""]
    summary = ["| run | ‖Δ‖ | f(θ₀) | f(θ₀ + Δ) | first order | second order | random row signs |",
               "|---|---|---|---|---|---|---|"]
    for res in results:
        fams = res["families"]
        name = res.get("label") or res["run"]
        lines += [f"## {name}", "", f"- command: `{res['command']}`", f"- commit: `{res['commit']}`",
                  f"- start `{res['start']}`, trained checkpoint `{res['run']}`; ‖Δ‖ = {res['delta_norm']:.3f}; "
                  f"{res['episodes']} paired test episodes, greedy; wall {res['wall_s']:.0f} s", "",
                  "| weights | success | gain over the start (95% CI) | episodes changed | " + " | ".join(fams) + " |",
                  "|---|---|---|---|" + "---|" * len(fams)]
        for key, pt in res["points"].items():
            if key.startswith("alpha"):
                label = f"θ₀ + {key.split('=')[1]}·Δ"
            elif ":" in key:
                label = f"θ₀ + {key.split('=')[1]}·Δ ({key.split(':')[0]} only)"
            else:
                label = f"θ₀ + Δ ⊙ s ({key})"
            lines.append(f"| {label} | {pt['success']:.4f} | {_ci(pt['gain'])} | {pt['changed']} | "
                         + " | ".join(f"{pt['success_family'][f]:.2f}" for f in fams) + " |")
        controls = [pt["gain"]["mean"] for k, pt in res["points"].items() if k.startswith("row-signs")]
        if "first_order" in res:
            lines += ["", "| family | first order | second order |", "|---|---|---|"]
            lines += [f"| {f} | {_ci(res['first_order_family'][f])} | {_ci(res['second_order_family'][f])} |"
                      for f in fams]
            if res.get("classes"):
                lines += ["", "| Δ of one parameter class only | first order | second order |", "|---|---|---|"]
                lines += [f"| {c} | {_ci(v['first_order'])} | {_ci(v['second_order'])} |"
                          for c, v in res["classes"].items()]
            pts = res["points"]
            summary.append(f"| {name} | {res['delta_norm']:.3f} | {pts['alpha=0']['success']:.4f} | "
                           f"{pts['alpha=1']['success']:.4f} | {_ci(res['first_order'])} | "
                           f"{_ci(res['second_order'])} | "
                           + (", ".join(f"{c:+.4f}" for c in controls) if controls else "not run") + " |")
        lines.append("")
    lines += ["## Summary", "", *summary, ""]
    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / "update_direction_lm.md", "\n".join(lines))
    write_text_atomic(directory / "update_direction_lm.json", json.dumps({"runs": results}, indent=2))


def main(argv=None) -> int:
    import shlex
    import sys

    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import write_text_atomic

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default=None, help="the trained checkpoint folder (θ₁)")
    p.add_argument("--label", action="append", default=None,
                   help="the run's name in the table (default: its folder); with --from-json, one per file, in order")
    p.add_argument("--from-json", nargs="+", default=None, metavar="JSON",
                   help="no evaluation: write the table from results saved with --json (one block each)")
    p.add_argument("--start", default=None, help="the checkpoint it started from (default: the shipped agent)")
    p.add_argument("--alphas", type=float, nargs="*", default=[-1.0, 0.5],
                   help="steps along the update besides 0 and 1 (−1 is needed for the first/second-order split)")
    p.add_argument("--controls", type=int, default=2, help="random row-sign patterns of the update")
    p.add_argument("--classes", action="store_true",
                   help="also ±Δ of each parameter class alone (embedding, attention, mlp, norm)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random signs")
    p.add_argument("--eval-episodes", type=int, default=400)
    p.add_argument("--max-turns", type=int, default=40, help="the learning benchmark's turn limit")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--results", default=None, help="write DIR/update_direction_lm.{md,json}")
    args = p.parse_args(argv)
    if args.from_json:
        if not args.results:
            p.error("--from-json writes a table: give --results DIR")
        results = [json.loads(Path(f).read_text()) for f in args.from_json]
        if args.label:
            if len(args.label) != len(results):
                p.error(f"{len(args.label)} --label for {len(results)} --from-json files; give one per file")
            for res, label in zip(results, args.label, strict=True):
                res["label"] = label
        write_table(results, Path(args.results))
        return 0
    if args.run is None:
        p.error("give --run CKPT (or --from-json JSON ... --results DIR)")
    if args.eval_episodes < 2 or args.controls < 0:
        p.error("--eval-episodes must be at least 2 and --controls at least 0")
    t0 = time.perf_counter()
    res = run(args)
    res.update({"command": "python -m benchmarks.update_direction_lm "
                + shlex.join(sys.argv[1:] if argv is None else argv),
                "commit": git_commit(), "wall_s": time.perf_counter() - t0, "seed": args.seed,
                "label": args.label[0] if args.label else None})
    if "first_order" in res:
        print(f"first order {_ci(res['first_order'])}, second order {_ci(res['second_order'])}")
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(res, indent=2))
    if args.results:
        write_table([res], Path(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
