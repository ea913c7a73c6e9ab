"""Render results files into the leaderboard: Markdown, CSV, a static HTML page and matplotlib plots.

Results are files anyone can re-render. `render_all(results, out_dir)` writes

* ``leaderboard.md``  one table per env (``value ± h`` where ``[value − h, value + h]`` is the 95% t-interval over
  eval seeds; pass^k is τ-bench's "all k tries succeed", not pass@k),
* ``leaderboard.csv`` one row per entry with every metric and its interval bounds,
* ``plots/*.png``     per table the charts of `shopsim.leaderboard.charts` (primary metric, Shopping's success per
  family, learning curves of the metric that matters),
* ``index.html``      the self-contained page of `shopsim.leaderboard.page` (one linkable tab per table, ranks,
  tiers, what each env and metric means, provenance; charts inlined, no network).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from shopsim.leaderboard.charts import plot_env
from shopsim.leaderboard.page import to_html
from shopsim.leaderboard.tables import columns_for, group_by_env

META_COLUMNS = ("entry", "kind", "seeds", "budget", "config", "status")
#: learning-curve columns, in order of preference (the first one a run's metrics.csv has is plotted)
CURVE_KEYS = ("eval/success_rate", "eval_success", "success_rate", "success", "eval/score", "score",
              "eval/return", "mean_return", "return", "return_raw", "value", "reward", "mean_reward", "cost",
              "train_cost", "loss")


#: characters that start Markdown (or inline HTML) markup inside a table cell; `&` too, so that an entity such as
#: ``&#x202E;`` stays text. ``|`` is escaped per cell (`to_markdown`).
_MARKDOWN_SPECIAL = frozenset("\\`*[]<>~&")


def md_text(text: str) -> str:
    """`text` as literal Markdown: markup characters backslash-escaped (CommonMark renders ``\\<`` as ``<``), line
    breaks as spaces, so a name from a results file can neither format the table nor inject HTML. An underscore
    between two letters or digits (``s_S``) cannot start emphasis and stays as it is."""
    text = str(text).replace("\r", " ").replace("\n", " ")
    out = []
    for i, c in enumerate(text):
        intraword = c == "_" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
        out.append("\\" + c if c in _MARKDOWN_SPECIAL or (c == "_" and not intraword) else c)
    return "".join(out)


def _heading(key: str) -> str:
    """A table's heading: its env id (and scenario) as literal text, the ``[protocol i]`` that `group_by_env` adds
    as it is."""
    env, sep, rest = key.rpartition(" [protocol ")
    return f"{md_text(env)}{sep}{rest}" if sep and rest[:-1].isdigit() and rest.endswith("]") else md_text(key)


def _code(text: str) -> str:
    """`text` as a Markdown code span (its own backticks, which would end the span, as quotes)."""
    return "`" + str(text).replace("`", "'").replace("\n", " ") + "`"


def fmt_metric(m: dict | None, digits: int = 3) -> str:
    """``mean ± h`` for a (near-)symmetric 95% interval, ``mean [lo, hi]`` for a skewed one (a Wilson interval
    near 0 or 1, a bootstrap interval of a skewed metric), so that the text never implies values outside it."""
    if not m:
        return "—"
    text = f"{m['mean']:.{digits}f}"
    if m.get("ci95"):
        lo, hi = m["ci95"]
        half = (hi - lo) / 2
        if abs((hi - m["mean"]) - (m["mean"] - lo)) <= 0.2 * half:
            text += f" ± {half:.{digits}f}"
        else:
            text += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return text


def _budget_text(r: dict) -> str:
    b = r.get("budget") or {}
    if not b:
        return "—"
    parts = [f"{b['iterations']} it" if "iterations" in b else "", b.get("mode", ""),
             f"x{len(b['train_seeds'])} runs" if len(b.get("train_seeds") or ()) > 1 else ""]
    return " ".join(p for p in parts if p) or json.dumps(b, sort_keys=True)


def _meta_cell(r: dict, col: str) -> str:
    if col == "entry":
        return md_text(r["entry"])
    if col == "kind":
        return r["kind"]
    if col == "seeds":
        return ",".join(str(s) for s in r["seeds"])
    if col == "budget":
        return _budget_text(r)
    if col == "config":
        return r["config_hash"][:8]
    if col == "status":
        if r["status"] == "ok":
            return r["status"]
        first = ((r.get("error") or "").splitlines() or [""])[0]
        return md_text(f"{r['status']}: {first[:80]}")
    raise KeyError(col)


def _protocol_line(rows: list[dict]) -> str:
    r = next((x for x in rows if x.get("task_ids")), rows[0])
    n_tasks = len(r.get("task_ids") or [])
    return (f"split {_code(r['split'])}, {n_tasks} tasks × {r.get('tries', '?')} tries per eval seed, "
            f"seeds {','.join(map(str, r['seeds']))}")


LEGEND = ("Values are means over the protocol's episodes with their 95% interval: `± h` when it is symmetric, "
          "`[lo, hi]` when not. Rates (success) use the Wilson interval; other metrics a seeded bootstrap over "
          "tasks; entries trained with several seeds ('xN runs') a bootstrap over training runs and tasks. The "
          "'per run' column lists the first metric per training seed and their sample std (ddof = 1). pass^k is "
          "the τ-bench estimator (all k tries of a task succeed). LM agents decode greedily, whatever temperature "
          "they were trained at, so a task's tries differ only where the env's reset seed changes the episode (the "
          "simulated customer's replies). Lower is better for cost, gap and turns. Rows share a table only when "
          "measured on the same episodes and decoding (protocol hash).")


def _per_run_cell(r: dict, metric: str | None) -> str:
    m = (r.get("metrics") or {}).get(metric or "") or {}
    if m.get("seeds_over") != "train_seeds" or not m.get("per_seed"):
        return "—"
    def num(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"

    vals = ", ".join(num(v) for v in m["per_seed"])
    return f"{vals} (sd {num(m['std'])})" if m.get("std") is not None else vals


def to_markdown(results: list[dict], title: str | None = "shopsim leaderboard", legend: bool = True) -> str:
    lines = [f"# {title}", ""] if title else []
    lines += [LEGEND, ""] if legend else []
    for env_id, rows in group_by_env(results).items():
        cols = columns_for(rows)
        tier = next((r.get("tier") for r in rows if r.get("tier")), None)
        lines += [f"## {_heading(env_id)}", "", _protocol_line(rows) + (f"; tier {_code(tier)}" if tier else "")
                  + f"; protocol {_code(rows[0].get('protocol_hash') or '—')}", ""]
        runs = any(r.get("ci_over") == "train_seeds" for r in rows)
        head = ["rank"] + list(META_COLUMNS[:2]) + cols + (["per run"] if runs else []) + list(META_COLUMNS[2:])
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join("---" if c in META_COLUMNS or c == "per run" else "---:" for c in head) + "|")
        rank = 0
        for r in rows:
            rank += r["status"] == "ok"
            cells = []
            for c in head:
                if c == "rank":
                    cells.append(str(rank) if r["status"] == "ok" else "—")
                elif c == "per run":
                    cells.append(_per_run_cell(r, cols[0] if cols else None))
                elif c == "entry":
                    cells.append(md_text(r["entry"]) + (" (demo)" if r.get("demo") else ""))
                elif c in META_COLUMNS:
                    cells.append(_meta_cell(r, c))
                else:
                    cells.append(fmt_metric(r["metrics"].get(c)))
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def to_csv(results: list[dict]) -> str:
    metrics = sorted({m for r in results for m in r.get("metrics", {})})
    head = ["env_id", "split", "entry", "kind", "status", "algorithm", "config_hash", "seeds", "budget", "git_commit",
            "error"]
    for m in metrics:
        head += [m, f"{m}_ci_lo", f"{m}_ci_hi"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for env_rows in group_by_env(results).values():
        for r in env_rows:
            row = [r["env_id"], r["split"], r["entry"], r["kind"], r["status"], r.get("algorithm") or "",
                   r["config_hash"], " ".join(map(str, r["seeds"])), json.dumps(r.get("budget"), sort_keys=True),
                   r["git_commit"], (r.get("error") or "").splitlines()[0] if r.get("error") else ""]
            for m in metrics:
                s = r["metrics"].get(m)
                ci = (s or {}).get("ci95") or ["", ""]
                row += [s["mean"] if s else "", ci[0], ci[1]]
            w.writerow(row)
    return buf.getvalue()


def render_all(results: list[dict], out_dir: str | Path, *, plots: bool = True) -> dict[str, Path]:
    """Write leaderboard.md, leaderboard.csv, plots/*.png and index.html into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {"markdown": out_dir / "leaderboard.md", "csv": out_dir / "leaderboard.csv",
               "html": out_dir / "index.html"}
    written["markdown"].write_text(to_markdown(results))
    written["csv"].write_text(to_csv(results))
    pngs: dict[str, list[Path]] = {}
    if plots:
        for key, rows in group_by_env(results).items():
            pngs[key] = plot_env(key, rows, out_dir / "plots")
    written["html"].write_text(to_html(results, pngs))
    return written
