"""A static trajectory viewer: one self-contained HTML page to read what an agent did, turn by turn.

`render_viewer(trajectories)` lists the episodes (env, task, seed, group, strategy, agent, turns, return, score,
success; filterable by text and by failures only, sortable by clicking a header) and shows, for the selected
episode, every turn: the observation the agent saw, its action, the reward, the terminated/truncated flags, the
invalid-action reason if any, and the rest of the env's info. Long observations are cut at `max_chars` (the cut is
marked). `read_dataset(path)` reads a shopsim Parquet dataset (`shopsim.datasets.read_trajectories`).

The page needs no network; its script sets ``document.body.dataset.ready = "1"`` when done (and
``dataset.jsError`` on a script error) so headless-browser tests can check it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from shopsim.errors import DatasetError
from shopsim.trajectory import Trajectory, to_jsonable

_CSS = """body{font-family:system-ui,sans-serif;margin:0;display:flex;height:100vh;color:#222}
#list{width:38%;overflow:auto;border-right:1px solid #ccc;padding:.6em}#detail{flex:1;overflow:auto;padding:.8em}
table{border-collapse:collapse;width:100%}
th,td{border:1px solid #ddd;padding:.2em .4em;font-size:.82em;vertical-align:top}
th{background:#eee;cursor:pointer}tr.ep{cursor:pointer}tr.ep:hover{background:#eef3fb}tr.ep.sel{background:#d6e4f7}
tr.fail td.ok{color:#b00}tr.win td.ok{color:#070}
pre{white-space:pre-wrap;margin:0;font-size:.95em;max-height:22em;overflow:auto}
td.invalid{background:#fdecec}.cut{color:#a60}.muted{color:#777}input{width:60%}
section.episode table{table-layout:fixed}section.episode pre{word-break:break-word}
col.n{width:3%}col.obs{width:40%}col.act{width:16%}col.rew{width:8%}col.inv{width:9%}col.end{width:7%}col.info{width:17%}"""

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

_HIDDEN_INFO = ("episode_metrics",)


def _text(value, max_chars: int) -> str:
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(to_jsonable(value), ensure_ascii=False, sort_keys=True, default=str)
    if len(text) > max_chars:
        return html.escape(text[:max_chars]) + f'<span class="cut"> … [{len(text) - max_chars} more characters]</span>'
    return html.escape(text)


def _invalid(info: dict) -> str:
    flag = info.get("invalid_action")
    if not flag:
        return ""
    return flag if isinstance(flag, str) else "invalid"


def _episode_section(i: int, t: Trajectory, max_chars: int) -> str:
    esc = html.escape
    rows = []
    for j, turn in enumerate(t.turns):
        info = {k: v for k, v in (turn.info or {}).items() if k not in _HIDDEN_INFO}
        bad = _invalid(info)
        flags = " ".join(f for f, on in (("terminated", turn.terminated), ("truncated", turn.truncated)) if on)
        tokens = f'<div class="muted">{len(turn.action_ids)} tokens</div>' if turn.action_ids else ""
        rows.append(
            f'<tr class="turn"><td>{j}</td><td><pre>{_text(turn.observation, max_chars)}</pre></td>'
            f"<td><pre>{_text(turn.action, max_chars)}</pre>{tokens}</td><td>{turn.reward:.4g}</td>"
            f'<td class="{"invalid" if bad else ""}">{esc(bad)}</td><td>{esc(flags)}</td>'
            f"<td><pre>{_text(info, max_chars)}</pre></td></tr>")
    metrics = t.final_info.get("episode_metrics") or {}
    head = (f"<h2>episode {i}: {esc(str(t.env_id))} · task {esc(str(t.task_id))}</h2>"
            f'<p class="muted">split {esc(str(t.split))} · seed {t.seed} · group {esc(str(t.group_id))} · '
            f"strategy {esc(str(t.strategy or '—'))} · agent {esc(str(t.agent))} · "
            f"success {t.success if 'success' in t.final_info else '—'} · score {t.score:.4g} · "
            f"return {t.total_reward:.4g}</p>")
    if metrics:
        head += f'<p class="muted">episode metrics: {_text(metrics, 2000)}</p>'
    cols = "".join(f'<col class="{c}">' for c in ("n", "obs", "act", "rew", "inv", "end", "info"))
    return (f'<section class="episode" data-i="{i}" hidden>{head}<table><colgroup>{cols}</colgroup>'
            f"<thead><tr><th>#</th><th>observation</th>"
            f"<th>action</th><th>reward</th><th>invalid</th><th>end</th><th>info</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></section>")


def render_viewer(trajectories: Sequence[Trajectory], *, title: str = "shopsim trajectories",
                  max_chars: int = 4000, max_episodes: int | None = None) -> str:
    """The viewer page for `trajectories` (the first `max_episodes` if given)."""
    esc = html.escape
    trajs = list(trajectories)[: max_episodes or None]
    items, sections = [], []
    for i, t in enumerate(trajs):
        # a cost env (Replenishment) reports no success: "—", and the episode is no failure
        cls, ok = ("win", "yes") if t.success else ("fail", "no") if "success" in t.final_info else ("", "—")
        items.append(
            f'<tr class="ep {cls}" data-i="{i}"><td>{i}</td><td>{esc(str(t.task_id))}</td><td>{t.seed}</td>'
            f"<td>{esc(str(t.strategy or ''))}</td><td>{esc(str(t.agent or ''))}</td><td>{t.num_turns}</td>"
            f'<td>{t.total_reward:.4g}</td><td>{t.score:.4g}</td><td class="ok">{ok}</td></tr>')
        sections.append(_episode_section(i, t, max_chars))
    envs = sorted({str(t.env_id) for t in trajs})
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{_CSS}</style></head><body><div id=\"list\"><h1>{esc(title)}</h1>"
            f'<p class="muted">{len(trajs)} episodes · {esc(", ".join(envs))}</p>'
            f'<p><input id="q" placeholder="filter (task, agent, strategy...)"> '
            f'<label><input id="fails" type="checkbox" style="width:auto"> failures only</label></p>'
            f"<table><thead><tr><th>#</th><th>task</th><th>seed</th><th>strategy</th><th>agent</th><th>turns</th>"
            f"<th>return</th><th>score</th><th>success</th></tr></thead><tbody>{''.join(items)}</tbody></table></div>"
            f'<div id="detail">{"".join(sections) or "<p>no episodes</p>"}</div><script>{_JS}</script></body></html>\n')


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
