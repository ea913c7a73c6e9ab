"""One record per env (`shopsim.envs.record.EnvRecord`, the shipped ones in `shopsim.envs.records`): the record is the
one place an env is described, so an env's id is named in at most `MAX_MODULES` modules of the packages; every field
of every shipped record points at something that exists; the tables the app reads are derived from the records."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

import pytest

import shopsim.envs
from shopsim.envs import RECORDS, all_env_ids, env_record, make, register_env
from shopsim.envs.record import (
    METRICS,
    TIERS,
    Budget,
    EnvRecord,
    EvalSize,
    Metric,
    lower_is_better,
    metric,
    register_metric,
)
from shopsim.envs.records import SHIPPED
from shopsim.errors import UnknownNameError
from shopsim.paths import data_dir

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shopsim", "agents", "baselines")
#: at most this many modules of `PACKAGES` may name an env (its id, or its ``Name-vN``, in code or text)
MAX_MODULES = 4


def modules_naming(name: str) -> list[str]:
    """The .py files of `PACKAGES` whose text contains `name`."""
    return sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
                  if name in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("record", SHIPPED, ids=lambda r: r.name)
def test_an_env_is_named_in_at_most_four_modules(record):
    found = modules_naming(record.name)  # the short name also matches every mention of the full id
    assert "shopsim/envs/records.py" in found
    assert len(found) <= MAX_MODULES, (
        f"{record.name} is named in {len(found)} modules (at most {MAX_MODULES}): {', '.join(found)}. Read what the "
        "module needs from the env's record (shopsim.envs.env_record) instead of naming the env")


def test_the_counter_reads_every_module():
    assert modules_naming("SHIPPED: tuple[EnvRecord, ...]") == ["shopsim/envs/records.py"]
    assert len(modules_naming("from __future__ import annotations")) > 100


@pytest.mark.parametrize("record", SHIPPED, ids=lambda r: r.name)
def test_every_shipped_field_points_at_something_real(record):
    assert RECORDS[record.id] is record and record.id in all_env_ids()
    module, _, attr = record.entry_point.partition(":")
    target = importlib.import_module(module)
    assert callable(getattr(target, attr or "parallel_env"))
    assert (data_dir() / record.split_file).is_file()
    assert record.metrics and all(metric(m) is not None for m in record.metrics), record.metrics
    assert record.description and set(record.budgets) <= set(TIERS)
    for scenario in record.scenarios.values():
        assert scenario.env_kwargs and set(scenario.budgets) <= set(TIERS)
    if record.sb3_wrapper:
        module, _, attr = record.sb3_wrapper.partition(":")
        assert callable(getattr(importlib.import_module(module), attr))
    if record.gap_reference:
        import agents

        assert record.gap_reference in agents.available(record.id)


def test_records_registered_with_gymnasium_and_made_by_id():
    import gymnasium

    for record in SHIPPED:
        if record.api == "gymnasium":
            spec = gymnasium.spec(record.id)
            assert spec.entry_point == record.entry_point
            assert spec.max_episode_steps == record.register_kwargs.get("max_episode_steps")
    with pytest.raises(UnknownNameError, match="available: shopsim/"):
        env_record("shopsim/Nope-v0")


def test_budgets_and_protocol_are_read_from_the_record(monkeypatch):
    """The benchmark's budgets are the records' (gathered by tier), a record registered later gets its own budget,
    and the protocol's columns, gap reference and size change with the record alone."""
    from shopsim.app.bench import BUDGETS, budget_for, budget_table
    from shopsim.leaderboard.protocols import load_protocol

    assert budget_table() == BUDGETS
    base = env_record("shopsim/Replenishment-v0")
    assert BUDGETS["standard"][base.id] is base.budgets["standard"]
    assert BUDGETS["standard"][f"{base.id}:seasonal"] is base.scenarios["seasonal"].budgets["standard"]
    budget = Budget(references=("s_S",), algos={"hpo": 2}, tasks=3)
    late = replace(base, id="shopsim/LateInventory-v0", budgets={"tiny": budget}, scenarios={})
    monkeypatch.setitem(RECORDS, late.id, late)
    assert budget_for("tiny", late.id, late.family) is budget
    assert budget_for("quick", late.id, late.family) == BUDGETS["quick"]["*"]
    monkeypatch.setitem(RECORDS, base.id, replace(base, metrics=("fill_rate", "cost"), gap_reference=None,
                                                  protocol_size=EvalSize(tasks=5, tries=2, seeds=(1,))))
    p = load_protocol(base.id)
    assert p.metrics == ("fill_rate", "cost") and p.reference is None
    assert (len(p.task_ids), p.tries, p.seeds) == (5, 2, (1,))


def test_register_env_and_metric_registry(monkeypatch):
    monkeypatch.setattr(shopsim.envs.record, "RECORDS", dict(RECORDS))
    monkeypatch.setattr(shopsim.envs, "RECORDS", shopsim.envs.record.RECORDS)
    monkeypatch.setitem(METRICS, "zz_metric", METRICS["cost"])  # restored afterwards
    import gymnasium

    rec = register_env(EnvRecord("shopsim/TwinWalk-v0", "shopsim.envs.replenishment:ReplenishmentEnv", "inventory",
                                 description="a second id for the replenishment env"))
    try:
        assert env_record(rec.id) is rec and rec.split_file == "splits/TwinWalk-v0.json"
        assert make(rec.id).unwrapped.__class__.__name__ == "ReplenishmentEnv"
    finally:
        gymnasium.registry.pop(rec.id, None)
    register_metric(Metric("zz_metric", "a test metric.", lower_is_better=True))
    assert lower_is_better("zz_metric") and lower_is_better("cost/warehouse_1") and not lower_is_better("return")
    assert metric("success/bundle").interval == "wilson" and metric("pass^2").interval == "bootstrap"
    with pytest.raises(ValueError, match="unknown budget tier"):
        EnvRecord("x/Y-v0", "m:C", "f", description="d", budgets={"huge": Budget()})
