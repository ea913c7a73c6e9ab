"""Customer profiles and purchase histories of the ``personalized_buy`` family (ShopSimulator-style personalization).

A profile is seeded with the task and built around the hidden target so that the target is consistent with it:

* favourite brands: one per category for the target's category and one or two others; the target's category maps to
  the target's brand;
* price sensitivity: a level word ("thrifty", "moderate", "relaxed") and the most the customer spends on each of a
  few product types; for the target's type that is the goal's price ceiling;
* size and colour preferences (every option dimension) for the target's type and one or two other types; for the
  target's type they are the goal's option values;
* a purchase history: three or four past orders of products of the favourite brands, bought with the preferred
  options where offered (the target itself is never in it).

The instruction names only the product type and its must-have features; brand, options and price are what the
profile decides. The agent reads the profile with ``get_profile``, the history with ``get_orders``, and both in the
first observation (`profile_line`, `orders_line`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shopsim.envs.shopping.cache import product as _product
from shopsim.envs.shopping.task_text import price_ceiling

LEVELS = ("thrifty", "moderate", "relaxed")


@dataclass(frozen=True)
class Profile:
    """A customer's preferences (what `get_profile` shows) and purchase history (what `get_orders` shows)."""

    name: str
    brands: tuple[tuple[str, str], ...]
    """(category, favourite brand)"""
    price_sensitivity: str
    max_spend: tuple[tuple[str, float], ...]
    """(product type, the most the customer spends on it)"""
    preferences: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    """(product type, ((option dimension, preferred value), ...))"""
    history: tuple[dict, ...] = field(default=())
    """past orders: {"order_id", "days_ago", "sku", "title", "options", "price"}"""

    def to_dict(self) -> dict:
        return {"name": self.name, "brands": dict(self.brands), "price_sensitivity": self.price_sensitivity,
                "max_spend": dict(self.max_spend), "preferences": {t: dict(p) for t, p in self.preferences},
                "history": [{**h, "options": dict(h["options"])} for h in self.history]}


def _brand_ids(catalog) -> dict[str, np.ndarray]:
    """brand -> product ids (computed once per catalog object)."""
    memo = getattr(catalog, "_brand_index", None)
    if memo is None:
        enc = catalog.column("brand").combine_chunks().dictionary_encode()
        codes = enc.indices.to_numpy()
        names = enc.dictionary.to_pylist()
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
        memo = {n: order[bounds[i]:bounds[i + 1]] for i, n in enumerate(names)}
        catalog._brand_index = memo
    return memo


def _prefs_of(product, rng) -> tuple[tuple[str, str], ...]:
    return tuple((n, vals[int(rng.integers(len(vals)))]) for n, vals in zip(product.option_names,
                                                                            product.option_values, strict=False))


def make_profile(catalog, rng, target, goal, name: str) -> Profile:
    """A profile consistent with `goal` (derived from product `target`), with distractor types and categories."""
    level = LEVELS[int(rng.integers(len(LEVELS)))]
    brands = {target.category: target.brand}
    spend = {goal.product_type: float(goal.price_ceiling)}
    prefs = {goal.product_type: tuple(goal.options)}
    # distractors: other types (their own preferences and spending) and other categories (their favourite brand)
    for _ in range(int(rng.integers(1, 3))):
        other = _product(catalog, int(rng.integers(len(catalog))))
        if other.product_type in prefs:
            continue
        prefs[other.product_type] = _prefs_of(other, rng)
        spend[other.product_type] = price_ceiling(other.price, int(rng.integers(0, 3)))
        brands.setdefault(other.category, other.brand)
    history: list[dict[str, Any]] = []
    same = _brand_ids(catalog).get(target.brand, np.array([], dtype=np.int64))
    same = same[same != target.product_id]
    n_hist = int(rng.integers(3, 5))
    for k in range(n_hist):
        if k < 2 and len(same):  # most past orders come from the favourite brand
            p = _product(catalog, int(same[rng.integers(len(same))]))
        else:
            p = _product(catalog, int(rng.integers(len(catalog))))
            if p.product_id == target.product_id:
                continue
        want = dict(prefs.get(p.product_type, ()))
        opts = {n: (want[n] if want.get(n) in vals else vals[int(rng.integers(len(vals)))])
                for n, vals in zip(p.option_names, p.option_values, strict=False)}
        history.append({"order_id": f"W{int(rng.integers(1_000_000, 10_000_000))}",
                        "days_ago": int(rng.integers(5, 400)), "sku": p.sku, "title": p.title, "options": opts,
                        "price": float(p.price)})
    history.sort(key=lambda h: h["days_ago"])
    return Profile(name, tuple(brands.items()), level, tuple(spend.items()), tuple(prefs.items()), tuple(history))


def profile_line(profile: Profile) -> str:
    """The profile as one line (observation and `get_profile`)."""
    brands = "; ".join(f"{c}: {b}" for c, b in profile.brands)
    spend = "; ".join(f"${x:.2f} on {t}" for t, x in profile.max_spend)
    prefs = "; ".join(f"{t}: " + ", ".join(f"{n} {v}" for n, v in p) for t, p in profile.preferences)
    return (f"{profile.name}. Favourite brands: {brands}. Price sensitivity: {profile.price_sensitivity} (spends at "
            f"most {spend}). Preferences: {prefs}.")


def orders_line(profile: Profile) -> str:
    """The purchase history as one line (observation and `get_orders`)."""
    return " ".join(f"[{h['order_id']}, {h['days_ago']} days ago] {h['title']} ("
                    + (", ".join(f"{n} {v}" for n, v in h["options"].items()) or "no options")
                    + f") ${h['price']:.2f}." for h in profile.history)
