"""Render results files into the leaderboard: Markdown, CSV, a static HTML page and matplotlib plots.

Results are files anyone can re-render. `render_all(results, out_dir)` writes

* ``leaderboard.md``  one table per env (``value ± h`` where ``[value − h, value + h]`` is the 95% t-interval over
  eval seeds; pass^k is τ-bench's "all k tries succeed", not pass@k),
* ``leaderboard.csv`` one row per entry with every metric and its interval bounds,
* ``plots/*.png``     per env a bar chart of the table's first metric (with the intervals) and the learning curves
  read from the training runs' ``metrics.csv`` (path in the results file's ``curve``),
* ``index.html``      a self-contained page (one tab per env, click a column header to sort, plots inlined as
  base64 PNG, no network); its script ends with ``document.body.dataset.ready = "1"`` so a headless browser test
  can tell that it ran, and records any script error in ``document.body.dataset.jsError``.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from pathlib import Path

from shopsim.leaderboard.protocols import DEFAULT_METRICS, FAMILY_METRICS, LOWER_IS_BETTER

META_COLUMNS = ("entry", "kind", "seeds", "budget", "config", "status")
#: learning-curve columns, in order of preference (the first one a run's metrics.csv has is plotted)
CURVE_KEYS = ("eval/success_rate", "eval_success", "success_rate", "success", "eval/score", "score",
              "eval/return", "mean_return", "return", "return_raw", "value", "reward", "mean_reward", "cost",
              "train_cost", "loss")


def _family(results: list[dict]) -> str:
    return next((r.get("family") for r in results if r.get("family")), "")


def columns_for(results: list[dict]) -> list[str]:
    """The family's table metrics that at least one entry has (in the family's order), else the defaults."""
    wanted = FAMILY_METRICS.get(_family(results), DEFAULT_METRICS)
    present = {m for r in results for m in r.get("metrics", {})}
    cols = [m for m in wanted if m in present]
    return cols or sorted(m for m in present if m != "episodes")[:8]


def _sort_key(row: dict, primary: str | None):
    ok = row.get("status") == "ok"
    value = row.get("metrics", {}).get(primary, {}).get("mean") if primary else None
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (0 if ok else 2, 1, 0.0, row.get("entry", ""))
    signed = value if primary in LOWER_IS_BETTER else -value
    return (0 if ok else 2, 0, signed, row.get("entry", ""))


def _env_order(env_id: str) -> tuple[int, str]:
    """Registry order (Shopping, ProactiveRec, TwoStageRetrieval, Replenishment, ...), unknown ids last."""
    from shopsim.envs import all_env_ids

    ids = all_env_ids()
    return (ids.index(env_id) if env_id in ids else len(ids), env_id)


def _protocol_key(r: dict) -> str:
    if r.get("protocol_hash"):
        return r["protocol_hash"]
    return json.dumps([r["split"], r.get("task_ids"), r["seeds"], r.get("tries")], sort_keys=True, default=str)


def group_by_env(results: list[dict]) -> dict[str, list[dict]]:
    """One table per env id (in registry order), each sorted best first on the env's first table column.

    Only entries evaluated on the same episodes (the same ``protocol_hash``; for older files the same split, task
    ids, eval seeds and tries) share a table: if an env has results from several protocols, each gets its own
    table, keyed ``"<env id> [protocol i]"``, and is never ranked with the others.
    """
    envs: dict[str, dict[str, list[dict]]] = {}
    for r in results:
        envs.setdefault(r["env_id"], {}).setdefault(_protocol_key(r), []).append(r)
    out = {}
    for env_id in sorted(envs, key=_env_order):
        protocols = sorted(envs[env_id].values(), key=lambda rows: -len(rows))  # the most used protocol first
        for i, rows in enumerate(protocols, 1):
            cols = columns_for(rows)
            key = env_id if len(protocols) == 1 else f"{env_id} [protocol {i}]"
            out[key] = sorted(rows, key=lambda r: _sort_key(r, cols[0] if cols else None))
    return out


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
        return r["entry"]
    if col == "kind":
        return r["kind"]
    if col == "seeds":
        return ",".join(str(s) for s in r["seeds"])
    if col == "budget":
        return _budget_text(r)
    if col == "config":
        return r["config_hash"][:8]
    if col == "status":
        return r["status"] if r["status"] == "ok" else f"{r['status']}: {(r.get('error') or '').splitlines()[0][:80]}"
    raise KeyError(col)


def _protocol_line(rows: list[dict]) -> str:
    r = next((x for x in rows if x.get("task_ids")), rows[0])
    n_tasks = len(r.get("task_ids") or [])
    return (f"split `{r['split']}`, {n_tasks} tasks × {r.get('tries', '?')} tries per eval seed, "
            f"seeds {','.join(map(str, r['seeds']))}")


LEGEND = ("Values are means over the protocol's episodes with their 95% interval: `± h` when it is symmetric, "
          "`[lo, hi]` when not. Rates (success) use the Wilson interval; other metrics a seeded bootstrap over "
          "tasks; entries trained with several seeds ('xN runs') a bootstrap over training runs and tasks. The "
          "'per run' column lists the first metric per training seed and their sample std (ddof = 1). pass^k is "
          "the τ-bench estimator (all k tries of a task succeed). Lower is better for cost, gap and turns. Rows "
          "share a table only when measured on the same episodes (protocol hash).")


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
        lines += [f"## {env_id}", "", _protocol_line(rows) + (f"; tier `{tier}`" if tier else "")
                  + f"; protocol `{rows[0].get('protocol_hash') or '—'}`", ""]
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
                    cells.append(r["entry"] + (" (demo)" if r.get("demo") else ""))
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


# ----------------------------------------------------------------------------------------------------- plots
def _slug(env_id: str) -> str:
    """File-name-safe short name of a table key ("shopsim/Replenishment-v0 [protocol 2]" -> "Replenishment-v0_p2")."""
    name = env_id.split("/")[-1]
    return name.replace(" [protocol ", "_p").replace("]", "")


def _curve_path(r: dict) -> Path | None:
    curve = r.get("curve")
    if not curve or not isinstance(curve, str):  # a dict is the curve itself (`curve_of`)
        return None
    p = Path(curve)
    if not p.is_absolute() and r.get("_path"):
        p = Path(r["_path"]).parent / p
    return p if p.is_file() else None


def read_curve(path: Path) -> tuple[str, list[float], list[float]] | None:
    """(column, x, y) of the preferred learning-curve column of a metrics.csv, or None if it has none."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except (OSError, ValueError):
        return None
    if df.empty:
        return None
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
    key = next((k for k in CURVE_KEYS if k in numeric), None)
    if key is None:
        key = next((c for c in numeric if c not in ("iteration", "step", "iter", "time", "wall_s")), None)
    if key is None:
        return None
    xcol = next((c for c in ("iteration", "step", "iter") if c in df.columns), None)
    x = df[xcol].astype(float).tolist() if xcol else list(range(len(df)))
    return key, x, df[key].astype(float).tolist()


