"""Leaderboard metrics: per-episode records, per-seed summaries, pass^k, and 95% confidence intervals.

The pipeline is episodes → per-task values → a mean and an interval over the *tasks* of the protocol:

1. `episode_record(traj)` reads what an episode produced: ``success`` (``info["success"]`` at the last turn; None
   where the env defines no success, as the cost envs do, which then get no success_rate or pass^k),
   ``score`` (``info["score"]``, else the return), ``return``, ``turns``, ``tokens`` (generated tokens),
   ``invalid_rate`` (share of turns whose ``info["invalid_action"]`` is set) and every number the env put in
   ``info["episode_metrics"]`` (design contract: shopping success/score/turns, replenishment cost, rec IoI/IoR/CTR,
   retrieval policy value ...).
2. `seed_summary(records, tries)` averages the records of one eval seed (or one training run) and adds
   ``success_rate``, ``success/<family>`` for every task family the episodes record (``traj.meta["family"]``,
   Shopping) and ``pass^k`` for k = 1..min(4, tries). These per-seed values are kept in the results file.
3. `summarize(records, ...)` gives, per metric, the mean over all episodes and its 95% interval:

   * rates (``success_rate``, ``success/<family>``): the **Wilson score interval** over the episodes (Wilson 1927;
     Brown, Cai & DasGupta 2001 recommend it over the normal "Wald" interval): it never leaves [0, 1] and is not
     degenerate at 0 or 1 successes;
   * every other metric (cost, return, IoI, pass^k, the gap to a reference ...): a **percentile bootstrap over
     tasks** (Efron & Tibshirani 1993, ch. 13): tasks are resampled with replacement `BOOTSTRAP_RESAMPLES` times
     with a fixed generator seed, so the same episodes give the same interval bytes. Tasks, not eval seeds, are
     the sampling unit: with 2-3 eval seeds a Student-t interval over seeds is either uninformative or, for a
     deterministic policy on fixed tasks, a spurious "± 0.000". An interval of zero width now means that every
     task gave the same value.
   * an entry trained with several seeds (records carrying a ``run``): a two-level bootstrap that resamples the
     training runs and the tasks (`bootstrap_runs_tasks`), so the interval includes run-to-run variation;
   * the per-seed values stay in ``per_seed`` with their sample standard deviation (ddof = 1, None with one seed).
     For a trained entry with several training runs the "seeds" are the training seeds (``seeds_over``), which is
     where run-to-run variation belongs.

   `stat`/`aggregate` (a Student-t interval over seeds) remain for callers that compare training runs.

**pass^k** (τ-bench, Yao et al. 2024, §5): the probability that *all* of k i.i.d. tries of a task
succeed, estimated without bias from n >= k tries of which c succeeded as ``C(c, k) / C(n, k)``, averaged over
tasks. **pass@k** (Chen et al. 2021, eq. 1) is the chance that at least one succeeds, ``1 − C(n − c, k) / C(n, k)``;
both are here, the tables show pass^k.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from shopsim.errors import ConfigError

#: the two-sided 95% normal quantile z_{0.975} (Wilson intervals)
Z_975 = 1.959963984540054
#: bootstrap resamples per interval and the generator seed (fixed: the same records give the same interval)
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
#: two-sided 95% Student-t critical values t_{0.975, df} for df = 1..30; larger df use the normal 1.96
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t_critical(df: int) -> float:
    if df < 1:
        raise ValueError("a t interval needs at least two values (df >= 1)")
    return T_975[df - 1] if df <= len(T_975) else 1.96


def pass_hat_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """τ-bench pass^k: mean over tasks of C(c, k) / C(n, k), from (successes c, tries n) per task."""
    values = []
    for c, n in counts:
        if not 0 <= c <= n:
            raise ConfigError(f"successes must lie in [0, tries], got c={c}, n={n}")
        if n < k:
            raise ConfigError(f"pass^{k} needs at least {k} tries per task, a task has {n}; raise tries")
        values.append(math.comb(c, k) / math.comb(n, k))
    if not values:
        raise ConfigError("pass^k needs at least one task")
    return float(np.mean(values))


def pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k (at least one of k tries succeeds): mean over tasks of 1 − C(n − c, k) / C(n, k)."""
    values = []
    for c, n in counts:
        if n < k or not 0 <= c <= n:
            raise ConfigError(f"pass@{k} needs 0 <= c <= n and n >= {k}, got c={c}, n={n}")
        values.append(1.0 - math.comb(n - c, k) / math.comb(n, k))
    if not values:
        raise ConfigError("pass@k needs at least one task")
    return float(np.mean(values))


