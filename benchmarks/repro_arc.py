"""Reproduction check of ARC (docs/algorithms/arc.md): the style-bias experiment on clarify_and_buy.

    python -m benchmarks.repro_arc [--out runs/seedcheck] [--seeds 0 1 2] [--style-bias 0.1]
           [--variants grpo_bias arc_bias arc grpo] [--iterations 10] [--rollouts 32] [--group-size 8]
           [--eval-episodes 50] [--eval-every 10] [--results DIR]
    python -m benchmarks.repro_arc --out runs/seedcheck --results docs/results    # the committed check

The claim (ARC card, "What a faithful reproduction shows", [derived] from the seed digest): give the reward a
deliberate style bias, a small bonus for direct recommendations (the Shopping env's ``style_bias`` option adds
``--style-bias`` to the final reward of every episode that never asked the customer a question). Plain GRPO drifts to
the favoured style and loses success on clarify_and_buy, where the hidden constraints are revealed only by asking;
ARC, whose advantages are normalised inside (task, strategy) groups so that the bias is constant inside almost every
group, keeps its success and, evaluated without instructions, still asks when constraints are hidden.

Protocol: the learning benchmark's (`benchmarks.learning_lm`): the shipped SFT checkpoint weakened to ~0.30 dev
success (``OUT/start``, built or reused), training and evaluation on find_and_buy + clarify_and_buy, the same
learning rate, temperature, turn and token limits, update schedule and evaluation episodes (greedy, fixed seeds,
dev and test). Same rollout budget: ``--rollouts`` per iteration; GRPO runs ``rollouts / G`` tasks × G, ARC
``rollouts // 12`` tasks × 3 strategies × 4 rollouts (its 12 rollouts per task count in the budget, so it never
uses more). Variants:

* ``grpo_bias``: GRPO on the biased reward          (``OUT/arc_check/grpo_bias/seed<S>``)
* ``arc_bias``:  ARC on the biased reward           (``OUT/arc_check/arc_bias/seed<S>``)
* ``arc``:       ARC on the plain reward            (``OUT/arc/seed<S>``, ARC's row of the learning benchmark)
* ``grpo``:      GRPO on the plain reward           (``OUT/arc_check/grpo/seed<S>``; unlike the learning benchmark's
  own ``OUT/grpo`` runs it logs the question share and entropy)
* ``arc_bias_free``: ARC on the biased reward with the no-instruction group (``free_group``; 16 rollouts per task,
  so ``rollouts // 16`` tasks)
* ``arc_bias_noent``: ARC on the biased reward without the entropy bonus (the card's entropy-collapse check)

GRPO's runs log the token entropy too (``needs_entropy``; the loss is unchanged). A finished run found in its folder
is reused, not retrained. The learning benchmark's own GRPO and GiGPO runs (``OUT/grpo``, ``OUT/gigpo``, plain
reward) are listed as references when they hold a finished ``metrics.csv``.

Reported per variant (mean ± std over seeds, final evaluation): test success overall and per family, the share of
test episodes that asked a question (overall and on clarify_and_buy), the answer-latency proxy (turns and characters
before the first user-visible message), the question share of the training rollouts (first iteration and mean of the
last three) and the token entropy (first and last iteration). Prints the table; with ``--results DIR`` writes
``DIR/arc_check.md`` and ``DIR/arc_check.json`` (table, command, commit, seeds, wall time;
``--results docs/results``: the committed check); without it no table is written.
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

from benchmarks.learning_lm import ARC_M, ARC_N, ENV, _algo, add_protocol_arguments, evaluate_metrics, weaken
from shopsim.leaderboard.results import git_commit

#: variant -> (algorithm, biased reward, extra config)
VARIANTS = {
    "grpo_bias": ("grpo", True, {}),
    "arc_bias": ("arc", True, {}),
    "arc": ("arc", False, {}),
    "grpo": ("grpo", False, {}),
    "arc_bias_free": ("arc", True, {"free_group": True}),
    "arc_bias_noent": ("arc", True, {"entropy_coef": 0.0}),
}
CLARIFY = "clarify_and_buy"




def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / "arc" / f"seed{seed}" if variant == "arc" else out / "arc_check" / variant / f"seed{seed}"


def train_variant(variant: str, seed: int, args, env_kwargs: dict, out: Path) -> Path:
    """One (variant, seed) run from the shared start; a finished run is reused by the trainer."""
    name, biased, extra = VARIANTS[variant]
    ek = {**env_kwargs, "style_bias": args.style_bias} if biased else dict(env_kwargs)
    if extra.get("free_group"):  # one more group of n per task: fewer tasks, same budget
        extra = {**extra, "tasks_per_iter": max(1, args.rollouts // (ARC_N * (ARC_M + 1)))}
    algo = _algo(name, args, ek, **extra)
    algo.needs_entropy = True  # log the token entropy of every variant (GRPO's loss does not use it)
    d = run_dir(out, variant, seed)
    t0 = time.perf_counter()
    res = algo.train(ENV, iterations=args.iterations, seed=seed, out_dir=d, init=out / "start",
                     progress=not args.no_progress)
    state = "reused" if res.already_complete else f"{time.perf_counter() - t0:.0f}s"
    print(f"{variant} seed {seed}: test success {res.history[-1].get('test_success', float('nan')):.2f} ({state})",
          flush=True)
    return d


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: float(v) for k, v in r.items() if v not in (None, "")} for r in csv.DictReader(f)]


def run_metrics(d: Path, iterations: int) -> dict | None:
    """What the table reports for one finished run (None when its metrics.csv is missing or unfinished)."""
    p = d / "metrics.csv"
    if not p.is_file():
        return None
    rows = _rows(p)
    if len(rows) < iterations or "test_success" not in rows[iterations - 1]:
        return None
    rows = rows[:iterations]
    last = rows[-1]
    out = {k: last[k] for k in last if k.startswith(("test_", "dev_"))}
    tail = rows[-3:]
    for k in ("train_asked", "train_turns_before_first_answer", "train_success", "entropy"):
        if k in rows[0]:
            out[f"{k}_first"] = rows[0][k]
            out[f"{k}_last3"] = float(np.mean([r[k] for r in tail if k in r]))
    for k in rows[0]:
        if k.startswith(("strategy_asked/", "strategy_success/")):
            out[f"{k}_mean"] = float(np.mean([r[k] for r in rows if k in r]))
    # any question asked in any training rollout of the run (the bias can only matter if some rollouts ask)
    out["train_asked_max"] = max([r.get("train_asked", 0.0) for r in rows]
                                 + [r[k] for r in rows for k in r if k.startswith("strategy_asked/")])
    out["rollouts"] = sum(r.get("rollouts", 0.0) for r in rows)
    out["train_s"] = sum(r.get("rollout_s", 0.0) + r.get("update_s", 0.0) for r in rows)
    return out


def start_metrics(out: Path, args, env_kwargs: dict) -> dict:
    """The start checkpoint's evaluation with the question-share and latency metrics (cached in OUT/arc_check)."""
    from agents.lm.agent import LMAgent
    from shopsim.paths import write_text_atomic

    f = out / "arc_check" / f"start-eval-{args.eval_episodes}.json"
    if f.is_file():
        return json.loads(f.read_text())
    agent = LMAgent(env_id=ENV, checkpoint=out / "start")
    m = {}
    for split in ("dev", "test"):
        m.update(evaluate_metrics(agent, split, args.eval_episodes, env_kwargs, args))
    write_text_atomic(f, json.dumps(m, indent=2))
    return m


