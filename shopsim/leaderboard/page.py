"""The leaderboard's HTML page: one self-contained file (no network, no external script), one tab per table.

`to_html(results, plots)` writes, per table (an env, or an env and protocol when an env has several):

* a paragraph on the env (its record's ``description``, `shopsim.envs.records`) and the protocol line (split,
  tasks × tries, eval seeds), and, where the env has results under several protocols, a note of what differs
  between them (rows are ranked within a protocol only);
* the table, best first on the primary metric: a rank column, the entry, its kind and tier (the budget mode it was
  trained at), every metric as the mean with its 95% interval below it, budget and status; click a header to sort;
* one paragraph per shown metric (the metric registry, `shopsim.envs.record.METRICS`: what it measures and which
  direction is better);
* the charts (`shopsim.leaderboard.charts`: primary metric, Shopping's per-family success, learning curves), inlined
  as base64 PNG;
* provenance per row: creation date, shopsim version, git commit, wall time, eval seeds, config hash and the command
  that reproduces the row (the results file's ``command`` if it records one, else derived from the file), and the
  command that adds your own algorithm to the table.

Tabs are links: ``index.html#<Name-vN>`` opens that tab, and the address follows the tab shown. The page's
script ends with ``document.body.dataset.ready = "1"``, records a script error in ``document.body.dataset.jsError``
and, once laid out, the page's ``scrollWidth`` and ``clientWidth`` (so a headless browser test can check that the
tables fit the window).
"""

from __future__ import annotations

import base64
import html
import json
import shlex
from pathlib import Path

from shopsim.envs.record import find_record, lower_is_better, metric
from shopsim.leaderboard.protocols import record_key
from shopsim.leaderboard.tables import columns_for, group_by_env, slug


def env_text(key: str) -> str:
    """The paragraph on a leaderboard key's env: its scenario's description, else its record's (empty for an env
    without a record)."""
    env_id, _, scenario = key.partition(":")
    record = find_record(env_id)
    if record is None:
        return ""
    found = record.scenarios.get(scenario) if scenario else None
    return (found.description if found is not None else "") or record.description


def metric_text(name: str) -> str:
    """What metric `name` measures and which direction is better (the metric registry, `metric`)."""
    m = metric(name)
    text = m.text if m is not None else "a metric the env reports at the end of an episode."
    better = "lower" if lower_is_better(name) else "higher"
    return f"{text} {better.capitalize()} is better."


def metric_paragraphs(cols: list[str]) -> list[tuple[str, str]]:
    """(name, text) per shown metric; the pass^k columns share one paragraph, as do the success/<family> ones."""
    out: list[tuple[str, str]] = []
    passes = [c for c in cols if c.startswith("pass^")]
    families = [c for c in cols if c.startswith("success/")]
    for c in cols:
        if c in passes[1:] or c in families[1:]:
            continue
        if c in passes and len(passes) > 1:
            ks = [p[5:] for p in passes]
            out.append((f"pass^k (k = {', '.join(ks)})", metric_text("pass^k")))
        elif c in families and len(families) > 1:
            out.append(("success/<family>", "success rate on the tasks of one family ("
                        + ", ".join(f.split("/", 1)[1] for f in families) + "). Higher is better."))
        else:
            out.append((c, metric_text(c)))
    return out


def fmt_value(value: float) -> str:
    """A metric value with as many digits as its size warrants."""
    a = abs(value)
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def fmt_interval(lo: float, hi: float) -> str:
    """An interval in one digit fewer than its value (it sits, smaller, under the value): "0.35–0.45"."""
    def one(v: float) -> str:
        return fmt_value(v) if abs(v) >= 10 else f"{round(v, 2) + 0.0:.2f}"  # + 0.0: no "-0.00"

    sep = " to " if one(lo).startswith("-") or one(hi).startswith("-") else "–"  # "-9.00–-6.00" reads badly
    return f"{one(lo)}{sep}{one(hi)}"


