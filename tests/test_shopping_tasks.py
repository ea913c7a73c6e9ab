"""Shopping-v0 tasks and splits: pure functions of (family, id, catalog); disjoint ids and test targets."""

from __future__ import annotations

import json

import pytest

from shopsim.catalog import load_catalog
from shopsim.envs.shopping.grading import satisfies
from shopsim.envs.shopping.orders import RETURN_WINDOW_DAYS
from shopsim.envs.shopping.tasks import (
    FAMILIES,
    is_test_target,
    make_task,
    pools,
    split_ids,
    split_of,
    splits_manifest,
)
from shopsim.paths import data_dir


@pytest.fixture(scope="module")
def cat():
    return load_catalog(2000, 0)


def test_splits_file_is_current_and_disjoint():
    on_disk = json.loads((data_dir() / "splits" / "Shopping-v0.json").read_text())
    assert on_disk == splits_manifest()
    lo, hi = on_disk["train"]["range"]
    dev, test = set(on_disk["dev"]), set(on_disk["test"])
    assert len(dev) == 200 and len(test) == 500 and not dev & test
    assert all(not lo <= t < hi for t in dev | test)
    assert {split_of(t) for t in dev} == {"dev"} and {split_of(t) for t in test} == {"test"}


def test_test_targets_are_disjoint_from_train_and_dev_targets(cat):
    train_pool, test_pool = pools(cat)
    assert set(train_pool.tolist()).isdisjoint(test_pool.tolist())
    assert 0.05 < len(test_pool) / len(cat) < 0.15
    for fam in FAMILIES:
        for split in ("train", "dev", "test"):
            for tid in list(split_ids(split))[:15]:
                t = make_task(cat, fam, split, tid)
                targets = [g.target_id for g in t.goals]
                if t.orders is not None:
                    targets += [it.product_id for o in t.orders.orders.values() for it in o.items]
                    targets += [t.request["new_id"]] if "new_id" in t.request else []
                assert all(is_test_target(cat, p) == (split == "test") for p in targets), (fam, split, tid)


def test_task_is_a_pure_function_of_family_and_id(cat):
    for fam in FAMILIES:
        a, b = make_task(cat, fam, "train", 42), make_task(cat, fam, "train", 42)
        assert a.instruction == b.instruction and a.oracle() == b.oracle()
        assert make_task(cat, fam, "train", 43).instruction != a.instruction


def test_goals_are_satisfiable_and_instructions_match(cat):
    for tid in range(30):
        t = make_task(cat, "find_and_buy", "train", tid)
        g = t.goals[0]
        assert satisfies(g, cat.product(g.target_id))
        assert g.product_type in t.instruction and f"{g.price_ceiling:.2f}" in t.instruction
        assert all(a in t.instruction and v in t.instruction for a in g.attributes for _, v in g.options)
        c = make_task(cat, "clarify_and_buy", "train", tid)
        assert 1 <= len(c.hidden) <= 3 and c.patience == len(c.hidden) + 2
        gc = c.goals[0]
        for kind, name in c.hidden:
            if kind == "option":
                assert f"{name} {dict(gc.options)[name]}" not in c.instruction
            if kind == "price":
                assert "price lower than" not in c.instruction
        b = make_task(cat, "bundle", "train", tid)
        assert 2 <= len(b.goals) <= 4 and len({g.product_type for g in b.goals}) == len(b.goals)
        assert sum(cat.prices[g.target_id] for g in b.goals) <= b.budget


def test_after_sales_requests_follow_or_break_the_policy_as_labelled(cat):
    kinds = set()
    for tid in range(60):
        t = make_task(cat, "after_sales", "train", tid)
        r = t.request
        kinds.add(r["kind"])
        o = t.orders.orders[r["order_id"]]
        titles = [it.title for od in t.orders.orders.values() for it in od.items]
        assert len(titles) == len(set(titles))  # the customer's wording names exactly one item
        item = next(it for it in o.items if it.sku == r["sku"])
        assert f'"{item.title.lower()}"' in t.instruction
        if r["kind"] == "cancel":
            assert o.status in ("pending", "processing")
        else:
            assert o.status == "delivered"
            inside = o.days_since_delivery <= RETURN_WINDOW_DAYS
            assert inside == (r["kind"] != "refuse_window")
        if r["kind"] in ("exchange", "refuse_type"):
            new = cat.product(r["new_id"])
            assert (new.product_type == item.product_type) == (r["kind"] == "exchange")
            assert f'"{new.title.lower()}"' in t.instruction
    assert kinds == {"cancel", "return", "exchange", "refuse_window", "refuse_type"}
