"""Hand-computed rewards of Shopping-v0: purchase partial credit, price-ceiling edges, bundles, after-sales."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shopsim.envs.shopping.grading import Goal, best_options, satisfies, score_bundle, score_purchase
from shopsim.envs.shopping.orders import Item, Order, OrderDB, apply_gold, grade
from shopsim.envs.shopping.tasks import price_ceiling


@dataclass
class P:
    product_type: str
    attributes: list
    price: float
    options: dict = field(default_factory=dict)
    sku: str = "B0TEST0001"
    product_id: int = 0


GOAL = Goal("hiking boots", ("waterproof", "leather"), (("size", "9"), ("color", "brown")), 120.0, 0)
BOOTS = P("hiking boots", ["Waterproof", "insulated"], 120.0, {"size": ["8", "9"], "color": ["black", "brown"]})


def test_partial_credit_by_hand():
    # 1 of 2 attributes, 1 of 2 options chosen right, price == ceiling (counts): (1 + 1 + 1) / (2 + 2 + 1)
    score, parts = score_purchase(GOAL, BOOTS, {"size": "9", "color": "black"})
    assert score == pytest.approx(3 / 5)
    assert parts["attributes_matched"] == 1 and parts["options_matched"] == 1 and parts["price_ok"] == 1
    # options left unselected never match: (1 + 0 + 1) / 5
    assert score_purchase(GOAL, BOOTS, {})[0] == pytest.approx(2 / 5)
    # matching is case-insensitive on attribute and option values
    assert score_purchase(GOAL, BOOTS, {"Size": "9", "color": "BROWN"})[0] == pytest.approx(4 / 5)


def test_price_ceiling_edges():
    just_over = P("hiking boots", ["waterproof", "leather"], 120.01, BOOTS.options)
    at = P("hiking boots", ["waterproof", "leather"], 120.00, BOOTS.options)
    full = {"size": "9", "color": "brown"}
    assert score_purchase(GOAL, at, full)[0] == 1.0
    assert score_purchase(GOAL, just_over, full)[0] == pytest.approx(4 / 5)
    assert satisfies(GOAL, at) and not satisfies(GOAL, just_over)
    assert satisfies(GOAL, just_over, with_price=False)


def test_wrong_type_scores_zero():
    shoe = P("running shoes", ["waterproof", "leather"], 10.0, BOOTS.options)
    score, parts = score_purchase(GOAL, shoe, {"size": "9", "color": "brown"})
    assert score == 0.0 and parts["r_type"] == 0.0


def test_best_options_only_picks_offered_values():
    assert best_options(GOAL, BOOTS) == {"size": "9", "color": "brown"}
    no_brown = P("hiking boots", ["waterproof", "leather"], 50.0, {"size": ["9"], "color": ["black"]})
    assert best_options(GOAL, no_brown) == {"size": "9"}
    assert not satisfies(GOAL, no_brown)


@pytest.mark.parametrize("price, step_up, ceiling", [
    (29.99, 0, 30.0), (30.0, 0, 35.0), (49.99, 0, 50.0), (49.99, 2, 60.0), (50.0, 0, 60.0),
    (199.99, 0, 200.0), (200.0, 0, 250.0), (0.99, 1, 10.0),
])
def test_price_ceiling_rule(price, step_up, ceiling):
    assert price_ceiling(price, step_up) == ceiling
    assert price <= price_ceiling(price, step_up)


def test_bundle_assignment_budget_and_missing_items():
    g1 = Goal("tent", ("waterproof",), (("color", "green"),), None, 1)
    g2 = Goal("sleeping bag", ("lightweight", "down"), (), None, 2)
    tent = P("tent", ["waterproof"], 100.0, {"color": ["green", "red"]})
    bag = P("sleeping bag", ["lightweight"], 50.0)
    lines = [(bag, {}), (tent, {"color": "green"})]  # cart order differs from goal order
    score, parts = score_bundle([g1, g2], lines, budget=150.0)  # total == budget: within
    assert parts["item_scores"] == [1.0, 0.5]
    assert score == pytest.approx(0.75) and parts["budget_ok"] == 1.0
    assert score_bundle([g1, g2], lines, budget=149.99)[0] == 0.0
    # a missing item scores 0; an extra line costs nothing but budget
    assert score_bundle([g1, g2], [(tent, {"color": "green"})], 1000)[0] == pytest.approx(0.5)
    extra = lines + [(P("tent", [], 1.0, {"color": ["red"]}), {"color": "red"})]
    s, parts = score_bundle([g1, g2], extra, 1000)
    assert s == pytest.approx(0.75) and parts["extra_lines"] == 1.0


def _db():
    items = [Item("B0AAAAAAAA", 1, "Alpha Tent", "tent", {"color": "green"}, 100.0),
             Item("B0BBBBBBBB", 2, "Beta Bag", "sleeping bag", {}, 40.0)]
    return OrderDB("Ann Lee", [Order("W1000001", "delivered", 10, 5, "paypal", items),
                               Order("W1000002", "pending", 1, None, "gift card",
                                     [Item("B0CCCCCCCC", 3, "Gamma Mug", "mug", {}, 9.5)])])


def test_after_sales_grade_by_hand():
    db0 = _db()
    req = {"kind": "return", "order_id": "W1000001", "sku": "B0BBBBBBBB"}
    gold = apply_gold(db0, req, catalog=None)
    assert gold.orders["W1000001"].items[1].status == "returned"
    assert db0.orders["W1000001"].items[1].status == "ordered"  # the initial database is untouched
    good = db0.copy()
    good.return_item("W1000001", "b0bbbbbbbb")
    assert grade(good, gold, req, answered=True, viewed={"W1000001"})[0] == 1.0
    assert grade(good, gold, req, answered=False, viewed={"W1000001"})[0] == 0.0  # must tell the customer
    assert grade(good, gold, req, answered=True, viewed=set())[0] == 0.0  # must have opened the order
    wrong = db0.copy()
    wrong.return_item("W1000001", "B0AAAAAAAA")
    score, parts = grade(wrong, gold, req, answered=True, viewed={"W1000001"})
    assert score == 0.0 and parts["db_match"] == 0.0
    extra = good.copy()
    extra.cancel_order("W1000002", "no longer needed")
    score, parts = grade(extra, gold, req, answered=True, viewed={"W1000001"})
    assert score == 0.0 and parts["wrong_order_writes"] == 1.0
    # a refusal task: the gold database is the initial one
    refuse = {"kind": "refuse_window", "order_id": "W1000001", "sku": "B0AAAAAAAA"}
    assert grade(db0.copy(), apply_gold(db0, refuse, None), refuse, True, {"W1000001"})[0] == 1.0
    assert grade(good, apply_gold(db0, refuse, None), refuse, True, {"W1000001"})[0] == 0.0


def test_order_tools_enforce_hard_rules():
    from shopsim.envs.shopping.orders import ToolError

    db = _db()
    with pytest.raises(ToolError, match="only pending or processing"):
        db.cancel_order("W1000001", "no longer needed")
    with pytest.raises(ToolError, match="only delivered"):
        db.return_item("W1000002", "B0CCCCCCCC")
    with pytest.raises(ToolError, match="no order"):
        db.order_lines("W9")
    db.return_item("#w1000001", "B0AAAAAAAA")
    with pytest.raises(ToolError, match="already returned"):
        db.return_item("W1000001", "B0AAAAAAAA")
    assert db.orders["W1000001"].refunds == [(100.0, "paypal")]
    msg = db.cancel_order("W1000002", "ordered by mistake")
    assert "9.50 refunded to gift card" in msg