def curve_of(r: dict) -> tuple[str, list[float], list[float]] | None:
    """(metric, x, mean over training runs) of a results file's ``curve`` field, or of the metrics.csv it names."""
    c = r.get("curve")
    if isinstance(c, dict) and c.get("x") and c.get("per_seed"):
        runs = c["per_seed"]
        return c["metric"], list(c["x"]), [sum(v) / len(v) for v in zip(*runs, strict=False)]
    cp = _curve_path(r)
    return read_curve(cp) if cp else None


def plot_env(env_id: str, rows: list[dict], out_dir: Path) -> list[Path]:
    """Bar chart of the first table metric (with 95% intervals) and learning curves; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    cols = columns_for(rows)
    ok = [r for r in rows if r["status"] == "ok" and cols and cols[0] in r["metrics"]]
    if ok:
        metric = cols[0]
        means = [r["metrics"][metric]["mean"] for r in ok]
        errs = [((r["metrics"][metric].get("ci95") or [m, m])[1] - m) for r, m in zip(ok, means, strict=False)]
        fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(ok) + 2), 3.2))
        colors = ["#888888" if r["kind"] == "reference" else "#3b6fb6" for r in ok]
        ax.bar(range(len(ok)), means, yerr=errs, color=colors, capsize=3)
        ax.set_xticks(range(len(ok)), [r["entry"] for r in ok], rotation=30, ha="right")
        ax.set_ylabel(metric)
        if min(means) > 0 and max(means) / min(means) > 50:  # e.g. a random agent's cost dwarfs the rest
            ax.set_yscale("log")
        ax.set_title(f"{_slug(env_id)}: {metric} (95% CI over seeds)")
        fig.tight_layout()
        p = out_dir / f"{_slug(env_id)}_{metric.replace('^', '').replace('/', '_')}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)
    curves = [(r["entry"], curve_of(r)) for r in rows]
    curves = [(e, c) for e, c in curves if c]
    if curves:  # one small panel per run: their columns and scales differ
        ncols = min(3, len(curves))
        nrows = -(-len(curves) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.6 * nrows), squeeze=False)
        for ax, (entry, (key, x, y)) in zip(axes.flat, curves, strict=False):
            ax.plot(x, y, marker="." if len(x) < 30 else None)
            ax.set_title(entry, fontsize=9)
            ax.set_xlabel("iteration", fontsize=8)
            ax.set_ylabel(key, fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(curves):]:
            ax.set_visible(False)
        fig.suptitle(f"{_slug(env_id)}: learning curves (training metrics.csv)", fontsize=10)
        fig.tight_layout()
        p = out_dir / f"{_slug(env_id)}_curves.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)
    return paths


# ------------------------------------------------------------------------------------------------------ HTML
_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
nav button{margin:0 .3em .3em 0;padding:.4em .8em;
border:1px solid #aaa;background:#f4f4f4;cursor:pointer}nav button.active{background:#3b6fb6;color:#fff}
table{border-collapse:collapse;margin:.8em 0}th,td{border:1px solid #ccc;padding:.25em .6em;font-size:.9em}
th{background:#eee;cursor:pointer;user-select:none}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.reference td{background:#fafafa;color:#555}tr.error td{background:#fdecec}tr.skipped td{color:#999}
.meta{color:#666;font-size:.85em}img{max-width:100%;margin:.5em 1em .5em 0}"""