def _is_invalid(info: Mapping) -> bool:
    flag = info.get("invalid_action")
    return bool(flag) if not isinstance(flag, str) else flag != ""


def episode_record(traj) -> dict:
    """The numbers one `Trajectory` contributes (see module docstring, step 1)."""
    info = traj.final_info
    turns = len(traj.turns)
    rec = {
        "task_id": traj.task_id,
        # None where the env reports no success (cost envs: Replenishment): no success rate or pass^k then
        "success": float(bool(info["success"])) if "success" in info else None,
        "score": float(traj.score),
        "return": float(traj.total_reward),
        "turns": float(turns),
        "tokens": float(traj.num_generated_tokens),
        "invalid_rate": (sum(_is_invalid(t.info) for t in traj.turns) / turns) if turns else 0.0,
    }
    family = (traj.meta or {}).get("family")
    if family is not None:
        rec["family"] = str(family)
    for name, value in (info.get("episode_metrics") or {}).items():
        try:
            rec[name] = float(value)
        except (TypeError, ValueError):
            continue  # non-numeric extras are not leaderboard metrics
    return rec


def seed_summary(records: Sequence[Mapping], tries: int | None = None, max_k: int = 4) -> dict[str, float]:
    """Mean of every numeric field over one seed's episodes, plus success_rate and pass^k (k <= tries)."""
    if not records:
        raise ConfigError("no episodes to summarise")
    keys = sorted({k for r in records for k in r if k not in ("task_id", "family")})
    out: dict[str, float] = {}
    for key in keys:
        vals = [float(r[key]) for r in records if key in r and r[key] is not None and not math.isnan(float(r[key]))]
        if vals:
            out[key] = float(np.mean(vals))
    if all(r.get("success") is None for r in records):
        out["episodes"] = float(len(records))
        return out  # an env without success (cost envs): success_rate and pass^k are not applicable
    success = [float(r.get("success") or 0.0) for r in records]  # an episode that reports none did not succeed
    out["success"] = out["success_rate"] = float(np.mean(success))
    by_family: dict = defaultdict(list)
    for r, ok in zip(records, success, strict=True):
        if r.get("family") is not None:
            by_family[r["family"]].append(ok)
    for fam, oks in sorted(by_family.items()):
        out[f"success/{fam}"] = float(np.mean(oks))
    by_task: dict = defaultdict(list)
    for r, ok in zip(records, success, strict=True):
        by_task[r["task_id"]].append(ok)
    counts = [(int(sum(v)), len(v)) for v in by_task.values()]
    n_min = min(n for _, n in counts)
    for k in range(1, min(max_k, n_min if tries is None else min(tries, n_min)) + 1):
        out[f"pass^{k}"] = pass_hat_k(counts, k)
    out["episodes"] = float(len(records))
    return out


def add_gap(summaries: Sequence[dict], reference: Sequence[dict], *, key: str = "cost",
            name: str = "gap_to_s_S_pct") -> None:
    """Per seed, ``100 · (cost − cost_ref) / |cost_ref|`` against a reference run on the same episodes."""
    if len(summaries) != len(reference):
        raise ConfigError("the reference must be evaluated on the same eval seeds")
    for s, r in zip(summaries, reference, strict=False):
        if key in s and key in r and r[key] != 0:
            s[name] = 100.0 * (s[key] - r[key]) / abs(r[key])


def stat(values: Sequence[float]) -> dict:
    """mean, sample std, 95% t-interval [lo, hi] (None with one value), n and the per-seed values."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    mean = float(x.mean())
    if n > 1:
        sd = float(x.std(ddof=1))
        half = t_critical(n - 1) * sd / math.sqrt(n)
        ci = [mean - half, mean + half]
    else:
        sd, ci = 0.0, None
    return {"mean": mean, "std": sd, "ci95": ci, "n": n, "per_seed": [float(v) for v in x]}


def aggregate(summaries: Sequence[Mapping[str, float]]) -> dict[str, dict]:
    """Per metric present in every seed's summary: `stat` over the seeds."""
    if not summaries:
        raise ConfigError("no seeds to aggregate")
    common = set(summaries[0]).intersection(*summaries[1:])
    return {k: stat([s[k] for s in summaries]) for k in sorted(common)}


