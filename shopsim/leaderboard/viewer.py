"""A static trajectory viewer: one self-contained HTML page to read what an agent did, turn by turn.

`render_viewer(trajectories)` lists the episodes (task, task family, seed, strategy, agent, turns, return, score,
success; filterable by text and by failures only, sortable by clicking a header) and shows, for the selected
episode, its task once and then every turn: the observation the agent saw (without the task lines it repeats every
turn), its action, the reward, the terminated/truncated flags, the invalid-action reason if any, and the rest of
the env's info. Numbers are rounded to `DIGITS` significant digits; long observations are cut at `max_chars` (the
cut is marked). `read_dataset(path)` reads a shopsim Parquet dataset (`shopsim.datasets.read_trajectories`).

Envs without a success criterion (the cost envs, e.g. Replenishment) show no success column value and never count
as failures. Replenishment episodes are drawn as a matplotlib chart (stock, orders, demand and cost per period,
summed over SKUs) with a per-period table of the same numbers, instead of the raw observation arrays; at most
`max_charts` episodes get a chart, since each one takes matplotlib a noticeable fraction of a second.

The page needs no network; its script sets ``document.body.dataset.ready = "1"`` when done (and
``dataset.jsError`` on a script error) so headless-browser tests can check it.
"""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path

from shopsim.errors import DatasetError
from shopsim.trajectory import Trajectory, to_jsonable

_CSS = """body{font-family:system-ui,sans-serif;margin:0;display:flex;height:100vh;color:#222}
#list{width:42%;overflow:auto;border-right:1px solid #ccc;padding:.6em}#detail{flex:1;overflow:auto;padding:.8em}
table{border-collapse:collapse;width:100%}
th,td{border:1px solid #ddd;padding:.2em .4em;font-size:.82em;vertical-align:top}
th{background:#eee;cursor:pointer}tr.ep{cursor:pointer}tr.ep:hover{background:#eef3fb}tr.ep.sel{background:#d6e4f7}
tr.fail td.ok{color:#b00}tr.win td.ok{color:#070}
pre{white-space:pre-wrap;margin:0;font-size:.95em;max-height:22em;overflow:auto}
td.invalid{background:#fdecec}.cut{color:#a60}.muted{color:#777}input{width:60%}
section.episode table{table-layout:fixed}section.episode pre{word-break:break-word}
col.n{width:3%}col.obs{width:40%}col.act{width:16%}col.rew{width:8%}col.inv{width:9%}col.end{width:7%}col.info{width:17%}
p.task{background:#f4f7fb;border-left:3px solid #3b6fb6;padding:.4em .6em;white-space:pre-wrap}
div.chart svg{max-width:100%;height:auto}table.periods td{text-align:right;font-variant-numeric:tabular-nums}"""

_JS = """window.addEventListener('error',function(e){document.body.dataset.jsError=String(e.message||e)});
function show(i){document.querySelectorAll('section.episode').forEach(function(s){s.hidden=(s.dataset.i!==String(i))});
document.querySelectorAll('tr.ep').forEach(function(r){r.classList.toggle('sel',r.dataset.i===String(i))})}
function filt(){var q=document.getElementById('q').value.toLowerCase(),f=document.getElementById('fails').checked;
document.querySelectorAll('tr.ep').forEach(function(r){var ok=(!q||r.textContent.toLowerCase().indexOf(q)>=0)&&
(!f||r.classList.contains('fail'));
r.hidden=!ok})}
function sortBy(th){var t=th.closest('table'),
i=Array.prototype.indexOf.call(th.parentNode.children,th),asc=th.dataset.dir!=='asc';
th.dataset.dir=asc?'asc':'desc';var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows);rows.sort(function(x,y){
var a=x.cells[i].textContent,c=y.cells[i].textContent,na=parseFloat(a),nc=parseFloat(c);
var d=(!isNaN(na)&&!isNaN(nc))?na-nc:a.localeCompare(c);return asc?d:-d});rows.forEach(function(r){b.appendChild(r)})}
document.querySelectorAll('tr.ep').forEach(function(r){r.addEventListener('click',function(){show(r.dataset.i)})});
document.querySelectorAll('#list th').forEach(function(th){th.addEventListener('click',function(){sortBy(th)})});
document.getElementById('q').addEventListener('input',filt);document.getElementById('fails').addEventListener('change',filt);
if(document.querySelector('tr.ep')){show(document.querySelector('tr.ep').dataset.i)}
document.body.dataset.episodes=String(document.querySelectorAll('tr.ep').length);document.body.dataset.ready='1';"""