def tier_of(r: dict) -> str:
    """The tier (budget mode) a trained row was trained at ("demo" for a live demo row); "—" for rows that were not
    trained and name no tier."""
    if r.get("demo"):
        return "demo"
    return _mode(r) or "—"


def _mode(r: dict) -> str | None:
    """The benchmark mode (tier) a row's budget names, if any."""
    b = r.get("budget") or {}
    mode = r.get("tier") or b.get("tier") or b.get("mode")
    return str(mode) if mode else None


def _bench_flag(tier: str) -> str:
    return {"quick": "--quick", "full": "--full"}.get(tier, f"--tier {tier}")


def reproduce_command(r: dict) -> str:
    """The command that reproduces a row: the results file's ``command`` if recorded, else one derived from it."""
    cmd = r.get("command")
    if isinstance(cmd, list) and cmd:
        return shlex.join(str(c) for c in cmd)
    if isinstance(cmd, str) and cmd:
        return cmd
    env_id = r["env_id"]
    if r["kind"] == "trained" or r.get("scenario"):  # a scenario's rows: the bench knows its env options
        algo = r.get("algorithm") or ""
        user = f" --algo {algo}" if ":" in algo else ""
        return f"shopsim bench {_bench_flag(_mode(r) or 'quick')} --envs {record_key(r).split('/')[-1]}{user}"
    ckpt = (r.get("config") or {}).get("checkpoint") if r["kind"] == "checkpoint" else None
    who = f"--checkpoint {shlex.quote(str(ckpt))}" if ckpt else f"--agent {shlex.quote(r['entry'])}"
    parts = [f"shopsim eval --env {env_id} {who} --split {r['split']}"]
    if r.get("task_ids"):
        parts.append(f"--tasks {len(r['task_ids'])}")
    if r.get("tries"):
        parts.append(f"--tries {r['tries']}")
    if r.get("decoding", "greedy") != "greedy":
        parts.append(f"--decoding {r['decoding']}")
    out = shlex.quote(f"results/{r['entry']}.json")
    parts.append(f"--seeds {' '.join(map(str, r['seeds']))} --out {out}")
    return " ".join(parts)


def submit_command(rows: list[dict]) -> str:
    """The command that trains your own algorithm at the table's tier and places it in this table."""
    tiers = [m for r in rows if r["kind"] == "trained" and not r.get("demo") and (m := _mode(r))]
    tier = max(set(tiers), key=tiers.count) if tiers else "quick"
    return (f"shopsim bench {_bench_flag(tier)} --envs {record_key(rows[0]).split('/')[-1]} "
            "--algo mypkg.module:MyAlgo")


def ranks(rows: list[dict], metric: str | None) -> list[str]:
    """Rank of each row (already sorted best first) on `metric`; equal values share a rank; "—" for rows without
    a value (errors, skipped)."""
    out, rank, last = [], 0, None
    for i, r in enumerate(rows):
        m = (r.get("metrics") or {}).get(metric) if metric else None
        if r.get("status") != "ok" or not m:
            out.append("—")
            continue
        if m["mean"] != last:
            rank, last = i + 1, m["mean"]
        out.append(str(rank))
    return out


def _protocol_desc(rows: list[dict]) -> dict[str, str]:
    r = next((x for x in rows if x.get("task_ids")), rows[0])
    desc = {"split": str(r["split"]), "tasks": str(len(r.get("task_ids") or [])), "tries": str(r.get("tries", "?")),
            "eval seeds": ",".join(map(str, r["seeds"]))}
    if r.get("env_kwargs"):
        desc["env options"] = json.dumps(r["env_kwargs"], sort_keys=True)
    if r.get("protocol_hash"):
        desc["protocol hash"] = str(r["protocol_hash"])[:12]
    return desc


