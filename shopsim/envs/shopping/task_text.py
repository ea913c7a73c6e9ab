"""The words of a task: the WebShop-style goal description, slot labels, indefinite articles and price ceilings.

Shared by `tasks` (the template instruction), `paraphrase` (the reworded one) and `profiles` (spending limits), so
that none of them imports another for a helper.
"""

from __future__ import annotations

import math

from shopsim.envs.shopping.grading import Goal


def price_ceiling(price: float, j: int) -> float:
    """A ceiling just above `price`: the next multiple of a price-dependent step, plus `j` more steps."""
    step = 5.0 if price < 50 else 10.0 if price < 200 else 50.0
    return (math.floor(price / step) + 1 + j) * step


def article(word: str) -> str:
    """The indefinite article of `word`: "an eco-friendly", "a usb cable", "a one-piece"."""
    w = word.lower()
    if w.startswith(("us", "uni", "use", "uti", "eu", "one")):  # "a usb cable", "a eucalyptus ..."
        return "a"
    return "an" if w[:1] in "aeiou" else "a"


def describe(goal: Goal, hidden=(), with_price: bool = True) -> str:
    """The goal as WebShop-style words, leaving out `hidden` slots: 'a waterproof tent, with color green, ...'."""
    attrs = [a for a in goal.attributes if ("attribute", a) not in hidden]
    s = f"{article(attrs[0] if attrs else goal.product_type)} " + (" ".join(attrs) + " " if attrs else "")
    s += goal.product_type
    opts = [f"{n} {v}" for n, v in goal.options if ("option", n) not in hidden]
    if opts:
        s += ", with " + " and ".join(opts)
    if with_price and goal.price_ceiling is not None and ("price", "") not in hidden:
        s += f", and price lower than {goal.price_ceiling:.2f} dollars"
    return s


def slot_label(slot: tuple[str, str]) -> str:
    return {"option": slot[1], "attribute": "a must-have feature", "price": "budget"}[slot[0]]