_JS = """window.addEventListener('error',function(e){document.body.dataset.jsError=String(e.message||e)});
function showTab(id){document.querySelectorAll('section.env').forEach(function(s){s.hidden=(s.id!==id)});
document.querySelectorAll('nav button').forEach(function(b){b.classList.toggle('active',b.dataset.tab===id)})}
function sortTable(th){var table=th.closest('table'),idx=Array.prototype.indexOf.call(th.parentNode.children,th);
var asc=th.dataset.dir!=='asc';th.parentNode.querySelectorAll('th').forEach(function(h){delete h.dataset.dir});
th.dataset.dir=asc?'asc':'desc';var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
rows.sort(function(a,b){var x=a.cells[idx].dataset.v,y=b.cells[idx].dataset.v,nx=parseFloat(x),ny=parseFloat(y);
var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:\
(isNaN(nx)&&!isNaN(ny)?1:(!isNaN(nx)&&isNaN(ny)?-1:String(x).localeCompare(String(y))));
return asc?c:-c});rows.forEach(function(r){body.appendChild(r)})}
document.querySelectorAll('nav button').forEach(\
function(b){b.addEventListener('click',function(){showTab(b.dataset.tab)})});
document.querySelectorAll('th').forEach(function(th){th.addEventListener('click',function(){sortTable(th)})});
var first=document.querySelector('nav button');if(first){showTab(first.dataset.tab)}
document.body.dataset.rows=String(document.querySelectorAll('tbody tr').length);
document.body.dataset.ready='1';"""


def _img_tag(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def to_html(results: list[dict], plots: dict[str, list[Path]] | None = None, title: str = "shopsim leaderboard") -> str:
    esc = html.escape
    plots = plots or {}
    groups = group_by_env(results)
    nav, sections = [], []
    for i, (env_id, rows) in enumerate(groups.items()):
        tab = f"env-{i}"
        nav.append(f'<button type="button" data-tab="{tab}">{esc(_slug(env_id))}</button>')
        cols = columns_for(rows)
        head = list(META_COLUMNS[:2]) + cols + list(META_COLUMNS[2:])
        ths = "".join(f'<th title="click to sort">{esc(c)}</th>' for c in head)
        trs = []
        for r in rows:
            tds = []
            for c in head:
                if c in META_COLUMNS:
                    text = _meta_cell(r, c)
                    tds.append(f'<td data-v="{esc(text)}">{esc(text)}</td>')
                else:
                    m = r["metrics"].get(c)
                    v = "" if not m else repr(float(m["mean"]))
                    tds.append(f'<td class="num" data-v="{v}">{esc(fmt_metric(m))}</td>')
            cls = "reference" if r["kind"] == "reference" else ""
            cls = r["status"] if r["status"] != "ok" else cls
            trs.append(f'<tr class="{cls}" data-entry="{esc(r["entry"])}">{"".join(tds)}</tr>')
        imgs = "".join(_img_tag(p) for p in plots.get(env_id, []))
        sections.append(
            f'<section class="env" id="{tab}" data-env="{esc(env_id)}"><h2>{esc(env_id)}</h2>'
            f'<p class="meta">{esc(_protocol_line(rows).replace("`", ""))}</p>'
            f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(trs)}</tbody></table>{imgs}</section>")
    note = ("Means over eval seeds ± half-width of the 95% t-interval. pass^k: all k tries of a task succeed "
            "(τ-bench). Click a column header to sort; gray rows are reference agents.")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{_CSS}</style></head><body><h1>{esc(title)}</h1><p class=\"meta\">{esc(note)}</p>"
            f"<nav>{''.join(nav)}</nav>{''.join(sections)}<script>{_JS}</script></body></html>\n")


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
        for env_id, rows in group_by_env(results).items():
            pngs[env_id] = plot_env(env_id, rows, out_dir / "plots")
    written["html"].write_text(to_html(results, pngs))
    return written