def protocol_notes(groups: dict[str, list[dict]]) -> dict[str, str]:
    """Table key -> a note of how its protocol differs from the env's other tables (only envs with several)."""
    by_env: dict[str, list[str]] = {}
    for key, rows in groups.items():
        by_env.setdefault(rows[0]["env_id"], []).append(key)
    notes = {}
    for keys in by_env.values():
        if len(keys) < 2:
            continue
        descs = {k: _protocol_desc(groups[k]) for k in keys}
        fields = list(dict.fromkeys(f for d in descs.values() for f in d))
        differ = [f for f in fields if len({d.get(f, "—") for d in descs.values()}) > 1]
        if not differ:  # e.g. the same episodes under another env option the results files do not record
            for k in keys:
                notes[k] = (f"This env has results under {len(keys)} evaluation protocols that share split, tasks, "
                            "tries and eval seeds but not every setting; they are ranked separately.")
            continue
        for k in keys:
            others = "; ".join(f"{slug(o)}: " + ", ".join(f"{f} {descs[o].get(f, '—')}" for f in differ)
                               for o in keys if o != k)
            mine = ", ".join(f"{f} {descs[k].get(f, '—')}" for f in differ)
            notes[k] = (f"This env has results under {len(keys)} evaluation protocols, ranked separately because "
                        f"their rows were scored on different episodes. They differ in {', '.join(differ)}: this "
                        f"table has {mine}; {others}.")
    return notes


