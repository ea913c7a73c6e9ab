"""Table helpers shared by the leaderboard's renderers (`render`: Markdown and CSV, `charts`, `page`): which results
share a table and in what order (`group_by_env`), a table's metric columns (`columns_for`) and its file- and
URL-safe name (`slug`).
"""

from __future__ import annotations

import json
import math
import re

from shopsim.envs import all_env_ids
from shopsim.envs.record import lower_is_better, table_metrics
from shopsim.leaderboard.protocols import record_key, scenarios_of


def slug(key: str) -> str:
    """File- and URL-fragment-safe short name of a table key ("shopsim/Name-v0 [protocol 2]" -> "Name-v0_p2")."""
    name = key.split("/")[-1].replace(" [protocol ", "_p").replace("]", "")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def family(rows: list[dict]) -> str:
    return next((r.get("family") for r in rows if r.get("family")), "") or ""


def columns_for(results: list[dict]) -> list[str]:
    """The env record's table metrics that at least one entry has (in the record's order; `table_metrics`), else
    the first eight metrics the entries have."""
    env_id = next((r.get("env_id") for r in results if r.get("env_id")), "") or ""
    wanted = table_metrics(env_id, family(results))
    present = {m for r in results for m in r.get("metrics", {})}
    cols = [m for m in wanted if m in present]
    if "cost" in cols:  # multi-agent envs: each agent's cost (cost/warehouse_0, ...) right after the total
        per_agent = sorted((m for m in present if m.startswith("cost/")), key=_natural)
        at = cols.index("cost") + 1
        cols[at:at] = per_agent
    return cols or sorted(m for m in present if m != "episodes")[:8]


def _sort_key(row: dict, primary: str | None):
    ok = row.get("status") == "ok"
    value = row.get("metrics", {}).get(primary, {}).get("mean") if primary else None
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (0 if ok else 2, 1, 0.0, row.get("entry", ""))
    signed = value if primary and lower_is_better(primary) else -value
    return (0 if ok else 2, 0, signed, row.get("entry", ""))


def _natural(name: str) -> tuple:
    """Sort key that puts warehouse_2 before warehouse_10."""
    head, _, tail = name.rpartition("_")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def _env_order(key: str) -> tuple[int, int, str]:
    """Registry order (`shopsim.envs.all_env_ids`), each env's scenarios right after it (its record's order),
    unknown ids last."""
    env_id, _, scenario = key.partition(":")
    ids = all_env_ids()
    names = list(scenarios_of(env_id))
    sub = names.index(scenario) + 1 if scenario in names else (0 if not scenario else len(names) + 1)
    return (ids.index(env_id) if env_id in ids else len(ids), sub, key)


def _protocol_key(r: dict) -> str:
    if r.get("protocol_hash"):
        return r["protocol_hash"]
    return json.dumps([r["split"], r.get("task_ids"), r["seeds"], r.get("tries")], sort_keys=True, default=str)


def group_by_env(results: list[dict]) -> dict[str, list[dict]]:
    """One table per env id (in registry order), each sorted best first on the env's first table column. A
    scenario's rows (``scenario`` in the results record; the env record's scenarios) get their own table keyed
    ``<env id>:<scenario>``.

    Only entries evaluated on the same episodes (the same ``protocol_hash``; for older files the same split, task
    ids, eval seeds and tries) share a table: if an env has results from several protocols, each gets its own
    table, keyed ``"<env id> [protocol i]"``, and is never ranked with the others.
    """
    envs: dict[str, dict[str, list[dict]]] = {}
    for r in results:
        envs.setdefault(record_key(r), {}).setdefault(_protocol_key(r), []).append(r)
    out = {}
    for env_id in sorted(envs, key=_env_order):
        protocols = sorted(envs[env_id].values(), key=lambda rows: -len(rows))  # the most used protocol first
        for i, rows in enumerate(protocols, 1):
            cols = columns_for(rows)
            key = env_id if len(protocols) == 1 else f"{env_id} [protocol {i}]"
            out[key] = sorted(rows, key=lambda r: _sort_key(r, cols[0] if cols else None))
    return out
