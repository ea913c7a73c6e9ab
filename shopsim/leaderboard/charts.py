"""The leaderboard's matplotlib charts, one set per table (env and protocol), written as PNG files.

* ``<env>_<metric>.png``: the table's primary metric per entry with its interval. For a cost with a reference
  policy (Replenishment: (s, S)) the bars are each entry's cost relative to the reference's on the same episodes,
  ``1 + gap_to_s_S_pct / 100``, on a log axis, so that the random agent (many times the reference's cost) does not
  squash the differences between the trained rows; the gap in % is written on each bar.
* ``<env>_families.png`` (Shopping): success per task family (metrics ``success/<family>``), one bar per entry.
* ``<env>_curves.png``: learning curves of the metric that matters (success, IoI, value, cost; never a loss), one
  panel per metric, all trained entries of the table overlaid. A results file's ``curve`` is either
  ``{"metric": NAME, "x": [iterations], "per_seed": [[value per x] per training seed]}`` (drawn as the mean over
  seeds with the min–max band) or, in older files, the path of a training run's ``metrics.csv`` (one seed; the
  family's preferred column of `CURVE_KEYS`). Values logged only every few iterations (an evaluation every 100
  iterations) are drawn as connected markers: missing values are skipped, not drawn as gaps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from shopsim.envs.record import lower_is_better, table_metrics
from shopsim.leaderboard.tables import columns_for, family, slug

#: family -> metrics.csv columns that measure what the family optimises, in order of preference; a run's learning
#: curve is its first column present here (never a loss: a falling loss says nothing about the policy)
CURVE_KEYS: dict[str, tuple[str, ...]] = {
    "shopping": ("dev_success", "eval_success", "eval/success_rate", "success_rate", "train_success", "success",
                 "eval/score", "score"),
    "rec": ("eval_IoI", "eval/IoI", "IoI", "train_IoI", "eval_return", "return", "mean_return"),
    "retrieval": ("value", "eval_value", "policy_value", "eval/value", "reward"),
    "inventory": ("eval_cost", "cost", "train_cost"),
    "*": ("eval/success_rate", "eval_success", "success_rate", "success", "eval/score", "score", "eval/return",
          "mean_return", "return", "value", "reward", "mean_reward", "cost", "train_cost"),
}
#: points a metrics.csv column needs to be preferred as a curve over a later column of `CURVE_KEYS`
MIN_POINTS = 3
#: reference rows per family that a cost chart is relative to
COST_REFERENCE = {"inventory": ("s_S", "gap_to_s_S_pct")}


@dataclass
class Curve:
    """One entry's learning curve: the mean over training seeds and the min–max band (equal with one seed)."""

    entry: str
    metric: str
    x: list[float]
    mean: list[float]
    lo: list[float]
    hi: list[float]
    n_seeds: int


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _from_per_seed(entry: str, metric: str, x: object, per_seed: list[list]) -> Curve | None:
    seeds = [s for s in per_seed if isinstance(s, list)]
    if not seeds or not isinstance(x, list):
        return None
    xs, mean, lo, hi = [], [], [], []
    for i, xi in enumerate(x):
        vals = [float(s[i]) for s in seeds if i < len(s) and _finite(s[i])]
        if not vals or not _finite(xi):
            continue  # not logged at this iteration (e.g. evaluations every k iterations)
        xs.append(float(xi))
        mean.append(sum(vals) / len(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return Curve(entry, metric, xs, mean, lo, hi, len(seeds)) if xs else None


def _curve_path(r: dict) -> Path | None:
    p = Path(r["curve"])
    if not p.is_absolute() and r.get("_path"):
        p = Path(r["_path"]).parent / p
    return p if p.is_file() else None


def read_curve(path: Path, fam: str = "") -> tuple[str, list[float], list[float]] | None:
    """(column, x, y) of the family's preferred learning-curve column of a metrics.csv (rows where it is missing
    left out), or None if the file has none of `CURVE_KEYS`. The first column in preference order with at least
    `MIN_POINTS` values wins; if none has that many, the first with any."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except (OSError, ValueError):
        return None
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
    logged = {k: int(df[k].notna().sum()) for k in CURVE_KEYS.get(fam, ()) + CURVE_KEYS["*"] if k in numeric}
    # the first preferred column with a curve's worth of points: a short run evaluates its policy value only once
    # (eval_every), so its per-iteration training reward is the better curve there
    key = next((k for k, n in logged.items() if n >= MIN_POINTS), None) or next(
        (k for k, n in logged.items() if n), None)
    if key is None:
        return None
    xcol = next((c for c in ("iteration", "step", "iter") if c in df.columns), None)
    df = df[df[key].notna()]
    x = df[xcol].astype(float).tolist() if xcol else [float(i) for i in df.index]
    return key, x, df[key].astype(float).tolist()


def curve_of(r: dict) -> Curve | None:
    """The learning curve of a results record (see module docstring), or None if it has none."""
    c = r.get("curve")
    if isinstance(c, dict):
        return _from_per_seed(r["entry"], str(c.get("metric") or "value"), c.get("x"), c.get("per_seed") or [])
    if isinstance(c, str) and c:
        path = _curve_path(r)
        read = read_curve(path, r.get("family") or "") if path else None
        if read:
            key, x, y = read
            return _from_per_seed(r["entry"], key, x, [y])
    return None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})  # no version string: same results, same bytes
    _plt().close(fig)
    return path


def _interval(m: dict) -> tuple[float, float]:
    """(below, above) error-bar lengths of a metric (intervals need not be symmetric: Wilson, bootstrap)."""
    ci = m.get("ci95")
    if not ci:
        return 0.0, 0.0
    return max(0.0, m["mean"] - ci[0]), max(0.0, ci[1] - m["mean"])


def _file_part(metric: str) -> str:
    return metric.replace("^", "").replace("/", "_")


def bar_chart(key: str, rows: list[dict], metric: str, out_dir: Path) -> Path | None:
    """The primary metric per ok entry, with intervals; a cost relative to the family's reference (log axis)."""
    ok = [r for r in rows if r["status"] == "ok" and metric in r["metrics"]]
    if not ok:
        return None
    plt = _plt()
    ref = COST_REFERENCE.get(family(rows))
    relative = lower_is_better(metric) and ref is not None and all(ref[1] in r["metrics"] for r in ok)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.75 * len(ok) + 2), 3.2))
    colors = ["#888888" if r["kind"] == "reference" else "#3b6fb6" for r in ok]
    if relative:
        assert ref is not None  # `relative` implies it
        gaps = [r["metrics"][ref[1]] for r in ok]
        ratios = [1 + g["mean"] / 100 for g in gaps]
        if min(ratios) <= 0:  # a gap of -100% or below cannot be drawn on a log axis
            relative = False
    if relative:
        assert ref is not None  # `relative` implies it
        errs = [[e / 100 for e in _interval(g)] for g in gaps]
        ax.bar(range(len(ok)), ratios, yerr=list(zip(*errs, strict=True)), color=colors, capsize=3)
        from matplotlib.ticker import FuncFormatter, LogLocator

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.axhline(1.0, color="#444444", lw=0.8, ls="--")
        for i, (ratio, g) in enumerate(zip(ratios, gaps, strict=True)):
            ax.annotate(f"{g['mean']:+.0f}%", (i, ratio), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
        ax.set_ylabel(f"{metric} / {ref[0]}'s {metric} (log)", fontsize=8)
        ax.set_title(f"{metric} relative to {ref[0]}\n(below 1 beats it; bars: 95% interval)", fontsize=9)
    else:
        means = [r["metrics"][metric]["mean"] for r in ok]
        intervals = [_interval(r["metrics"][metric]) for r in ok]
        ax.bar(range(len(ok)), means, yerr=list(zip(*intervals, strict=True)), color=colors, capsize=3)
        ax.set_ylabel(metric, fontsize=8)
        if lower_is_better(metric) and min(means) > 0 and max(means) / min(means) > 10:
            ax.set_yscale("log")  # one far-off row (a random agent's cost) would squash the rest
        better = "lower" if lower_is_better(metric) else "higher"
        ax.set_title(f"{metric}\n({better} is better; bars: 95% interval)", fontsize=9)
    ax.set_xticks(range(len(ok)), [r["entry"] for r in ok], rotation=30, ha="right")
    fig.tight_layout()
    return _save(fig, out_dir / f"{slug(key)}_{_file_part(metric)}.png")


def family_chart(key: str, rows: list[dict], out_dir: Path) -> Path | None:
    """Shopping: success per task family (``success/<family>`` metrics), grouped by family, one bar per entry."""
    env_id = next((r.get("env_id") for r in rows if r.get("env_id")), "") or ""
    names = [m for m in table_metrics(env_id, family(rows)) if m.startswith("success/")]
    names += sorted({m for r in rows for m in r.get("metrics", {}) if m.startswith("success/")} - set(names))
    ok = [r for r in rows if r["status"] == "ok" and any(m in r["metrics"] for m in names)]
    names = [m for m in names if any(m in r["metrics"] for r in ok)]
    if not ok or not names:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(names) * max(1, len(ok)) / 3 + 3), 3.2))
    width = 0.8 / len(ok)
    cmap = plt.get_cmap("tab10")
    for j, r in enumerate(ok):
        xs = [i + (j - (len(ok) - 1) / 2) * width for i in range(len(names))]
        ms = [r["metrics"].get(m) for m in names]
        vals = [m["mean"] if m else float("nan") for m in ms]
        errs = [_interval(m) if m else (0.0, 0.0) for m in ms]
        ax.bar(xs, vals, width=width, yerr=list(zip(*errs, strict=True)), capsize=2, label=r["entry"],
               color=cmap(j % 10))
    ax.set_xticks(range(len(names)), [m.split("/", 1)[1] for m in names])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate")
    ax.set_title("success per task family (bars: 95% interval)", fontsize=9)
    ax.legend(fontsize=7, ncols=min(4, len(ok)), loc="upper right", frameon=False)
    fig.tight_layout()
    return _save(fig, out_dir / f"{slug(key)}_families.png")