#: (column, key, format) of the table
COLUMNS = [
    ("test success", "test_success", ".2f"),
    (f"test {CLARIFY}", f"test_success/{CLARIFY}", ".2f"),
    ("test find_and_buy", "test_success/find_and_buy", ".2f"),
    ("dev success", "dev_success", ".2f"),
    ("test asked", "test_asked", ".2f"),
    (f"test asked ({CLARIFY})", f"test_asked/{CLARIFY}", ".2f"),
    ("test turns before 1st answer", "test_turns_before_first_answer", ".2f"),
    ("test chars before 1st answer", "test_chars_before_first_answer", ".0f"),
    ("train success (it 1 → last 3)", ("train_success_first", "train_success_last3"), ".2f"),
    ("train asked (it 1 → last 3)", ("train_asked_first", "train_asked_last3"), ".2f"),
    ("entropy (it 1 → last 3)", ("entropy_first", "entropy_last3"), ".3f"),
]


def _cell(runs: list[dict], key, fmt: str) -> str:
    if isinstance(key, tuple):
        a = [r[key[0]] for r in runs if key[0] in r]
        b = [r[key[1]] for r in runs if key[1] in r]
        return f"{np.mean(a):{fmt}} → {np.mean(b):{fmt}}" if a and b else "—"
    v = [r[key] for r in runs if key in r]
    if not v:
        return "—"
    return f"{np.mean(v):{fmt}} ± {np.std(v):{fmt}}" if len(v) > 1 else f"{v[0]:{fmt}}"