#: info keys left out of the turn table: the episode metrics (shown once above the turns) and the episode-level
#: fields the header and the episode list already show
_HIDDEN_INFO = ("episode_metrics", "family", "task_id", "split", "strategy")
#: significant digits of every number the page shows (observations, actions, info, rewards, chart tables)
DIGITS = 4
#: observation lines that state the episode's task (Shopping's text observations repeat them on every turn): shown
#: once, above the turns, and left out of each turn's observation
TASK_PREFIXES = ("Task:", "Strategy:", "Policy:")
#: env families without a success criterion (they minimise a cost): no success value, never a failure
NO_SUCCESS_FAMILIES = frozenset({"inventory"})


def rounded(value, digits: int = DIGITS):
    """`value` (JSON-like) with every float rounded to `digits` significant digits; whole numbers lose the ".0"."""
    if isinstance(value, bool) or isinstance(value, int) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return value
        r = float(f"{value:.{digits}g}")
        return int(r) if r.is_integer() and abs(r) < 1e15 else r
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def _num(value: float) -> str:
    """`DIGITS` significant digits, large values in full with thousands separators (-15,872, not -1.587e+04)."""
    value = float(value)
    if math.isfinite(value) and abs(value) >= 10 ** DIGITS:
        return f"{value:,.0f}"
    return f"{value:.{DIGITS}g}"


def _text(value, max_chars: int) -> str:
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(rounded(to_jsonable(value)), ensure_ascii=False, sort_keys=True, default=str)
    if len(text) > max_chars:
        return html.escape(text[:max_chars]) + f'<span class="cut"> … [{len(text) - max_chars} more characters]</span>'
    return html.escape(text)


def _invalid(info: dict) -> str:
    flag = info.get("invalid_action")
    if not flag:
        return ""
    return flag if isinstance(flag, str) else "invalid"


def _env_family(env_id) -> str | None:
    from shopsim.envs import family_of
    from shopsim.errors import ShopsimError

    try:
        return family_of(str(env_id))
    except ShopsimError:  # an env of another package: no family, the generic view
        return None


def episode_success(t: Trajectory) -> bool | None:
    """The episode's success, or None where success is not defined (a cost env, or no ``success`` in the info)."""
    if _env_family(t.env_id) in NO_SUCCESS_FAMILIES or "success" not in t.final_info:
        return None
    return t.success


def _strategy(t: Trajectory) -> str:
    """The strategy instruction the episode ran under; "none" for a Shopping episode reset without one (it ran
    free), "" where the env has no strategies."""
    return str(t.strategy or ("none" if _env_family(t.env_id) == "shopping" else ""))


def task_lines(t: Trajectory) -> list[str]:
    """The task statement of a text-observation episode: the leading `TASK_PREFIXES` lines of its first
    observation (empty for other observations)."""
    first = t.turns[0].observation if t.turns else None
    if not isinstance(first, str):
        return []
    out = []
    for line in first.splitlines():
        if not line.startswith(TASK_PREFIXES):
            break
        out.append(line)
    return out


def _without(observation, lines: set[str]):
    if not lines or not isinstance(observation, str):
        return observation
    return "\n".join(line for line in observation.splitlines() if line not in lines)


# ----------------------------------------------------------------------------------------------- Replenishment
def inventory_series(t: Trajectory) -> dict[str, list] | None:
    """Per-period totals over SKUs of a Replenishment episode, or None if its turns are not Replenishment's.

    ``stock``: on-hand units at the start of the period (negative = backlog); ``ordered``: units ordered
    (``order · quantity``); ``demand``: that period's demand, read from the next observation's newest past demand
    (NaN in the last period, whose next observation is not stored); ``cost``: the period's cost;
    ``orders_by_sku``: {SKU index: units} of the SKUs ordered."""
    out: dict[str, list] = {"stock": [], "ordered": [], "demand": [], "cost": [], "orders_by_sku": []}
    for j, turn in enumerate(t.turns):
        obs, act = turn.observation, turn.action
        if not (isinstance(obs, dict) and "on_hand" in obs and isinstance(act, dict) and "quantity" in act):
            return None
        units = [float(o) * float(q) for o, q in zip(act.get("order", [1] * len(act["quantity"])), act["quantity"],
                                                     strict=False)]
        nxt = t.turns[j + 1].observation if j + 1 < len(t.turns) else None
        demand = (sum(float(row[-1]) for row in nxt["past_demand"])
                  if isinstance(nxt, dict) and len(nxt.get("past_demand", ())) else float("nan"))
        out["stock"].append(sum(float(v) for v in obs["on_hand"]))
        out["ordered"].append(sum(units))
        out["demand"].append(demand)
        out["cost"].append(float((turn.info or {}).get("cost", -turn.reward)))
        out["orders_by_sku"].append({i: u for i, u in enumerate(units) if u > 0})
    return out


