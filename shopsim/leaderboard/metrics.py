"""Leaderboard metrics: per-episode records, per-seed summaries, pass^k, and 95% confidence intervals.

The pipeline is episodes → one summary per eval seed → mean and interval over seeds:

1. `episode_record(traj)` reads what an episode produced: ``success`` (``info["success"]`` at the last turn; None
   where the env defines no success, as the cost envs do, which then get no success_rate or pass^k),
   ``score`` (``info["score"]``, else the return), ``return``, ``turns``, ``tokens`` (generated tokens),
   ``invalid_rate`` (share of turns whose ``info["invalid_action"]`` is set) and every number the env put in
   ``info["episode_metrics"]`` (design contract: shopping success/score/turns, replenishment cost, rec IoI/IoR/CTR,
   retrieval policy value ...).
2. `seed_summary(records, tries)` averages the records of one eval seed and adds ``success_rate``,
   ``success/<family>`` for every task family the episodes record (``traj.meta["family"]``, Shopping) and
   ``pass^k`` for k = 1..min(4, tries).
3. `aggregate(summaries)` gives, per metric, the mean over seeds with a 95% Student-t interval
   (``mean ± t_{0.975, n-1} · sd / sqrt(n)``; no interval with one seed). The t quantiles are tabulated
   (`T_975`) so no SciPy is needed.

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
