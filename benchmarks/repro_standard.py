"""The algorithm cards' claims, read from the shipped standard-tier results (``data/results/standard``).

    python -m benchmarks.repro_standard [--quick] [--results data/results/standard] [--json PATH]
                                        [--md docs/results/standard_claims.md]

Nothing is trained here: the standard tier (``shopsim bench --tier standard``) trained every baseline with 3 seeds
and shipped its results; this script checks, per env, each claim that the tier can speak to and says *shown*, *not
shown* or *not measured* (the tier's setting differs from the claim's), with the value per training seed, the mean
and the sample standard deviation (ddof = 1). Differences are reported relative to the reference row (scale-free).

* every trained baseline beats the random agent on its env's primary metric (return, policy value, cost): shown when
  the row's 95% interval (bootstrap over training runs and tasks) lies entirely on the better side of random's;
* HPO below Gaussian PPO in cost (HPO card), and the gap growing with the number of SKUs N;
* HPO below (s, S) in cost on Replenishment-v0's seasonal scenario (``Replenishment-v0:seasonal``, seasonal demand
  and a shared capacity, where a stationary (s, S) rule is not optimal): shown when the 95% interval of HPO's
  paired gap to (s, S) (``gap_to_s_S_pct``, bootstrap over training runs and tasks on the same demand paths) lies
  below 0;
* CA-PG and TOP1 above V-PG (CA-PG card, claimed at K = 20): read from TwoStageRetrieval-v0's k20 scenario
  (``TwoStageRetrieval-v0:k20``, the card's K = 20), else from the default K = 10 table;
* ProRL above its SFT start on IoI, with useful path lengths and no collapse (ProRL card): the start is the
  learning curve's first point (in-training evaluation on dev users), the end the leaderboard's test value;
* the Shopping LM trainers above their start, the shipped SFT checkpoint (``lm-sft``) on the same protocol.

``--quick`` is accepted for ``python -m benchmarks --repro`` and changes nothing (the script only reads files).
Writes the Markdown table (``--md``) and the JSON (``--json``) with the command, commit and wall time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np


def _rows(results_dir: Path) -> dict[str, dict[str, dict]]:
    from shopsim.app.bench import shipped_results
    from shopsim.leaderboard.protocols import record_key

    out: dict[str, dict[str, dict]] = {}
    for r in shipped_results(results_dir):
        if r["status"] == "ok":  # keyed "Replenishment-v0", or "Replenishment-v0:seasonal" for a scenario's rows
            out.setdefault(record_key(r).split("/")[-1], {})[r["entry"]] = r
    return out


def _seeds(rec: dict, metric: str) -> dict:
    m = rec["metrics"][metric]
    vals = m.get("per_seed") or [m["mean"]]
    return {"per_seed": [round(v, 4) for v in vals], "mean": round(float(np.mean(vals)), 4),
            "sd": None if len(vals) < 2 else round(float(np.std(vals, ddof=1)), 4),
            "ci95": [round(v, 4) for v in m["ci95"]] if m.get("ci95") else None}


def _better(a: dict, b: dict, metric: str, lower: bool) -> bool:
    """Whether row `a`'s 95% interval lies entirely on the better side of row `b`'s."""
    ma, mb = a["metrics"][metric], b["metrics"][metric]
    lo_a, hi_a = ma.get("ci95") or [ma["mean"]] * 2
    lo_b, hi_b = mb.get("ci95") or [mb["mean"]] * 2
    return hi_a < lo_b if lower else lo_a > hi_b


def claims(rows: dict[str, dict[str, dict]]) -> list[dict]:
    from shopsim.envs.record import lower_is_better, table_metrics

    out = []
    for env, entries in sorted(rows.items()):
        rand = entries.get("random")
        for name, rec in sorted(entries.items()):
            if rec["kind"] != "trained" or rand is None:
                continue
            metric = table_metrics(rec.get("env_id", env.split(":")[0]), rec["family"])[0]
            lower = lower_is_better(metric)
            base = rand["metrics"][metric]["mean"]
            rel = 100 * (rec["metrics"][metric]["mean"] - base) / abs(base) if base else None  # random at 0
            out.append({"env": env, "claim": f"{name} beats random on {metric}",
                        "verdict": "shown" if _better(rec, rand, metric, lower) else "not shown",
                        "values": _seeds(rec, metric), "reference": _seeds(rand, metric),
                        "relative_pct": None if rel is None else round(rel, 1)})
    inv = rows.get("Replenishment-v0", {})
    if "hpo" in inv and "ppo" in inv:
        n = inv["hpo"]["config"].get("env_kwargs", {}).get("n_skus", 5)
        rel = 100 * (inv["hpo"]["metrics"]["cost"]["mean"] / inv["ppo"]["metrics"]["cost"]["mean"] - 1)
        out.append({"env": "Replenishment-v0", "claim": f"HPO below Gaussian PPO in cost (N = {n} SKUs)",
                    "verdict": "shown" if _better(inv["hpo"], inv["ppo"], "cost", True) else "not shown",
                    "values": _seeds(inv["hpo"], "cost"), "reference": _seeds(inv["ppo"], "cost"),
                    "relative_pct": round(rel, 1)})
        out.append({"env": "Replenishment-v0", "claim": "the HPO-PPO gap grows with N",
                    "verdict": "not measured", "note": f"the standard tier trains one N ({n} SKUs)"})
    seas = rows.get("Replenishment-v0:seasonal", {})
    if "hpo" in seas and "s_S" in seas:
        gap = seas["hpo"]["metrics"]["gap_to_s_S_pct"]
        lo, hi = gap.get("ci95") or [gap["mean"]] * 2
        out.append({"env": "Replenishment-v0:seasonal", "claim": "HPO below (s, S) in cost on the seasonal scenario "
                    f"(paired gap {gap['mean']:+.1f}% [{lo:+.1f}, {hi:+.1f}])",
                    "verdict": "shown" if hi < 0 else "not shown",
                    "values": _seeds(seas["hpo"], "cost"), "reference": _seeds(seas["s_S"], "cost"),
                    "relative_pct": round(gap["mean"], 1)})
    # the card claims it at K = 20: the k20 scenario's rows (TwoStageRetrieval-v0:k20), else the default K = 10 ones
    ret_env = next((e for e in ("TwoStageRetrieval-v0:k20", "TwoStageRetrieval-v0") if rows.get(e)),
                   "TwoStageRetrieval-v0")
    ret = rows.get(ret_env, {})
    for name in ("capg", "top1"):
        if name in ret and "vpg" in ret:
            k = ret[name]["config"].get("k") or ret[name]["config"].get("env_kwargs", {}).get("k", 10)
            rel = 100 * (ret[name]["metrics"]["policy_value"]["mean"] / ret["vpg"]["metrics"]["policy_value"]["mean"]
                         - 1)
            setting = "the card's setting" if k == 20 else "the card claims it at K = 20"
            out.append({"env": ret_env, "claim": f"{name} above vpg on policy value (K = {k}, {setting})",
                        "verdict": "shown" if _better(ret[name], ret["vpg"], "policy_value", False) else "not shown",
                        "values": _seeds(ret[name], "policy_value"), "reference": _seeds(ret["vpg"], "policy_value"),
                        "relative_pct": round(rel, 2)})
    rec = rows.get("ProactiveRec-v0", {}).get("prorl")
    if rec is not None and rec.get("curve"):
        c = rec["curve"]
        start = [s[0] for s in c["per_seed"]]
        end = [s[-1] for s in c["per_seed"]]
        out.append({"env": "ProactiveRec-v0", "claim": f"prorl above its SFT start on {c['metric']} (dev users, "
                    "in-training evaluation)",
                    "verdict": "shown" if min(e - s for s, e in zip(start, end, strict=True)) > 0 else "not shown",
                    "values": {"per_seed": [round(v, 4) for v in end], "mean": round(float(np.mean(end)), 4),
                               "sd": round(float(np.std(end, ddof=1)), 4) if len(end) > 1 else None},
                    "reference": {"per_seed": [round(v, 4) for v in start], "mean": round(float(np.mean(start)), 4),
                                  "sd": round(float(np.std(start, ddof=1)), 4) if len(start) > 1 else None},
                    "relative_pct": round(100 * (np.mean(end) / np.mean(start) - 1), 1)})
        length = _seeds(rec, "length")
        out.append({"env": "ProactiveRec-v0", "claim": "prorl keeps useful path lengths (test, >= 2 items per path "
                    "on every seed)", "verdict": "shown" if min(length["per_seed"]) >= 2 else "not shown",
                    "values": length})
    shop = rows.get("Shopping-v0", {})
    start = shop.get("lm-sft")  # the shipped SFT checkpoint every Shopping LM trainer starts from
    for name, rec in sorted(shop.items()):
        if rec["kind"] != "trained" or start is None:
            continue
        vals, ref = _seeds(rec, "success_rate"), _seeds(start, "success_rate")
        every = min(vals["per_seed"]) > ref["mean"]
        verdict = "shown" if _better(rec, start, "success_rate", False) else "not shown"
        out.append({"env": "Shopping-v0", "claim": f"{name} above its start (lm-sft) on success_rate",
                    "verdict": verdict, "note": f"every seed above the start: {'yes' if every else 'no'}",
                    "values": vals, "reference": ref,
                    "relative_pct": round(100 * (vals["mean"] / ref["mean"] - 1), 1) if ref["mean"] else None})
    return out


def to_markdown(items: list[dict], meta: dict) -> str:
    lines = ["# Algorithm-card claims at the standard tier", "",
             f"Read from the shipped standard-tier results by `{meta['command']}` (commit `{meta['commit']}`). "
             "Values per training seed, their mean and sample std (ddof = 1); *relative* is the row's difference "
             "to the reference in percent of the reference (scale-free). A claim is *shown* when the row's 95% "
             "interval (bootstrap over training runs and tasks) lies entirely on the better side of the "
             "reference's.", "",
             "| env | claim | verdict | row per seed (mean, sd) | reference per seed (mean, sd) | relative |",
             "|---|---|---|---|---|---:|"]

    def num(x: float) -> str:
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"

    def cell(v):
        if not v:
            return "—"
        sd = "—" if v.get("sd") is None else num(v["sd"])
        return f"{', '.join(num(x) for x in v['per_seed'])} ({num(v['mean'])}, sd {sd})"

    for c in items:
        rel = f"{c['relative_pct']:+.1f}%" if c.get("relative_pct") is not None else "—"
        verdict = c["verdict"] + (f": {c['note']}" if c.get("note") else "")
        lines.append(f"| {c['env']} | {c['claim']} | {verdict} | {cell(c.get('values'))} | "
                     f"{cell(c.get('reference'))} | {rel} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from shopsim.leaderboard.results import git_commit
    from shopsim.paths import write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="accepted for `python -m benchmarks`; changes nothing")
    ap.add_argument("--results", default=None, help="standard-tier results folder (default data/results/standard)")
    ap.add_argument("--json", default=None, help="write the claims as JSON here")
    ap.add_argument("--md", default=None, help="write the Markdown table here (e.g. docs/results/standard_claims.md)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    from shopsim.app.bench import shipped_dir

    items = claims(_rows(Path(args.results) if args.results else shipped_dir()))
    meta = {"command": "python -m benchmarks.repro_standard " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "commit": git_commit(), "wall_s": round(time.perf_counter() - t0, 3)}
    md = to_markdown(items, meta)
    print(md)
    if args.md:
        write_text_atomic(Path(args.md), md)
    if args.json:
        write_text_atomic(Path(args.json), json.dumps({**meta, "claims": items}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