def sample_std(values: Sequence[float]) -> float | None:
    """The sample standard deviation (ddof = 1) of `values`; None with fewer than two."""
    x = np.asarray(values, dtype=float)
    return float(x.std(ddof=1)) if len(x) > 1 else None


def wilson_interval(successes: float, n: int, z: float = Z_975) -> list[float]:
    """The Wilson score interval of a binomial proportion ``successes / n`` (Wilson 1927), within [0, 1]."""
    if n < 1:
        raise ConfigError("a Wilson interval needs at least one episode")
    if not 0 <= successes <= n:
        raise ConfigError(f"successes must lie in [0, n], got {successes} of {n}")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    # exact at the ends (rounding would otherwise give 0.9999999999999999 for n of n)
    return [0.0 if successes == 0 else lo, 1.0 if successes == n else hi]


def _bootstrap_indices(n: int, resamples: int, seed: int):
    """Chunks of resampled task indices (rows = resamples), generated in a fixed order from one seeded generator."""
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, 2_000_000 // max(n, 1)))  # bound the index matrix to ~16 MB
    done = 0
    while done < resamples:
        m = min(chunk, resamples - done)
        yield rng.integers(0, n, size=(m, n))
        done += m


def _percentile_interval(stats, level: float) -> list[float] | None:
    """The central `level` percentile interval of the finite bootstrap statistics `stats`; None if none is."""
    v = np.asarray(stats, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return None
    a = (1.0 - level) / 2
    lo, hi = np.quantile(v, [a, 1.0 - a])
    return [float(lo), float(hi)]


def bootstrap_interval(values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       level: float = 0.95) -> list[float] | None:
    """Percentile bootstrap interval of the mean of `values` (one value per task); None with fewer than 2 tasks."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return None
    means = np.concatenate([x[idx].mean(axis=1) for idx in _bootstrap_indices(len(x), resamples, seed)])
    return _percentile_interval(means, level)


def bootstrap_gap_interval(values: Sequence[float], reference: Sequence[float], *,
                           resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                           level: float = 0.95) -> list[float] | None:
    """Paired percentile bootstrap of ``100 · (mean(values) − mean(reference)) / |mean(reference)|`` over tasks
    (the same tasks resampled for both, so scenario difficulty cancels)."""
    x, r = np.asarray(values, dtype=float), np.asarray(reference, dtype=float)
    if len(x) != len(r):
        raise ConfigError("the reference must be evaluated on the same tasks")
    if len(x) < 2:
        return None
    gaps = []
    for idx in _bootstrap_indices(len(x), resamples, seed):
        rm = r[idx].mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            gaps.append(100.0 * (x[idx].mean(axis=1) - rm) / np.abs(rm))
    return _percentile_interval(np.concatenate(gaps), level)


def bootstrap_runs_tasks(matrix, reference=None, *, resamples: int = BOOTSTRAP_RESAMPLES,
                         seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> list[float] | None:
    """Two-level percentile bootstrap of the mean of a (training runs × tasks) matrix: every resample draws the
    runs and the tasks with replacement (in the spirit of rliable's stratified bootstrap, Agarwal et al. 2021,
    "Deep RL at the Edge of the Statistical Precipice", §4), so the interval carries run-to-run variation as well
    as task sampling. With `reference` (one value per task), the statistic is the relative gap
    ``100 · (mean − mean(reference)) / |mean(reference)|`` on the same resampled tasks."""
    m = np.asarray(matrix, dtype=float)
    runs, n = m.shape
    if n < 2 and runs < 2:
        return None
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, 2_000_000 // max(n, 1)))
    stats, done = [], 0
    while done < resamples:
        b = min(chunk, resamples - done)
        wr = rng.multinomial(runs, np.full(runs, 1.0 / runs), size=b).astype(float) / runs
        wc = rng.multinomial(n, np.full(n, 1.0 / n), size=b).astype(float) / n
        value = np.einsum("br,rc,bc->b", wr, m, wc)
        if reference is not None:
            ref = wc @ np.asarray(reference, dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                value = 100.0 * (value - ref) / np.abs(ref)
        stats.append(value)
        done += b
    return _percentile_interval(np.concatenate(stats), level)


def is_rate(metric: str) -> bool:
    """Whether `metric` is a share of episodes (a Wilson interval): the metric registry's ``interval``
    (`shopsim.envs.record.METRICS`; ``success/<family>`` by prefix)."""
    from shopsim.envs.record import is_rate as registered_rate

    return registered_rate(metric)


def task_values(records: Sequence[Mapping]) -> dict[str, dict]:
    """Per metric: task id -> the mean of that metric over the task's episodes (all tries, seeds and runs)."""
    acc: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for r in records:
        task = _task_key(r)
        for key, value in r.items():
            if key in ("task_id", "family", "success", "run") or value is None:
                continue
            v = float(value)
            if not math.isnan(v):
                acc[key][task].append(v)
    return {k: {t: float(np.mean(v)) for t, v in tasks.items()} for k, tasks in acc.items()}


def _task_key(r: Mapping):
    return _hashable(r.get("task_id"))


def _hashable(t):
    """A hashable key for a task id (ints, strings, or lists as some envs use)."""
    return tuple(_hashable(x) for x in t) if isinstance(t, (list, tuple)) else t


def summarize(records: Sequence[Mapping], *, per_seed: Sequence[Mapping[str, float]] = (),
              reference: Sequence[Mapping] | None = None, max_k: int = 4, tries: int | None = None,
              seeds_over: str = "eval_seeds", gap_key: str = "cost", gap_name: str = "gap_to_s_S_pct") -> dict:
    """Every metric of `records` (episodes of one entry, pooled over eval seeds and training runs) with its 95%
    interval (see module docstring, step 3), plus the per-seed values of `per_seed` and their sample std.

    `reference`: the reference agent's records on the same tasks; adds `gap_name`, the relative gap of `gap_key`
    with a paired bootstrap interval. `tries` caps k of pass^k (default: the fewest episodes of any task)."""
    if not records:
        raise ConfigError("no episodes to summarise")
    runs = sorted({r["run"] for r in records if r.get("run") is not None})
    if len(runs) > 1:
        return _summarize_runs(records, runs, per_seed=per_seed, reference=reference, max_k=max_k, tries=tries,
                               seeds_over=seeds_over, gap_key=gap_key, gap_name=gap_name)
    out: dict[str, dict] = {}
    per_task = task_values(records)
    for key, by_task in sorted(per_task.items()):
        vals = list(by_task.values())
        out[key] = {"mean": float(np.mean(vals)), "ci95": bootstrap_interval(vals), "interval": "bootstrap",
                    "tasks": len(vals)}
    if not all(r.get("success") is None for r in records):
        groups: dict[str, list[float]] = defaultdict(list)
        oks_by_task: dict = defaultdict(list)
        for r in records:
            ok = float(r.get("success") or 0.0)  # an episode that reports none did not succeed
            groups["success_rate"].append(ok)
            if r.get("family") is not None:
                groups[f"success/{r['family']}"].append(ok)
            oks_by_task[_task_key(r)].append(ok)
        for name, oks in groups.items():
            out[name] = {"mean": float(np.mean(oks)), "ci95": wilson_interval(sum(oks), len(oks)),
                         "interval": "wilson", "episodes": len(oks)}
        out["success"] = dict(out["success_rate"])
        counts = [(int(sum(v)), len(v)) for v in oks_by_task.values()]
        n_min = min(n for _, n in counts)
        for k in range(1, min(max_k, n_min if tries is None else min(tries, n_min)) + 1):
            vals = [math.comb(c, k) / math.comb(n, k) for c, n in counts]
            out[f"pass^{k}"] = {"mean": float(np.mean(vals)), "ci95": bootstrap_interval(vals),
                                "interval": "bootstrap", "tasks": len(vals)}
    if reference is not None:
        mine, ref = per_task.get(gap_key, {}), task_values(reference).get(gap_key, {})
        common = [t for t in mine if t in ref]
        if common:
            x = [float(mine[t]) for t in common]
            rx = [float(ref[t]) for t in common]
            if np.mean(rx) != 0:
                out[gap_name] = {"mean": float(100.0 * (np.mean(x) - np.mean(rx)) / abs(np.mean(rx))),
                                 "ci95": bootstrap_gap_interval(x, rx), "interval": "bootstrap",
                                 "tasks": len(common)}
    out["episodes"] = {"mean": float(len(records)), "ci95": None, "interval": None}
    _add_per_seed(out, per_seed, seeds_over)
    return out


def _add_per_seed(out: dict, per_seed: Sequence[Mapping[str, float]], seeds_over: str) -> None:
    for name, m in out.items():
        seeds = [float(s[name]) for s in per_seed if name in s]
        if name != "episodes" and len(seeds) == len(per_seed) and seeds:
            m["per_seed"] = seeds
            m["std"] = sample_std(seeds)
            m["n"] = len(seeds)
            m["seeds_over"] = seeds_over


def _summarize_runs(records, runs, *, per_seed, reference, max_k, tries, seeds_over, gap_key, gap_name) -> dict:
    """`summarize` for the episodes of several training runs (each record has a ``run``): the mean over all of
    them, and a two-level bootstrap over runs and tasks (`bootstrap_runs_tasks`) for every metric, rates included
    (a Wilson interval would treat the runs' episodes as one sample and hide run-to-run variation)."""
    by_run = {run: [r for r in records if r.get("run") == run] for run in runs}
    singles = {run: summarize([{k: v for k, v in r.items() if k != "run"} for r in recs], max_k=max_k, tries=tries)
               for run, recs in by_run.items()}
    tables = {run: task_values(recs) for run, recs in by_run.items()}
    for run, recs in by_run.items():  # success and pass^k per task and run, for the matrix below
        succ: dict = defaultdict(list)
        for r in recs:
            if r.get("success") is not None:
                succ[_task_key(r)].append(float(r["success"]))
        if succ:
            tables[run]["success_rate"] = {t: float(np.mean(v)) for t, v in succ.items()}
            tables[run]["success"] = tables[run]["success_rate"]
            for k in range(1, max_k + 1):
                if f"pass^{k}" in singles[run]:
                    tables[run][f"pass^{k}"] = {t: math.comb(int(sum(v)), k) / math.comb(len(v), k)
                                                for t, v in succ.items()}
            fams: dict = defaultdict(lambda: defaultdict(list))
            for r in recs:
                if r.get("family") is not None:
                    fams[r["family"]][_task_key(r)].append(float(r.get("success") or 0.0))
            for fam, tasks in fams.items():
                tables[run][f"success/{fam}"] = {t: float(np.mean(v)) for t, v in tasks.items()}
    out: dict[str, dict] = {}
    names = set(singles[runs[0]]).intersection(*(singles[r] for r in runs[1:])) - {"episodes"}
    if reference is not None and gap_key in names:
        names.add(gap_name)
    ref_tasks = task_values(reference).get(gap_key, {}) if reference is not None else {}
    for name in sorted(names):
        if name == gap_name and reference is not None:
            src = gap_key
        else:
            src = name
        cols = [t for t in tables[runs[0]].get(src, {}) if all(t in tables[r].get(src, {}) for r in runs)]
        if name == gap_name:
            cols = [t for t in cols if t in ref_tasks]
        if not cols:
            continue
        m = np.array([[tables[r][src][t] for t in cols] for r in runs])
        if name == gap_name:
            ref = np.array([ref_tasks[t] for t in cols])
            mean = float(100.0 * (m.mean() - ref.mean()) / abs(ref.mean())) if ref.mean() != 0 else float("nan")
            ci = bootstrap_runs_tasks(m, ref)
        else:
            mean, ci = float(m.mean()), bootstrap_runs_tasks(m)
        if math.isnan(mean):
            continue
        out[name] = {"mean": mean, "ci95": ci, "interval": "bootstrap_runs_tasks", "tasks": len(cols),
                     "runs": len(runs)}
    out["episodes"] = {"mean": float(len(records)), "ci95": None, "interval": None}
    _add_per_seed(out, per_seed, seeds_over)
    return out