def curves_chart(key: str, rows: list[dict], out_dir: Path) -> Path | None:
    """Learning curves (mean over training seeds, min–max band), one panel per metric."""
    curves = [c for r in rows if r["status"] == "ok" and (c := curve_of(r))]
    if not curves:
        return None
    plt = _plt()
    metrics = list(dict.fromkeys(c.metric for c in curves))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.0), squeeze=False)
    cmap = plt.get_cmap("tab10")
    color = {e: cmap(i % 10) for i, e in enumerate(dict.fromkeys(c.entry for c in curves))}
    for ax, metric in zip(axes[0], metrics, strict=True):
        mine = [c for c in curves if c.metric == metric]
        for c in mine:
            seeds = f" ({c.n_seeds} seeds)" if c.n_seeds > 1 else ""
            ax.plot(c.x, c.mean, marker="." if len(c.x) < 30 else None, color=color[c.entry],
                    label=c.entry + seeds)
            if c.n_seeds > 1:
                ax.fill_between(c.x, c.lo, c.hi, color=color[c.entry], alpha=0.2, lw=0)
        values = [v for c in mine for v in c.lo + c.hi]
        if "cost" in metric and min(values) > 0 and max(values) / min(values) > 10:
            ax.set_yscale("log")  # early costs can be orders of magnitude above the converged ones
        better = "lower" if "cost" in metric or lower_is_better(metric) else "higher"
        ax.set_title(f"{metric} ({better} is better)", fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, frameon=False)
    band = "\nmean over training seeds, band: min–max" if any(c.n_seeds > 1 for c in curves) else ""
    fig.suptitle(f"learning curves{band}", fontsize=9)
    fig.tight_layout()
    return _save(fig, out_dir / f"{slug(key)}_curves.png")


def plot_env(key: str, rows: list[dict], out_dir: Path, metric: str | None = None) -> list[Path]:
    """Every chart of one table (see module docstring); returns the PNG paths, in page order."""
    metric = metric or next(iter(columns_for(rows)), None)
    out = [bar_chart(key, rows, metric, out_dir) if metric else None, family_chart(key, rows, out_dir),
           curves_chart(key, rows, out_dir)]
    return [p for p in out if p is not None]