def _mean(runs: list[dict], key: str) -> float:
    v = [r[key] for r in runs if key in r]
    return float(np.mean(v)) if v else float("nan")


def _sft_families(args) -> list[str] | None:
    """The task families the start's SFT checkpoint was fine-tuned on (its manifest), if recorded."""
    from agents.lm.agent import default_checkpoint_dir

    f = Path(args.init or default_checkpoint_dir()) / "shopsim_agent.json"
    try:
        return list(json.loads(f.read_text())["sft"]["families"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _claims(summ: dict[str, list[dict]], start: dict, sft_families: list[str] | None = None) -> list[str]:
    """The card's claims, checked against the means (with the seeds' spread named)."""
    lines = []

    def cmp(key: str, label: str) -> str:
        g, a = _mean(gb, key), _mean(ab, key)
        sd = max(float(np.std([r[key] for r in gb if key in r])), float(np.std([r[key] for r in ab if key in r])))
        rel = "higher than" if a > g else "lower than" if a < g else "equal to"
        noise = "larger" if abs(a - g) > sd else "not larger"
        return (f"- {label}: ARC {a:.2f} vs GRPO {g:.2f} with the biased reward (ARC {rel} GRPO; the difference "
                f"{abs(a - g):.2f} is {noise} than the seeds' spread {sd:.2f}).")

    runs = [r for v in summ.values() for r in v]
    asked = max([r.get("train_asked_max", 0.0) for r in runs] + [r.get(f"{sp}_asked", 0.0) for r in runs
                                                                  for sp in ("dev", "test")]
                + [start.get("dev_asked", 0.0), start.get("test_asked", 0.0)])
    if asked == 0:
        lines.append("- **The check is degenerate on this start.** No episode asked the customer a question: not the "
                     "start's evaluation episodes, not one training rollout of any run"
                     + (" (under every strategy instruction, `ask_first` included)"
                        if any(k.startswith("strategy_asked/") for r in runs for k in r) else "")
                     + ", not one evaluation episode after training. The style "
                     "bonus was therefore the same for every rollout; it shifts every group's rewards by the same "
                     "constant and cancels in GRPO's advantages as in ARC's, so GRPO with the biased reward is GRPO "
                     "with the plain reward, and the claim can neither show nor fail here: `ask[...]` is outside the "
                     "start policy's support"
                     + (f" (its SFT checkpoint was fine-tuned on {', '.join(sft_families)} expert episodes)"
                        if sft_families else "") + ".")
    gb, ab = summ.get("grpo_bias", []), summ.get("arc_bias", [])
    if not gb or not ab:
        return [*lines, "- The biased GRPO and ARC runs are not both finished; no comparison is made."]
    s_ask, g_first, g_last = start.get("test_asked", float("nan")), _mean(gb, "train_asked_first"), \
        _mean(gb, "train_asked_last3")
    shows = "shows" if g_last < g_first else "does not show"
    lines.append(f"- GRPO drifts to the favoured style: its training rollouts ask in {g_first:.2f} of episodes at "
                 f"iteration 1 and {g_last:.2f} over the last three iterations; the drift {shows} at this budget "
                 f"(start, greedy test episodes: {s_ask:.2f}; after training: {_mean(gb, 'test_asked'):.2f}).")
    s_cl = start.get(f"test_success/{CLARIFY}", float("nan"))
    g_cl = _mean(gb, f"test_success/{CLARIFY}")
    lost = "loses" if g_cl < s_cl else "does not lose"
    lines.append(f"- GRPO with the biased reward {lost} success on {CLARIFY}: start {s_cl:.2f} → {g_cl:.2f}.")
    lines.append(cmp(f"test_success/{CLARIFY}", f"{CLARIFY} test success"))
    lines.append(cmp("test_success/find_and_buy", "find_and_buy test success"))
    lines.append(cmp(f"test_asked/{CLARIFY}", f"share of {CLARIFY} test episodes that ask (no instruction)"))
    for v, rs in summ.items():
        lines.append(f"- {v} against the start: test success {start.get('test_success', float('nan')):.2f} → "
                     f"{_mean(rs, 'test_success'):.2f}, dev {start.get('dev_success', float('nan')):.2f} → "
                     f"{_mean(rs, 'dev_success'):.2f}.")
    a1, g1 = _mean(ab, "train_success_first"), _mean(gb, "train_success_first")
    lines.append(f"- Instructed rollouts: at iteration 1 (the start policy, sampled) ARC's rollouts, all under a "
                 f"strategy instruction, succeed in {a1:.2f} of episodes, GRPO's uninstructed ones in {g1:.2f}"
                 + (": the instruction line moves the start policy off its training distribution, and ARC's "
                    "updates are computed on those rollouts only." if a1 < g1 else "."))
    ne = summ.get("arc_bias_noent", [])
    if ne:
        lines.append(f"- Entropy bonus: ARC's token entropy goes {_mean(ab, 'entropy_first'):.3f} → "
                     f"{_mean(ab, 'entropy_last3'):.3f} with c_ent = 1e-3 and {_mean(ne, 'entropy_first'):.3f} → "
                     f"{_mean(ne, 'entropy_last3'):.3f} without it.")
    return lines


def write_results(out: Path, args, start: dict, wall: float) -> dict:
    from shopsim.paths import write_text_atomic

    summ: dict[str, list[dict]] = {}
    per_seed: dict[str, dict[int, dict]] = {}
    for v in VARIANTS:
        for s in args.seeds:
            m = run_metrics(run_dir(out, v, s), args.iterations)
            if m is not None:
                summ.setdefault(v, []).append(m)
                per_seed.setdefault(v, {})[s] = m
    refs: dict[str, list[dict]] = {}
    for name in ("grpo", "gigpo"):  # the learning benchmark's own runs (plain reward), read only
        for s in args.seeds:
            m = run_metrics(out / name / f"seed{s}", args.iterations)
            if m is not None:
                refs.setdefault(name, []).append(m)
    head = "| variant | seeds | rollouts | " + " | ".join(c for c, _, _ in COLUMNS) + " |"
    lines = [head, "|---" * (3 + len(COLUMNS)) + "|"]
    start_cells = [f"{start[k]:{f}}" if isinstance(k, str) and k in start else "—" for _, k, f in COLUMNS]
    lines.append("| start (weakened SFT) | — | 0 | " + " | ".join(start_cells) + " |")
    labels = {"grpo_bias": "GRPO, biased reward", "arc_bias": "ARC, biased reward", "arc": "ARC, plain reward",
              "grpo": "GRPO, plain reward", "arc_bias_free": "ARC + free group, biased reward",
              "arc_bias_noent": "ARC, biased reward, c_ent = 0"}
    for v, runs in summ.items():
        lines.append(f"| {labels[v]} | {len(runs)} | {int(np.mean([r['rollouts'] for r in runs]))} | "
                     + " | ".join(_cell(runs, k, f) for _, k, f in COLUMNS) + " |")
    for name, runs in refs.items():
        lines.append(f"| {name} (learning benchmark, plain reward) | {len(runs)} | "
                     f"{int(np.mean([r['rollouts'] for r in runs]))} | "
                     + " | ".join(_cell(runs, k, f) for _, k, f in COLUMNS) + " |")
    per = ["| variant | " + " | ".join(f"seed {s}" for s in args.seeds) + " |", "|---" * (1 + len(args.seeds)) + "|"]
    for v, d in per_seed.items():
        per.append(f"| {labels[v]} | " + " | ".join(
            f"{d[s]['test_success']:.2f} / {d[s].get(f'test_success/{CLARIFY}', float('nan')):.2f} / "
            f"{d[s].get(f'test_asked/{CLARIFY}', float('nan')):.2f}" if s in d else "—" for s in args.seeds) + " |")
    strat = []
    for v in ("arc_bias", "arc", "arc_bias_free"):
        if v in summ:
            for kind, what in (("asked", "share of training rollouts that ask"),
                               ("success", "training success")):
                keys = sorted(k for k in summ[v][0] if k.startswith(f"strategy_{kind}/"))
                cells = ", ".join(f"{k.split('/')[1][:-5]} {_mean(summ[v], k):.2f}" for k in keys)
                strat.append(f"- {labels[v]}: {what} per instructed strategy (mean over iterations; free = no "
                             f"instruction): {cells}; all rollouts, last three iterations: "
                             f"{_mean(summ[v], 'train_' + kind + '_last3'):.2f}.")
    cmd = "python -m benchmarks.repro_arc " + " ".join(sys.argv[1:])
    text = [
        "# ARC reproduction check: the style-bias experiment",
        "",
        "Generated by `benchmarks/repro_arc.py` (do not edit by hand); what is compared and why: "
        "[docs/algorithms/arc.md](../algorithms/arc.md#reproduction-check).",
        "",
        f"Command: `{cmd}`  ",
        f"Commit: `{git_commit()}`; seeds {' '.join(map(str, args.seeds))}; style bias {args.style_bias} (bonus on the "
        f"final reward of an episode that never asked); {args.iterations} iterations × {args.rollouts} rollouts "
        f"(ARC: {args.rollouts // 12} tasks × 12); {args.eval_episodes} greedy evaluation episodes per split, no "
        f"strategy instruction; wall time of this invocation {wall / 60:.1f} min (runs reused from earlier "
        "invocations are not timed again).",
        "",
        "Mean ± std over seeds at the last iteration. *asked*: share of episodes with at least one question to the "
        "customer. Turns / characters before the first answer: the env's answer-latency proxy.",
        "",
        *lines,
        "",
        "Per seed: test success / test success on clarify_and_buy / share of clarify_and_buy test episodes that ask.",
        "",
        *per,
        "",
        "## The card's claims",
        "",
        *_claims(summ, start, _sft_families(args)),
        *strat,
        "",
    ]
    res = {"command": cmd, "commit": git_commit(), "seeds": args.seeds, "wall_s": wall, "style_bias": args.style_bias,
           "settings": {k: v for k, v in vars(args).items() if not callable(v)}, "start": start,
           "runs": {v: {str(s): m for s, m in d.items()} for v, d in per_seed.items()},
           "references": {n: runs for n, runs in refs.items()}}
    if args.results:
        results = Path(args.results)
        write_text_atomic(results / "arc_check.md", "\n".join(text))
        write_text_atomic(results / "arc_check.json", json.dumps(res, indent=2, default=str))
    return {**res, "text": "\n".join(text)}


def main(argv=None) -> int:
    from agents.lm.agent import default_checkpoint_dir
    from agents.registry import manifest_env_kwargs

    p = argparse.ArgumentParser(description="ARC's style-bias reproduction check (see module docstring)")
    p.add_argument("--out", default="runs/seedcheck")
    p.add_argument("--init", default=None, help="SFT checkpoint folder (default data/lm/sft)")
    p.add_argument("--variants", nargs="+", default=["grpo_bias", "arc_bias", "arc", "grpo"], choices=list(VARIANTS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--style-bias", type=float, default=0.1, help="bonus for an episode that never asked")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rollouts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8, help="GRPO's G")
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--report-only", action="store_true", help="only rewrite the table from finished runs")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write DIR/arc_check.md and .json (the committed check: docs/results; default: none)")
    p.add_argument("--no-progress", action="store_true")
    # the learning benchmark's remaining settings, at its defaults
    add_protocol_arguments(p)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    out = Path(a.out)
    init = Path(a.init) if a.init else default_checkpoint_dir()
    env_kwargs = {**manifest_env_kwargs(init), "max_turns": a.max_turns}
    weaken(init, out / "start", a.target, a.calib, env_kwargs, a.bisect_steps, a)
    start = start_metrics(out, a, env_kwargs)
    if not a.report_only:
        # the biased pair first, seed by seed, so that an interrupted invocation leaves a balanced comparison
        first = [v for v in a.variants if v in ("grpo_bias", "arc_bias")]
        rest = [v for v in a.variants if v not in first]
        for group in (first, rest):
            for s in a.seeds:
                for v in group:
                    train_variant(v, s, a, env_kwargs, out)
                    write_results(out, a, start, time.perf_counter() - t0)
    print(write_results(out, a, start, time.perf_counter() - t0)["text"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
