"""Reward rules of the shopping env (purchase partial credit, bundles); after-sales grading lives in `orders`.

**Purchase score** (find_and_buy, clarify_and_buy), WebShop's form (Yao et al. 2022, arXiv 2207.01206, §3.2,
"reward"), with exact matching because the catalog's attributes and options are structured:

    score = r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1)

* ``r_type`` = 1 if the bought product's ``product_type`` equals the goal's, else 0 (WebShop grades type matches
  with title-noun overlap; our types are exact labels, so a wrong type scores 0).
* attribute match: a goal attribute counts when it is, case-insensitively, one of the product's ``attributes``
  (no fuzzy or title matching: titles are built from attributes, so this is the same information).
* option match: a goal option ``(name, value)`` counts when the agent *selected* that value for that option
  dimension before buying (an option left unselected never matches, as in WebShop).
* price: the product's price is at most the ceiling; a price equal to the ceiling counts as within.

Success is ``score == 1``.

personalized_buy goals also name a brand (the profile's favourite for the category): the bought product's
``brand`` equal to it adds one term to the numerator and the denominator, like an attribute.

**Bundle score**: every goal item is graded like a purchase without the price term,
``r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt|) / (|U_att| + |U_opt|)``; the cart lines are assigned to goal items
one-to-one so as to maximise the total (brute force over at most `MAX_CART_LINES` lines); unassigned goal items
score 0 and extra lines cost nothing except through the budget. The bundle score is
``mean(item scores) * 1[cart total <= budget]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import permutations
from typing import Any

MAX_CART_LINES = 8


@dataclass(frozen=True)
class Goal:
    """What the customer wants for one item. `options` keeps the (dimension, value) pairs in catalog order."""

    product_type: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    price_ceiling: float | None
    target_id: int
    """The catalog product the goal was derived from (it satisfies the goal fully)."""
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    brand: str | None = None
    """personalized_buy: the brand the customer's profile asks for (None: any brand)."""

    def to_dict(self) -> dict:
        out = {"product_type": self.product_type, "attributes": list(self.attributes),
               "options": {k: v for k, v in self.options}, "price_ceiling": self.price_ceiling,
               "target_id": int(self.target_id)}
        if self.brand is not None:
            out["brand"] = self.brand
        return out


def score_purchase(goal: Goal, product, chosen: dict[str, str], *, with_price: bool = True) -> tuple[float, dict]:
    """The purchase score of `product` bought with options `chosen` (see module docstring) and its parts."""
    r_type = 1.0 if product.product_type == goal.product_type else 0.0
    have = {a.lower() for a in product.attributes}
    att = sum(1 for a in goal.attributes if a.lower() in have)
    chosen_l = {k.lower(): v.lower() for k, v in chosen.items()}
    opt = sum(1 for k, v in goal.options if chosen_l.get(k.lower()) == v.lower())
    denom = len(goal.attributes) + len(goal.options)
    brand_ok = goal.brand is None or getattr(product, "brand", None) == goal.brand
    if goal.brand is not None:  # the profile's brand is one more constraint, like an attribute
        att_brand = int(brand_ok)
        denom += 1
    else:
        att_brand = 0
    price_ok = goal.price_ceiling is None or product.price <= goal.price_ceiling + 1e-9
    if with_price and goal.price_ceiling is not None:
        num, denom = att + opt + att_brand + int(price_ok), denom + 1
    else:
        num = att + opt + att_brand
    score = r_type * num / denom if denom else r_type
    parts = {"r_type": r_type, "attributes_matched": float(att), "attributes_total": float(len(goal.attributes)),
             "options_matched": float(opt), "options_total": float(len(goal.options)),
             "price_ok": float(price_ok)}
    if goal.brand is not None:
        parts["brand_ok"] = float(brand_ok)
    return float(score), parts


def best_options(goal: Goal, product) -> dict[str, str]:
    """The option choice that maximises the score of `product` for `goal` (what an oracle would click)."""
    offered = {n.lower(): {v.lower(): v for v in vals} for n, vals in product.options.items()}
    out = {}
    for k, v in goal.options:
        vals = offered.get(k.lower(), {})
        if v.lower() in vals:
            out[k] = vals[v.lower()]
    return out


def satisfies(goal: Goal, product, *, with_price: bool = True) -> bool:
    """True if some option choice gives `product` a perfect score for `goal`."""
    return score_purchase(goal, product, best_options(goal, product), with_price=with_price)[0] >= 1.0 - 1e-9


def score_bundle(goals: list[Goal], lines: list[tuple[Any, dict]], budget: float) -> tuple[float, dict]:
    """Bundle score of cart `lines` [(product, chosen options)] against `goals` under `budget`."""
    lines = lines[:MAX_CART_LINES]
    m = [[score_purchase(g, p, c, with_price=False)[0] for p, c in lines] for g in goals]
    best: float = 0.0
    best_assign: tuple[int, ...] = ()
    n = len(lines)
    slots = list(range(n)) + [-1] * len(goals)  # -1 = goal item left unassigned
    for perm in dict.fromkeys(permutations(slots, len(goals))):  # unique, in a fixed order (ties: first wins)
        total = sum(m[i][j] for i, j in enumerate(perm) if j >= 0)
        if total > best + 1e-12 or (not best_assign and total >= best):
            best, best_assign = total, perm
    item_scores = [m[i][j] if j >= 0 else 0.0 for i, j in enumerate(best_assign)] or [0.0] * len(goals)
    total_price = float(sum(p.price for p, _ in lines))
    within = total_price <= budget + 1e-9
    mean = sum(item_scores) / len(goals) if goals else 0.0
    parts = {"item_scores": [float(s) for s in item_scores], "mean_item_score": float(mean),
             "cart_total": round(total_price, 2), "budget": float(budget), "budget_ok": float(within),
             "extra_lines": float(max(0, n - len(goals)))}
    return float(mean * within), parts