def inventory_chart(series: dict[str, list], n_skus: int) -> str:
    """An inline SVG (matplotlib) of `inventory_series`: stock, demand and orders per period above, cost below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    periods = list(range(len(series["stock"])))
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "shopsim"}):  # text as text; stable ids
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 3.6), sharex=True, height_ratios=(2.2, 1))
        top.bar(periods, series["ordered"], width=0.8, color="#f0b04a", alpha=0.7, label="ordered")
        top.step(periods, series["stock"], where="post", color="#3b6fb6", label="stock (on hand; < 0 backlog)")
        top.plot(periods, series["demand"], color="#555555", lw=0.9, label="demand")
        top.axhline(0, color="#999999", lw=0.6)
        top.set_ylabel(f"units, {n_skus} SKUs", fontsize=8)
        top.legend(fontsize=7, ncols=3, loc="upper right", frameon=False)
        bottom.plot(periods, series["cost"], color="#b03030", lw=0.9)
        bottom.set_ylabel("cost", fontsize=8)
        bottom.set_xlabel("period", fontsize=8)
        for ax in (top, bottom):
            ax.tick_params(labelsize=7)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # drop the XML prolog and doctype: the SVG is inlined into the HTML page


def _inventory_body(t: Trajectory, series: dict[str, list], chart: bool) -> str:
    n_skus = len(t.turns[0].observation["on_hand"])
    rows = []
    for j, turn in enumerate(t.turns):
        by_sku = ", ".join(f"#{i}: {_num(u)}" for i, u in series["orders_by_sku"][j].items())
        demand = series["demand"][j]
        rows.append(f"<tr><td>{j}</td><td>{_num(series['stock'][j])}</td><td>{_num(series['ordered'][j])}</td>"
                    f"<td>{'—' if math.isnan(demand) else _num(demand)}</td><td>{_num(series['cost'][j])}</td>"
                    f"<td>{_num(turn.reward)}</td><td style=\"text-align:left\">{html.escape(by_sku)}</td></tr>")
    figure = (f'<div class="chart">{inventory_chart(series, n_skus)}</div>' if chart
              else '<p class="muted">chart left out (more episodes than --max-charts)</p>')
    return (f'{figure}<p class="muted">per period, summed over the {n_skus} SKUs; demand is read from the next '
            "period's observation</p><table class=\"periods\"><thead><tr><th>period</th><th>stock</th>"
            "<th>ordered</th><th>demand</th><th>cost</th><th>reward</th><th>orders by SKU</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


# ------------------------------------------------------------------------------------------------------ page
def _turn_table(t: Trajectory, max_chars: int, hide: set[str]) -> str:
    esc = html.escape
    rows = []
    for j, turn in enumerate(t.turns):
        info = {k: v for k, v in (turn.info or {}).items() if k not in _HIDDEN_INFO}
        bad = _invalid(info)
        flags = " ".join(f for f, on in (("terminated", turn.terminated), ("truncated", turn.truncated)) if on)
        tokens = f'<div class="muted">{len(turn.action_ids)} tokens</div>' if turn.action_ids else ""
        rows.append(
            f'<tr class="turn"><td>{j}</td><td><pre>{_text(_without(turn.observation, hide), max_chars)}</pre></td>'
            f"<td><pre>{_text(turn.action, max_chars)}</pre>{tokens}</td><td>{_num(turn.reward)}</td>"
            f'<td class="{"invalid" if bad else ""}">{esc(bad)}</td><td>{esc(flags)}</td>'
            f"<td><pre>{_text(info, max_chars)}</pre></td></tr>")
    cols = "".join(f'<col class="{c}">' for c in ("n", "obs", "act", "rew", "inv", "end", "info"))
    return (f"<table><colgroup>{cols}</colgroup><thead><tr><th>#</th><th>observation</th>"
            f"<th>action</th><th>reward</th><th>invalid</th><th>end</th><th>info</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _episode_section(i: int, t: Trajectory, max_chars: int, chart: bool = True) -> str:
    esc = html.escape
    success = episode_success(t)
    family = (t.meta or {}).get("family")
    head = (f"<h2>episode {i}: {esc(str(t.env_id))} · task {esc(str(t.task_id))}</h2>"
            f'<p class="muted">split {esc(str(t.split))} · seed {t.seed} · group {esc(str(t.group_id))} · '
            + (f"family {esc(str(family))} · " if family else "")
            + f"strategy {esc(_strategy(t) or '—')} · agent {esc(str(t.agent))} · "
            + ("" if success is None else f"success {'yes' if success else 'no'} · ")
            + f"score {_num(t.score)} · return {_num(t.total_reward)}</p>")
    task = task_lines(t)
    if task:
        head += f'<p class="task">{esc(chr(10).join(task))}</p>'
    metrics = t.final_info.get("episode_metrics") or {}
    if metrics:
        head += f'<p class="muted">episode metrics: {_text(metrics, 2000)}</p>'
    series = inventory_series(t)
    body = _inventory_body(t, series, chart) if series else _turn_table(t, max_chars, set(task))
    return f'<section class="episode" data-i="{i}" hidden>{head}{body}</section>'


def render_viewer(trajectories: Sequence[Trajectory], *, title: str = "shopsim trajectories",
                  max_chars: int = 4000, max_episodes: int | None = None, max_charts: int = 50) -> str:
    """The viewer page for `trajectories` (the first `max_episodes` if given; the first `max_charts`
    Replenishment episodes get a chart)."""
    esc = html.escape
    trajs = list(trajectories)[: max_episodes or None]
    items, sections = [], []
    charts = 0
    for i, t in enumerate(trajs):
        success = episode_success(t)
        cls, ok = ("", "—") if success is None else ("win", "yes") if success else ("fail", "no")
        family = (t.meta or {}).get("family") or ""
        strategy = _strategy(t)
        items.append(
            f'<tr class="ep {cls}" data-i="{i}"><td>{i}</td><td>{esc(str(t.task_id))}</td><td>{esc(str(family))}</td>'
            f"<td>{t.seed}</td><td>{esc(strategy)}</td><td>{esc(str(t.agent or ''))}</td><td>{t.num_turns}</td>"
            f'<td>{_num(t.total_reward)}</td><td>{_num(t.score)}</td><td class="ok">{ok}</td></tr>')
        chart = charts < max_charts
        charts += chart and _env_family(t.env_id) == "inventory"
        sections.append(_episode_section(i, t, max_chars, chart=chart))
    envs = sorted({str(t.env_id) for t in trajs})
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{_CSS}</style></head><body><div id=\"list\"><h1>{esc(title)}</h1>"
            f'<p class="muted">{len(trajs)} episodes · {esc(", ".join(envs))}</p>'
            f'<p><input id="q" placeholder="filter (task, family, agent, strategy...)"> '
            f'<label><input id="fails" type="checkbox" style="width:auto"> failures only</label></p>'
            f"<table><thead><tr><th>#</th><th>task</th><th>family</th><th>seed</th><th>strategy</th><th>agent</th>"
            f"<th>turns</th><th>return</th><th>score</th><th>success</th></tr></thead><tbody>{''.join(items)}</tbody>"
            f'</table></div><div id="detail">{"".join(sections) or "<p>no episodes</p>"}</div>'
            f"<script>{_JS}</script></body></html>\n")


def read_dataset(path: str | Path) -> list[Trajectory]:
    """Trajectories from a shopsim Parquet dataset (raises `DatasetError` if it is missing or not one)."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such dataset; write one with `shopsim rollout ... --out {path.name}`")
    from shopsim.datasets import read_trajectories

    return read_trajectories(path)


def write_viewer(dataset: str | Path, out: str | Path, **kwargs) -> Path:
    """Read `dataset` and write its viewer page to `out` (atomically)."""
    from shopsim.paths import write_text_atomic

    trajs = read_dataset(dataset)
    kwargs.setdefault("title", f"shopsim trajectories: {Path(dataset).name}")
    return write_text_atomic(out, render_viewer(trajs, **kwargs))
