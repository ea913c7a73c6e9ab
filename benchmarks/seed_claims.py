"""The seed papers' claims in one verdict table, read from the recorded results (nothing is trained here).

    python -m benchmarks.seed_claims --results DIR [--json PATH]

reads the recorded tables in DIR (the tables of record: ``--results docs/results``) and writes
``DIR/seed_claims.{md,json}`` beside them.

One row per claim of an algorithm card: the paper, the algorithm, the claim in one line, the start the runs trained
from, the measured figure per seed, the reference arm per seed, the decision rule and the verdict (*shown* / *not
shown*; *not measured* when the results file a row reads is missing). Each row is a `ClaimSpec` in `SPECS`: the
results file it reads and a `measure` function that turns that file into per-seed figures; a path under ``data/``
(the leaderboard's shipped results) is read from the repository, any other from the results folder. A claim's own
seed runs are paired by seed index (the same seed starts both arms from the same initial policy or start checkpoint
and draws the same training data where the trainer allows it).

Decision rules (`RULES`):

* ``paired_t``: the per-seed paired difference d_s = row_s − reference_s (or the figure `measure` defines, e.g. a
  relative gap); shown when the 95% Student-t interval of mean(d) (n − 1 degrees of freedom) excludes 0 on the
  claim's better side;
* ``every_seed``: a yes/no per seed; shown when it holds in every seed.

Rows so far: the LM seed methods' comparisons with the algorithms and arms their cards name, read from the learning
benchmark's table of record from the shipped agent (learning_lm.json; the arms are its `VARIANTS`: MPO, ARC,
BiPACE, BASIS, WAPO, DelTA, TrOPD, mid-training); ProRL
(prorl_ladder.json), CA-PG (capg_k.json, and the standard tier's TwoStageRetrieval table at the card's K = 20,
data/results/standard/TwoStageRetrieval-v0_k20/) and HPO (hpo_n.json). Claims that need measurements of their own
(the critic-variance and gradient-norm diagnostics) join as further
`ClaimSpec` entries that read their own results files.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: two-sided 97.5% quantiles of Student's t by degrees of freedom (the 95% interval's half-width factor)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
RULES = {
    "paired_t": "95% t-interval of the per-seed paired difference (row − reference) excludes 0 on the {side} side",
    "every_seed": "holds in every seed",
}
SHOWN, NOT_SHOWN, NOT_MEASURED = "shown", "not shown", "not measured"


def _t975(df: int) -> float:
    known = [d for d in T975 if d <= df]
    return T975[max(known)] if known else T975[1]


def t_interval(values: Sequence[float]) -> list[float]:
    """The 95% Student-t interval of the mean of `values` (n − 1 degrees of freedom); [nan, nan] with fewer than
    two finite values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) < 2:
        return [float("nan"), float("nan")]
    half = _t975(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return [float(v.mean() - half), float(v.mean() + half)]


def decide_paired(diffs: Sequence[float], better: str) -> dict:
    """Mean, 95% t-interval and verdict of per-seed paired differences; `better` is "higher" or "lower".

    Shown when every seed gave a finite difference and the interval lies strictly on the better side of 0."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    finite = all(d is not None and math.isfinite(d) for d in diffs)
    lo, hi = t_interval(diffs)
    ok = finite and len(diffs) >= 2 and (lo > 0 if better == "higher" else hi < 0)
    mean = float(np.mean(diffs)) if finite and len(diffs) else float("nan")
    return {"mean": mean, "ci95": [lo, hi], "verdict": SHOWN if ok else NOT_SHOWN}


def decide_every(flags: Sequence[bool]) -> dict:
    """Verdict of a yes/no per seed: shown when it holds in every seed (and there is at least one)."""
    return {"holds": f"{sum(bool(f) for f in flags)}/{len(flags)}",
            "verdict": SHOWN if flags and all(flags) else NOT_SHOWN}


@dataclass(frozen=True)
class ClaimSpec:
    """One claim of an algorithm card and how to decide it from one recorded results file."""

    paper: str
    """Short name of the paper (the card's)."""
    algorithm: str
    """The algorithm's registry name (the card's heading)."""
    claim: str
    """The claim in one line, with the setting it is tested at."""
    source: str
    """The results file it reads, relative to the repository root."""
    reference: str
    """The reference arm (or threshold) the row is compared with."""
    rule: str
    """A key of `RULES`."""
    measure: Callable[[dict], dict]
    """results → {"seeds", "figure" (per seed), "reference" (per seed or None), and "diff" (paired_t) or
    "flags" (every_seed); optional "note"}. With `reference_source`, results is {"row": <source>, "reference":
    <reference_source>}."""
    better: str = "higher"
    """The better side of the paired difference (paired_t)."""
    start: str = "random init"
    """What the runs trained from: "sft" (a supervised start checkpoint) or "random init"."""
    unit: str = ""
    """Unit of the figure, shown in the table."""
    reference_source: str | None = None
    """A second results file the reference arm is read from (one leaderboard row against another), or None."""


def _r(x, nd: int = 6):
    """Round to `nd` significant digits for the table's JSON (None and non-finite values kept as they are)."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return [_r(v, nd) for v in x]
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return x
    x = float(x)
    return x if not math.isfinite(x) or x == 0 else float(f"{x:.{nd}g}")


def source_path(src: str, results: Path, root: Path = ROOT) -> Path:
    """Where a spec's source lives: under the repository for the leaderboard's shipped results (``data/...``),
    else in the results folder."""
    return root / src if src.startswith("data/") else results / src


def decide(spec: ClaimSpec, results: Path, root: Path = ROOT) -> dict:
    """The row of one claim: its measured figures and verdict, or *not measured* when the source is missing."""
    row: dict = {"paper": spec.paper, "algorithm": spec.algorithm, "claim": spec.claim, "start": spec.start,
                 "source": spec.source, "reference": spec.reference, "unit": spec.unit,
                 "rule": RULES[spec.rule].format(side=spec.better)}
    files = [spec.source] + ([spec.reference_source] if spec.reference_source else [])
    missing = [f for f in files if not source_path(f, results, root).is_file()]
    if missing:
        return {**row, "verdict": NOT_MEASURED, "note": f"{', '.join(missing)} is missing"}
    res = json.loads(source_path(spec.source, results, root).read_text())
    if spec.reference_source:
        row["reference_source"] = spec.reference_source
        res = {"row": res, "reference": json.loads(source_path(spec.reference_source, results, root).read_text())}
    try:
        m = spec.measure(res)
    except KeyError as exc:  # the source exists but has not recorded this claim's arms yet
        return {**row, "verdict": NOT_MEASURED, "note": str(exc.args[0]) if exc.args else repr(exc)}
    row.update(seeds=m["seeds"], figure=_r(m["figure"]), reference_figure=_r(m.get("reference")))
    if spec.rule == "paired_t":
        d = decide_paired(m["diff"], spec.better)
        row.update(diff=_r(m["diff"]), diff_mean=_r(d["mean"]), diff_ci95=_r(d["ci95"]), verdict=d["verdict"])
    elif spec.rule == "every_seed":
        d = decide_every(m["flags"])
        row.update(flags=[bool(f) for f in m["flags"]], holds=d["holds"], verdict=d["verdict"])
    else:
        raise ValueError(f"unknown rule {spec.rule!r}")
    if m.get("note"):
        row["note"] = m["note"]
    return row


# ---------------------------------------------------------------------------------------------------- ProRL
PRORL = "prorl_ladder.json"


def _prorl(arm: str, key: str, ref_arm: str | None = None, ref_key: str | None = None) -> Callable[[dict], dict]:
    """Per seed: `key` of `arm` against `ref_key` of `ref_arm` (default: the same arm's start_<key>)."""

    def measure(res: dict) -> dict:
        runs = {(r["arm"], r["seed"]): r for r in res["runs"]}
        seeds = sorted(s for a, s in runs if a == arm)
        fig = [runs[(arm, s)][key] for s in seeds]
        ref = [runs[(ref_arm or arm, s)][ref_key or f"start_{key}"] for s in seeds]
        return {"seeds": seeds, "figure": fig, "reference": ref, "diff": [f - r for f, r in zip(fig, ref, strict=True)]}

    return measure


def _prorl_max_length(res: dict) -> dict:
    runs = [r for r in res["runs"] if r["arm"] == "raw"]
    l_max = 10
    return {"seeds": [r["seed"] for r in runs], "figure": [r["length"] for r in runs],
            "reference": [r["start_length"] for r in runs], "flags": [r["length"] >= 0.9 * l_max for r in runs],
            "note": f"greedy path length after {res['iterations']} iterations; L_max = {l_max}"}


# ---------------------------------------------------------------------------------------------------- CA-PG
CAPG = "capg_k.json"


def _capg_runs(res: dict, k: int, est: str) -> dict[int, dict]:
    return {r["seed"]: r for r in res["per_k"][str(k)]["runs"][est]}


def _capg_overflow(k: int) -> Callable[[dict], dict]:
    def measure(res: dict) -> dict:
        runs = _capg_runs(res, k, "vpg")
        seeds = sorted(runs)
        counts = {kk: sum(r["overflow_step"] is not None for r in per["runs"]["vpg"])
                  for kk, per in res["per_k"].items()}
        return {"seeds": seeds, "figure": [runs[s]["overflow_step"] for s in seeds], "reference": None,
                "flags": [runs[s]["overflow_step"] is not None for s in seeds],
                "note": f"step of the first NaN/Inf gradient (None: none within {res['steps']:,} steps; "
                        f"{res['user_tower']} user tower, the released float32 normalisers); seeds that overflowed "
                        "per K: " + ", ".join(f"K={kk} {c}/{len(seeds)}" for kk, c in counts.items())}

    return measure


def _capg_auc(k: int, est: str, ref: str = "vpg_swr") -> Callable[[dict], dict]:
    def measure(res: dict) -> dict:
        a, b = _capg_runs(res, k, est), _capg_runs(res, k, ref)
        seeds = sorted(set(a) & set(b))
        fig, rf = [a[s]["auc"] for s in seeds], [b[s]["auc"] for s in seeds]
        return {"seeds": seeds, "figure": fig, "reference": rf, "diff": [x - y for x, y in zip(fig, rf, strict=True)],
                "note": f"value averaged over the ten evaluations of {res['steps']:,} steps (area under the curve)"}

    return measure


Measure = Callable[[dict], dict]


def _growth(lo_measure: Measure, hi_measure: Measure, note: str) -> Measure:
    """A claim that a paired difference grows from one setting to another: per seed, the difference measured at the
    high setting (figure) against the same difference at the low one (reference), over the seeds both have."""

    def measure(res: dict) -> dict:
        lo, hi = lo_measure(res), hi_measure(res)
        seeds = [s for s in hi["seeds"] if s in lo["seeds"]]
        d_lo = dict(zip(lo["seeds"], lo["diff"], strict=True))
        d_hi = dict(zip(hi["seeds"], hi["diff"], strict=True))
        return {"seeds": seeds, "figure": [d_hi[s] for s in seeds], "reference": [d_lo[s] for s in seeds],
                "diff": [d_hi[s] - d_lo[s] for s in seeds], "note": note}

    return measure


def _capg_auc_growth(est: str, k_lo: int, k_hi: int, ref: str = "vpg_swr") -> Callable[[dict], dict]:
    return _growth(_capg_auc(k_lo, est, ref), _capg_auc(k_hi, est, ref),
                   f"figure: {est} − {ref} AUC at K = {k_hi}; reference: the same at K = {k_lo}")


def _capg_cost(res: dict) -> dict:
    cost = res["cost_K20_L5"]
    others = {n: float(np.mean(v)) for n, v in cost.items() if n not in ("top1", "capg_swr")}
    cheapest = min(others, key=lambda n: others[n])
    seeds = res["seeds"]
    fig, rf = cost["top1"], cost[cheapest]
    return {"seeds": seeds, "figure": fig, "reference": rf, "diff": [x - y for x, y in zip(fig, rf, strict=True)],
            "note": f"seconds per 1K gradient steps at (K, L) = (20, 5), {res['cost_steps']} steps per seed; "
                    f"reference: the cheapest other M = 1 estimator ({cheapest}); a shared 2-core machine"}


def _capg_variance(k: int, where: str = "init") -> Callable[[dict], dict]:
    def measure(res: dict) -> dict:
        var = res["per_k"][str(k)]["variance"]
        a, b = [c["trace_cov"] for c in var["capg"][where]], [c["trace_cov"] for c in var["vpg"][where]]
        with np.errstate(divide="ignore"):
            diff = [float(np.log10(x) - np.log10(y)) for x, y in zip(a, b, strict=True)]
        return {"seeds": res["seeds"][: len(a)], "figure": a, "reference": b, "diff": diff,
                "note": f"tr Cov of the batch gradient over {res['var_batches']} batches of 128 contexts at each "
                        f"seed's {'initial' if where == 'init' else 'trained ca-pg'} parameters; difference in "
                        "log10 (−1 = ten times lower)"}

    return measure


#: the standard tier's TwoStageRetrieval table at the card's K = 20 (``shopsim bench --tier standard --envs
#: TwoStageRetrieval-v0:k20``): 300 iterations, 3 training seeds, each evaluated on the 4000 test contexts
CAPG_STD = "data/results/standard/TwoStageRetrieval-v0_k20"


def _std_paired(metric: str) -> Callable[[dict], dict]:
    """Two leaderboard rows paired by training seed: the row's `metric` per seed against the reference row's."""

    def measure(res: dict) -> dict:
        row, ref = res["row"], res["reference"]
        seeds = list(row["budget"]["train_seeds"])
        if list(ref["budget"]["train_seeds"]) != seeds:
            raise ValueError(f"the rows trained different seeds: {seeds} and {ref['budget']['train_seeds']}")
        fig, rf = row["metrics"][metric]["per_seed"], ref["metrics"][metric]["per_seed"]
        k = row["config"].get("env_kwargs", {}).get("k")
        return {"seeds": seeds, "figure": fig, "reference": rf, "diff": [x - y for x, y in zip(fig, rf, strict=True)],
                "note": f"standard-tier {metric} (K = {k}) after {row['budget']['iterations']} iterations per training "
                        f"seed, each on the {row['metrics'][metric]['tasks']} test contexts; `{row['command']}`"}

    return measure


# ---------------------------------------------------------------------------------------------------- HPO
HPO = "hpo_n.json"


def _hpo_gap(n: int) -> Callable[[dict], dict]:
    def measure(res: dict) -> dict:
        runs = res["per_n"][str(n)]["runs"]
        h, p = {r["seed"]: r["final"] for r in runs["hpo"]}, {r["seed"]: r["final"] for r in runs["ppo"]}
        seeds = sorted(set(h) & set(p))
        return {"seeds": seeds, "figure": [h[s] for s in seeds], "reference": [p[s] for s in seeds],
                "diff": [100 * (h[s] - p[s]) / p[s] for s in seeds],
                "note": f"test cost after {res['iterations']} updates × {res['batch']} scenarios; difference: "
                        "100·(HPO − PPO)/PPO per seed"}

    return measure


def _hpo_gap_growth(n_lo: int, n_hi: int) -> Callable[[dict], dict]:
    return _growth(_hpo_gap(n_lo), _hpo_gap(n_hi),
                   f"figure: HPO's gap to PPO (%) at {n_hi} SKUs; reference: at {n_lo} SKUs")


def _hpo_vs_ss(res: dict) -> dict:
    lg = res["long"]
    s_s = lg["s_S"]
    fin = [r["curve"][-1]["test_cost"] for r in lg["runs"]]
    gap = [100 * (c - s_s) / s_s for c in fin]
    i3 = (3 * (len(lg["runs"][0]["curve"]) - 1)) // 4
    late = [100 * (r["curve"][-1]["test_cost"] - r["curve"][i3]["test_cost"]) / s_s for r in lg["runs"]]
    lo, hi = t_interval(late)
    return {"seeds": [r["seed"] for r in lg["runs"]], "figure": fin, "reference": [s_s] * len(fin), "diff": gap,
            "note": f"HPO after {lg['iterations']} updates × {lg['batch']} scenarios (the standard tier's setting, "
                    f"{lg['hidden']} policy); difference: 100·(HPO − (s,S))/(s,S); change of that gap over the last "
                    f"quarter of the curve (updates {lg['runs'][0]['curve'][i3]['iteration']} → {lg['iterations']}): "
                    f"{np.mean(late):+.1f} points [{lo:+.1f}, {hi:+.1f}]"}


# ------------------------------------------------------------------------------- the LM learning table of record
#: the learning benchmark's table from the shipped agent (``python -m benchmarks.learning_lm ... --results DIR``):
#: every LM algorithm at one budget, 3 seeds, evaluated on the same test episodes
LEARNING = "learning_lm.json"


#: what `_learning_gain` reads from a row: the final gain over the start, or its change since the previous evaluation
LEARNING_KEYS = {"gain_test": "test-success gain over the shipped agent",
                 "late_gain_test": "change of test success over the last evaluation interval",
                 "asked_test": "share of the final evaluation's test episodes that asked the customer"}
#: the table's unit of each key
LEARNING_UNITS = {"gain_test": "test gain", "late_gain_test": "late test gain", "asked_test": "asked share"}


def _learning_gain(algo: str, ref: str, family: str | None = None, key: str = "gain_test") -> Measure:
    """Per seed: `algo`'s test-success gain over the shipped agent (overall, or on `family`) against `ref`'s with
    the same seed index (same start, same evaluation episodes, so the start cancels in the difference); with
    ``key="late_gain_test"`` the change over the runs' last evaluation interval instead, with ``key="asked_test"``
    the share of final test episodes that asked the customer. The note gives both arms' asked share where the rows
    report it (ARC)."""

    def measure(res: dict) -> dict:
        rows = {r["algo"]: r for r in res["rows"]}
        if algo not in rows or ref not in rows:
            missing = [a for a in (algo, ref) if a not in rows]
            raise KeyError(f"{LEARNING} has no row for {', '.join(missing)}")

        def per_seed(r: dict) -> dict[int, float]:
            st = r.get(key) if family is None else (r.get(f"{key}_family") or {}).get(family)
            if key != "gain_test" and st is None:
                raise KeyError(f"{LEARNING}'s row {r['algo']} has no {key}{' for ' + family if family else ''}")
            return dict(zip(r["seeds"], st["per_seed"], strict=True)) if st else {}

        a, b = per_seed(rows[algo]), per_seed(rows[ref])
        seeds = sorted(set(a) & set(b))
        fig, rf = [a[sd] for sd in seeds], [b[sd] for sd in seeds]
        pr = res.get("protocol", {})
        note = (f"{LEARNING_KEYS[key]}{' on ' + family if family else ''} after {pr.get('iterations')} iterations × "
                f"{pr.get('rollouts')} rollouts, the first {pr.get('eval_episodes')} test tasks, greedy")
        asked = {a: rows[a]["asked_test"]["mean"] for a in (algo, ref) if rows[a].get("asked_test")}
        if asked:
            note += "; asked_share (test episodes that asked the customer): " + ", ".join(
                f"{a} {v:.3f}" for a, v in asked.items())
        return {"seeds": seeds, "figure": fig, "reference": rf, "diff": [x - y for x, y in zip(fig, rf, strict=True)],
                "note": note}

    return measure


def _learning_spec(paper: str, algo: str, ref: str, claim: str, family: str | None = None,
                   better: str = "higher", key: str = "gain_test") -> ClaimSpec:
    unit = LEARNING_UNITS[key]
    return ClaimSpec(paper, algo, claim, LEARNING, f"{ref} (same seed)", "paired_t",
                     _learning_gain(algo, ref, family, key), better=better, start="sft",
                     unit=f"{unit}{' (' + family + ')' if family else ''}")


# ---------------------------------------------------------------------------------------------------- the table
SPECS: list[ClaimSpec] = [
    _learning_spec("MPO", "mpo", "ppo", "at equal budget MPO gains more than PPO (token GAE) on bundle", "bundle"),
    _learning_spec("MPO", "mpo", "vapo", "at equal budget MPO gains more than VAPO on bundle", "bundle"),
    _learning_spec("MPO", "mpo", "ppo", "at equal budget MPO gains more than PPO overall"),
    _learning_spec("MPO", "mpo", "mpo-one-lambda", "one time scale (λ_intra = λ_turn) costs MPO success on bundle",
                   "bundle"),
    _learning_spec("MPO", "mpo", "mpo-beta0", "β = 0 (the turn advantage on every token) costs MPO success"),
    _learning_spec("ARC", "grpo-bias", "grpo", "on a style-biased reward GRPO loses clarify_and_buy success",
                   "clarify_and_buy", better="lower"),
    _learning_spec("ARC", "arc-bias", "grpo-bias", "on a style-biased reward ARC keeps more clarify_and_buy success "
                   "than GRPO", "clarify_and_buy"),
    _learning_spec("ARC", "arc-bias", "grpo-bias", "on a style-biased reward ARC keeps more success than GRPO"),
    _learning_spec("ARC", "arc-bias", "grpo-bias", "on a style-biased reward ARC, evaluated without instructions, "
                   "asks in clarify_and_buy (hidden constraints) more often than GRPO", "clarify_and_buy",
                   key="asked_test"),
    _learning_spec("ARC", "arc-bias", "arc-bias-noent", "without the entropy bonus ARC loses success"),
    _learning_spec("ARC", "arc-bias-free", "arc-bias", "a free no-instruction group (the evaluation prompt seen in "
                   "training) adds success"),
    _learning_spec("BiPACE", "bipace", "grpo", "BiPACE gains more than GRPO at equal budget"),
    _learning_spec("BiPACE", "bipace", "gigpo", "BiPACE gains more than GiGPO at equal budget"),
    _learning_spec("BiPACE", "bipace", "bipace-distinct", "the card's pairing beats distinct-ε pairs"),
    _learning_spec("BiPACE", "bipace", "bipace-state", "the Q-style baseline beats the state baseline"),
    _learning_spec("BASIS", "basis", "reinforce", "BASIS (one rollout per task) gains more than single-rollout "
                   "REINFORCE"),
    _learning_spec("WAPO", "wapo", "grpo", "WAPO ends above GRPO at equal budget"),
    _learning_spec("WAPO", "wapo-lr3x", "grpo-lr3x", "where GRPO destabilises (lr 3e-4, negative advantages as "
                   "published) WAPO ends above it"),
    _learning_spec("DelTA", "delta", "dapo-nods", "DelTA gains more than DAPO (dynamic sampling off in both)"),
    _learning_spec("DelTA", "delta", "dapo-nods", "DelTA keeps improving where DAPO plateaus (last interval)",
                   key="late_gain_test"),
    _learning_spec("TrOPD", "tropd-noprefix", "opd", "TrOPD ends above plain on-policy distillation (OPD)"),
    _learning_spec("TrOPD", "tropd-noprefix", "tropd-clip", "top-k forward KL beats clipping the outliers"),
    _learning_spec("TrOPD", "tropd-noprefix", "tropd-mask", "top-k forward KL beats masking the outliers"),
    _learning_spec("Mid-training", "midtrain", "midtrain-more-tasks", "diverse strategies beat more tasks × one "
                   "strategy after GRPO"),
    _learning_spec("Mid-training", "midtrain", "grpo", "mid-training on diverse strategies, then GRPO, beats GRPO"),
    _learning_spec("Mid-training", "midtrain-star", "grpo", "STaR data, then GRPO, beats GRPO"),
    _learning_spec("Mid-training", "midtrain", "midtrain-incorrect", "correct diverse strategies beat "
                   "diverse-but-incorrect variants after GRPO (the incorrect control gives no gain)"),
    ClaimSpec("ProRL", "prorl", "REINFORCE on the raw fused step reward drifts to the maximum path length", PRORL,
              "greedy length ≥ 0.9·L_max = 9; the SFT start", "every_seed", _prorl_max_length, start="sft",
              unit="items"),
    ClaimSpec("ProRL", "prorl", "REINFORCE on the raw reward collapses paths to near-identical sequences across users",
              PRORL, "the SFT start's share of distinct paths", "paired_t", _prorl("raw", "distinct"), better="lower",
              start="sft", unit="share of distinct greedy paths"),
    ClaimSpec("ProRL", "prorl", "centering the step rewards stops the length growth (+centering vs raw)", PRORL,
              "raw (same seed)", "paired_t", _prorl("+centering", "length", "raw", "length"), better="lower",
              start="sft", unit="greedy path length"),
    ClaimSpec("ProRL", "prorl", "position-specific advantages lower the gradient variance (+position vs +centering)",
              PRORL, "+centering (same seed)", "paired_t", _prorl("+position", "grad_var", "+centering", "grad_var"),
              better="lower", start="sft", unit="tr Cov per prompt"),
    ClaimSpec("ProRL", "prorl", "full ProRL raises IoI over the pre-trained policy", PRORL, "SFT start (same seed)",
              "paired_t", _prorl("prorl", "IoI"), start="sft", unit="IoI"),
    ClaimSpec("ProRL", "prorl", "full ProRL raises CTR over the pre-trained policy", PRORL, "SFT start (same seed)",
              "paired_t", _prorl("prorl", "CTR"), start="sft", unit="CTR"),
    ClaimSpec("CA-PG", "vpg", "v-pg stops with a gradient overflow almost immediately at K = 20", CAPG,
              "overflow within the budget", "every_seed", _capg_overflow(20), unit="step"),
    ClaimSpec("CA-PG", "capg", "ca-pg converges faster than v-pg-swr at K = 20", CAPG, "vpg_swr (same seed)",
              "paired_t", _capg_auc(20, "capg"), unit="value AUC"),
    ClaimSpec("CA-PG", "top1", "top1 converges faster than v-pg-swr at K = 20", CAPG, "vpg_swr (same seed)",
              "paired_t", _capg_auc(20, "top1"), unit="value AUC"),
    ClaimSpec("CA-PG", "capg", "ca-pg's lead over v-pg-swr grows with K (K = 50 vs K = 5)", CAPG,
              "the lead at K = 5 (same seed)", "paired_t", _capg_auc_growth("capg", 5, 50), unit="value AUC"),
    ClaimSpec("CA-PG", "top1", "top1's lead over v-pg-swr grows with K (K = 50 vs K = 5)", CAPG,
              "the lead at K = 5 (same seed)", "paired_t", _capg_auc_growth("top1", 5, 50), unit="value AUC"),
    ClaimSpec("CA-PG", "top1", "top1 is the cheapest estimator per step at (K, L) = (20, 5)", CAPG,
              "the cheapest other estimator", "paired_t", _capg_cost, better="lower", unit="s per 1K steps"),
    ClaimSpec("CA-PG", "capg", "ca-pg's gradient variance is far below v-pg's at fixed parameters (K = 20)", CAPG,
              "vpg (same parameters)", "paired_t", _capg_variance(20), better="lower", unit="tr Cov"),
    ClaimSpec("CA-PG", "capg", "ca-pg above v-pg on the standard tier's policy value at K = 20",
              f"{CAPG_STD}/capg.json", "vpg (same training seed)", "paired_t", _std_paired("policy_value"),
              unit="policy value", reference_source=f"{CAPG_STD}/vpg.json"),
    ClaimSpec("CA-PG", "top1", "top1 above v-pg on the standard tier's policy value at K = 20",
              f"{CAPG_STD}/top1.json", "vpg (same training seed)", "paired_t", _std_paired("policy_value"),
              unit="policy value", reference_source=f"{CAPG_STD}/vpg.json"),
    ClaimSpec("HPO", "hpo", "HPO reaches a lower test cost than Gaussian PPO at 5 SKUs (same simulated periods)", HPO,
              "ppo (same seed)", "paired_t", _hpo_gap(5), better="lower", unit="test cost"),
    ClaimSpec("HPO", "hpo", "HPO reaches a lower test cost than Gaussian PPO at 12 SKUs", HPO, "ppo (same seed)",
              "paired_t", _hpo_gap(12), better="lower", unit="test cost"),
    ClaimSpec("HPO", "hpo", "HPO reaches a lower test cost than Gaussian PPO at 50 SKUs", HPO, "ppo (same seed)",
              "paired_t", _hpo_gap(50), better="lower", unit="test cost"),
    ClaimSpec("HPO", "hpo", "HPO's gap to PPO grows with N (50 vs 5 SKUs)", HPO, "the gap at 5 SKUs (same seed)",
              "paired_t", _hpo_gap_growth(5, 50), better="lower", unit="gap %"),
    ClaimSpec("HPO", "hpo", "HPO below tuned (s,S) on stationary demand, 5 SKUs, at a long budget (issue #46's "
              "question; not a card claim)", HPO, "(s,S) on the same test scenarios", "paired_t", _hpo_vs_ss,
              better="lower", unit="test cost"),
]


def build(results: Path, specs: Sequence[ClaimSpec] = SPECS, root: Path = ROOT) -> dict:
    """The verdict table from the tables in `results`: every spec's row, and per source file the command and commit
    that recorded it."""
    rows = [decide(s, results, root) for s in specs]
    sources = {}
    for src in sorted({f for s in specs for f in (s.source, s.reference_source) if f}):
        p = source_path(src, results, root)
        if p.is_file():
            res = json.loads(p.read_text())
            sources[src] = {k: res.get(k) for k in ("command", "commit", "wall_s")}
            sources[src]["commit"] = sources[src]["commit"] or res.get("git_commit")  # a leaderboard results file
            sources[src]["wall_s"] = _r(sources[src]["wall_s"], 4)
    return {"sources": sources, "rows": rows}


def _num(x) -> str:
    if x is None:
        return "none"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    a = abs(x)
    return f"{x:,.0f}" if a >= 1000 else f"{x:.3g}" if a >= 1 or a == 0 else f"{x:.3f}" if a >= 0.01 else f"{x:.2e}"


def to_markdown(table: dict) -> str:
    lines = ["# Seed papers' claims: one verdict table", "",
             "Generated by `benchmarks/seed_claims.py` from the recorded results (no training); do not edit by hand.",
             "", f"- command: `{table['command']}`", f"- commit: `{table['commit']}`", "- sources:"]
    for src, meta in table["sources"].items():
        lines.append(f"  - `{src}`: `{meta['command']}` at `{meta['commit']}` ({_num(meta['wall_s'])} s)")
    lines += ["", "Figures per seed (seeds in brackets); *difference*: mean of the per-seed paired differences and its "
              "95% Student-t interval. One section per paper (link: `seed_claims.md#<paper>`, lower case)."]
    paper = None
    for i, r in enumerate(table["rows"]):
        if r["paper"] != paper:
            paper = r["paper"]
            lines += ["", f"## {paper}", "",
                      "| paper | algorithm | claim | start | figure per seed | reference arm: per seed "
                      "| difference [95% CI] | decision rule | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        if r["verdict"] == NOT_MEASURED:
            lines.append(f"| {r['paper']} | {r['algorithm']} | {r['claim']} | {r['start']} | — | {r['reference']} | "
                         f"— | {r['rule']} | not measured ({r['note']}) |")
            continue
        fig = ", ".join(_num(v) for v in r["figure"]) + f" [{', '.join(map(str, r['seeds']))}]"
        ref = r["reference"] + (": " + ", ".join(_num(v) for v in r["reference_figure"])
                                if r.get("reference_figure") else "")
        if "diff_ci95" in r:
            diff = f"{_num(r['diff_mean'])} [{_num(r['diff_ci95'][0])}, {_num(r['diff_ci95'][1])}]"
        else:
            diff = f"holds in {r['holds']}"
        lines.append(f"| {r['paper']} | {r['algorithm']} | {r['claim']} | {r['start']} | {fig} ({r['unit']}) | "
                     f"{ref} | {diff} | {r['rule']} | **{r['verdict']}** [^{i + 1}] |")
    lines += ["", "## Notes", ""]
    for i, r in enumerate(table["rows"]):
        if r["verdict"] != NOT_MEASURED:
            lines.append(f"[^{i + 1}]: `{r['source']}`" + (f": {r['note']}" if r.get("note") else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=None, required=True,
                    help="the folder of the recorded tables it reads, where it writes seed_claims.{md,json} "
                         "(the tables of record: docs/results)")
    ap.add_argument("--json", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    results = Path(args.results)
    args_text = shlex.join(sys.argv[1:] if argv is None else argv)
    table = {"command": f"python -m benchmarks.seed_claims {args_text}".strip(),
             "commit": git_commit(ROOT), **build(results)}
    md = to_markdown(table)
    print(md)
    write_text_atomic(results / "seed_claims.md", md)
    write_text_atomic(results / "seed_claims.json", json.dumps(table, indent=1) + "\n")
    if args.json:
        write_text_atomic(args.json, json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