def _img_tag(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _metric_cell(m: dict | None) -> str:
    if not m:
        return '<td class="num" data-v="">—</td>'
    ci = m.get("ci95")
    sub = f'<span class="ci">{fmt_interval(ci[0], ci[1])}</span>' if ci else ""
    title = f' title="95% interval [{ci[0]:.6g}, {ci[1]:.6g}], n = {m.get("n", "?")}"' if ci else ""
    return f'<td class="num" data-v="{float(m["mean"])!r}"{title}>{fmt_value(m["mean"])}{sub}</td>'


def _status_cell(r: dict) -> str:
    if r["status"] == "ok":
        return '<td data-v="ok">ok</td>'
    err = (r.get("error") or "").strip()
    first = err.splitlines()[0] if err else ""
    short = first if len(first) <= 60 else first[:57] + "…"
    return (f'<td class="status" data-v="{html.escape(r["status"])}" title="{html.escape(err)}">'
            f'{html.escape(r["status"])}<span class="ci">{html.escape(short)}</span></td>')


def budget_text(r: dict) -> str:
    """A trained row's budget: iterations, and the number of training runs when there are several."""
    b = r.get("budget") or {}
    if not b:
        return "—"
    runs = len(b.get("train_seeds") or ())
    text = f"{b['iterations']} it" if "iterations" in b else json.dumps(b, sort_keys=True)
    return text + (f" ×{runs} seeds" if runs > 1 else "")


def _header(metric: str) -> str:
    # a break opportunity after "/" and "_" lets long names (success/clarify_and_buy) wrap instead of widening
    esc = html.escape(metric)
    return esc.replace("/", "/<wbr>").replace("_", "_<wbr>")


def _table(rows: list[dict], cols: list[str]) -> str:
    esc = html.escape
    head = ['<th title="click to sort">rank</th>', "<th>entry</th>", "<th>tier</th>"]
    head += [f'<th data-metric="{esc(c)}" title="{esc(metric_text(c))}">{_header(c)}</th>' for c in cols]
    head += ["<th>budget</th>", "<th>status</th>"]
    trs = []
    for r, rank in zip(rows, ranks(rows, cols[0] if cols else None), strict=True):
        # the kind is printed small under the entry: one column fewer keeps wide tables inside the window
        tds = [f'<td class="num" data-v="{rank if rank != "—" else ""}">{rank}</td>',
               f'<td data-v="{esc(r["entry"])}">{esc(r["entry"])}<span class="ci">{esc(r["kind"])}</span></td>',
               f'<td data-v="{esc(tier_of(r))}">{esc(tier_of(r))}</td>']
        tds += [_metric_cell(r["metrics"].get(c)) for c in cols]
        tds += [f'<td data-v="{esc(budget_text(r))}">{esc(budget_text(r))}</td>', _status_cell(r)]
        cls = r["status"] if r["status"] != "ok" else ("reference" if r["kind"] == "reference" else "")
        trs.append(f'<tr class="{cls}" data-entry="{esc(r["entry"])}">{"".join(tds)}</tr>')
    return (f'<table class="board"><thead><tr>{"".join(head)}</tr></thead><tbody>{"".join(trs)}</tbody>'
            "</table>")


def _provenance(rows: list[dict]) -> str:
    esc = html.escape
    trs = []
    for r in rows:
        wall = f"{r['wall_s']:.0f} s" if isinstance(r.get("wall_s"), (int, float)) else "—"
        created = str(r.get("created") or "—").replace("T", " ").replace("Z", " UTC")
        trs.append(f"<tr><td>{esc(r['entry'])}</td><td>{esc(created)}</td>"
                   f"<td>{esc(r['package_version'])}</td><td><code>{esc(r['git_commit'][:12])}</code></td>"
                   f"<td>{wall}</td><td>{esc(','.join(map(str, r['seeds'])))}</td>"
                   f"<td><code>{esc(r['config_hash'][:8])}</code></td>"
                   f'<td class="cmd"><code>{esc(reproduce_command(r))}</code></td></tr>')
    return ('<h3>Provenance</h3><table class="prov"><thead><tr><th>entry</th><th>created</th><th>version</th>'
            "<th>commit</th><th>wall time</th><th>eval seeds</th><th>config</th><th>reproduce</th></tr></thead>"
            f"<tbody>{''.join(trs)}</tbody></table>"
            f'<p>Add your own algorithm to this table (a <code>baselines.Algorithm</code> subclass, trained at the '
            f'same tier and evaluated on the same protocol):</p><pre class="cmd">{esc(submit_command(rows))}</pre>')


def _page_provenance(results: list[dict]) -> str:
    dates = sorted(str(r["created"])[:10] for r in results if r.get("created"))
    versions = sorted({r["package_version"] for r in results})
    commits = sorted({r["git_commit"][:12] for r in results})
    span = f"{dates[0]} to {dates[-1]}" if dates and dates[0] != dates[-1] else (dates[0] if dates else "unknown")
    return (f"Results created {span} by shopsim {', '.join(versions)} at commit{'s' if len(commits) > 1 else ''} "
            f"{', '.join(commits)}.")


_CSS = """body{font-family:system-ui,sans-serif;margin:1.2em;color:#222;max-width:100%}
nav a{display:inline-block;margin:0 .3em .3em 0;padding:.4em .8em;border:1px solid #aaa;background:#f4f4f4;
color:#222;text-decoration:none}nav a.active{background:#3b6fb6;color:#fff}
table{border-collapse:collapse;margin:.8em 0}th,td{border:1px solid #ccc;padding:.2em .35em;font-size:.85em}
table.board th{background:#eee;cursor:pointer;user-select:none;vertical-align:bottom;max-width:7em}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td .ci{display:block;color:#777;font-size:.8em}td.status{max-width:10em}
tr.reference td{background:#fafafa;color:#555}tr.error td{background:#fdecec}tr.skipped td{color:#999}
.meta{color:#666;font-size:.9em}.note{background:#fff8e0;border-left:3px solid #e0b000;padding:.4em .6em}
dl.metrics dt{font-weight:600;float:left;clear:left;margin-right:.5em}dl.metrics dd{margin:0 0 .2em 0}
table.prov td.cmd{word-break:break-all}pre.cmd{white-space:pre-wrap;word-break:break-all;background:#f6f6f6;
padding:.4em}img{max-width:100%;margin:.5em 1em .5em 0}p.env{max-width:60em}"""

_JS = """window.addEventListener('error',function(e){document.body.dataset.jsError=String(e.message||e)});
var tabs=Array.prototype.slice.call(document.querySelectorAll('nav a'));
function showTab(id){var hit=false;document.querySelectorAll('section.env').forEach(function(s){
s.hidden=(s.id!==id);hit=hit||s.id===id});tabs.forEach(function(a){a.classList.toggle('active',a.dataset.tab===id)});
return hit}
function fromHash(){var id=decodeURIComponent(location.hash.slice(1));if(!(id&&showTab(id))&&tabs.length){
showTab(tabs[0].dataset.tab)}}
function sortTable(th){var table=th.closest('table'),idx=Array.prototype.indexOf.call(th.parentNode.children,th);
var asc=th.dataset.dir!=='asc';th.parentNode.querySelectorAll('th').forEach(function(h){delete h.dataset.dir});
th.dataset.dir=asc?'asc':'desc';var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
rows.sort(function(a,b){var x=a.cells[idx].dataset.v,y=b.cells[idx].dataset.v,nx=parseFloat(x),ny=parseFloat(y);
var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:\
(isNaN(nx)&&!isNaN(ny)?1:(!isNaN(nx)&&isNaN(ny)?-1:String(x).localeCompare(String(y))));
return asc?c:-c});rows.forEach(function(r){body.appendChild(r)})}
window.addEventListener('hashchange',fromHash);
document.querySelectorAll('table.board th').forEach(function(th){
th.addEventListener('click',function(){sortTable(th)})});
fromHash();
window.addEventListener('load',function(){var d=document.documentElement;
document.body.dataset.scrollWidth=String(d.scrollWidth);document.body.dataset.clientWidth=String(d.clientWidth)});
document.body.dataset.rows=String(document.querySelectorAll('table.board tbody tr').length);
document.body.dataset.ready='1';"""


def to_html(results: list[dict], plots: dict[str, list[Path]] | None = None, title: str = "shopsim leaderboard") -> str:
    """The page (see module docstring); `plots` maps a table key to its chart PNGs."""
    esc = html.escape
    plots = plots or {}
    groups = group_by_env(results)
    notes = protocol_notes(groups)
    nav, sections = [], []
    for key, rows in groups.items():
        tab = slug(key)
        nav.append(f'<a href="#{esc(tab)}" data-tab="{esc(tab)}">{esc(tab)}</a>')
        cols = columns_for(rows)
        about = env_text(record_key(rows[0]))
        desc = _protocol_desc(rows)
        proto = (f"Protocol: split {desc['split']}, {desc['tasks']} tasks × {desc['tries']} tries per eval seed, "
                 f"eval seeds {desc['eval seeds']}" + (f", env options {desc['env options']}"
                                                       if "env options" in desc else "") + ".")
        metrics = "".join(f"<dt>{esc(name)}</dt><dd>{esc(text)}</dd>" for name, text in metric_paragraphs(cols))
        imgs = "".join(_img_tag(p) for p in plots.get(key, []))
        note = f'<p class="note">{esc(notes[key])}</p>' if key in notes else ""
        sections.append(
            f'<section class="env" id="{esc(tab)}" data-env="{esc(key)}"><h2>{esc(key)}</h2>'
            f'<p class="env">{esc(about)}</p><p class="meta">{esc(proto)}</p>{note}{_table(rows, cols)}'
            f'<dl class="metrics">{metrics}</dl>{imgs}{_provenance(rows)}</section>')
    intro = ("Each tab is one env (and protocol). Rows are ranked best first on the first metric column; a value's "
             "95% interval is printed under it (hover for the exact bounds). Gray rows are reference agents; the "
             "tier is the budget a trained row was trained at. Click a column header to sort.")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<meta name="viewport" content="width=device-width"><style>{_CSS}</style></head><body>'
            f'<h1>{esc(title)}</h1><p class="meta">{esc(intro)}</p>'
            f'<p class="meta">{esc(_page_provenance(results)) if results else ""}</p>'
            f"<nav>{''.join(nav)}</nav>{''.join(sections)}<script>{_JS}</script></body></html>\n")
