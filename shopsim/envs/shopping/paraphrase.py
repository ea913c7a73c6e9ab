"""Paraphrased task instructions (``ShoppingEnv(instruction_style="paraphrase")``).

The template instructions state every attribute and option value verbatim ("a waterproof breathable hiking boots,
with size 9 and color brown, and price lower than 120.00 dollars"), so copying the task line into search nearly
solves retrieval. ShopSimulator (ACL 2026) instead uses human-written instructions that avoid the product keywords.
This module writes a seeded paraphrase of the same goal:

* synonyms and descriptive phrases from the taxonomy's ``synonyms`` table (`shopsim.catalog.taxonomy.synonyms`):
  "waterproof" -> "keeps water out", "navy" -> "dark blue", "hiking boots" -> "trekking boots";
* numeric forms for measured values: "5 pack" -> "pack of five", "16 fl oz" -> "16 fluid ounces", "9.5" ->
  "nine and a half", "128gb" -> "128 gigabytes";
* several price forms: "under $20", "less than twenty dollars", "no more than $20.00", "at most 20 dollars";
* reordering: attributes before or after the product noun, options and price in either order, options shuffled.

Only the wording changes: the goal, the hidden slots and the grading are those of the template task (the task RNG
never sees the paraphrase RNG). `verbatim_values` says which of a goal's stated values appear word for word in a
text, the measure `benchmarks.bench_instructions` reports.
"""

from __future__ import annotations

import re

from shopsim.catalog.taxonomy import synonyms
from shopsim.envs.shopping.task_text import article

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
#: probability that a value with synonyms is reworded (the rest stay verbatim, as people sometimes copy words)
P_SYNONYM = 0.85
P_TYPE_SYNONYM = 0.5
_UNITS = [  # (pattern of an option value, wordings; {n} the number, {w} the number in words)
    (r"(\d+) pack", ["pack of {w}", "{w} pack bundle", "set of {w}"]),
    (r"([\d.]+) fl oz", ["{n} fluid ounces", "{n} fluid ounce"]),
    (r"([\d.]+) oz", ["{n} ounces", "{n} ounce"]),
    (r"([\d.]+) lb", ["{n} pounds", "{w} pounds"]),
    (r"([\d.]+) ft", ["{n} feet", "{w} feet"]),
    (r"([\d.]+) inch", ["{n} inches", "{n} inch wide"]),
    (r"([\d.]+) liter", ["{n} litres", "{w} litres"]),
    (r"(\d+) ml", ["{n} milliliters", "{n} millilitres"]),
    (r"(\d+) piece", ["{w} pieces", "{n} pieces"]),
    (r"(\d+) person", ["for {w} people", "sleeps {w}"]),
    (r"(\d+) bags", ["{w} tea bags", "{n} teabags"]),
    (r"(\d+) f", ["{n} degrees fahrenheit", "{n} degrees"]),
    (r"(\d+)gb", ["{n} gigabytes", "{n} gb"]),
    (r"(\d+)tb", ["{n} terabytes", "{w} terabytes"]),
    (r"(\d+)mah", ["{n} milliamp hours", "{n} mah"]),
    (r"(\d+)mm", ["{n} millimeters", "{n} mm"]),
    (r"(\d+)l", ["{n} liters", "{n} litres"]),
    (r"(\d+)x(\d+) (inch|ft)", ["{n} by {m} {unit}"]),
    (r"1080p", ["full hd"]),
    (r"1440p", ["quad hd", "qhd"]),
    (r"(\d+) (\d)/(\d)", ["{w} and {frac}"]),
    (r"(\d+(?:\.5)?)", ["{w}", "{w}"]),
]
_PRICE = ["under ${c:.0f}", "less than {w} dollars", "no more than ${c:.2f}", "at most {c:.0f} dollars",
          "for under {c:.0f} bucks", "below ${c:.0f}"]
_COLOR_DIMS = {"color", "frame color", "lens color", "light color", "shade"}


def number_words(x: float) -> str:
    """English words for 0 <= x < 10000, with ".5" as "and a half" (12.5 -> "twelve and a half")."""
    n, half = int(x), abs(x - int(x) - 0.5) < 1e-9
    if n < 20:
        out = _ONES[n]
    elif n < 100:
        out = _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    elif n < 1000:
        out = _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))
    else:
        out = number_words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + number_words(n % 1000))
    if half:
        out += " and a half"
    elif x != n:
        out = f"{x:g}"
    return out


def _measure(value: str, rng) -> str | None:
    for pattern, forms in _UNITS:
        m = re.fullmatch(pattern, value)
        if m is None:
            continue
        form = forms[int(rng.integers(len(forms)))]
        g = m.groups()
        if "{frac}" in form:
            num, den = int(g[1]), int(g[2])
            frac = {(1, 2): "a half", (1, 4): "a quarter", (3, 4): "three quarters"}.get(
                (num, den), f"{number_words(num)} {'eighths' if num > 1 else 'eighth'}")
            return form.format(w=number_words(int(g[0])), frac=frac)
        if "{m}" in form:
            return form.format(n=g[0], m=g[1], unit={"inch": "inches", "ft": "feet"}[g[2]])
        if not g:
            return form
        x = float(g[0])
        return form.format(n=g[0], w=number_words(x) if x < 10000 else g[0])
    return None


def reword(value: str, rng, p: float = P_SYNONYM) -> str:
    """`value` in other words (a synonym, or a numeric form), or unchanged with probability 1 - p."""
    if rng.random() >= p:
        return value
    alts = synonyms().get(value)
    if alts:
        return alts[int(rng.integers(len(alts)))]
    return _measure(value, rng) or value


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def paraphrase(goal, rng, hidden=(), with_price: bool = True) -> str:
    """The goal in other words (module docstring); hidden slots are left out as in `task_text.describe`."""
    attrs = [reword(a, rng) for a in goal.attributes if ("attribute", a) not in hidden]
    noun = reword(goal.product_type, rng, P_TYPE_SYNONYM)
    if attrs and rng.random() < 0.5:
        head = f"{article(attrs[0])} {' '.join(attrs)} {noun}" if rng.random() < 0.5 else \
            f"{article(attrs[0])} {', '.join(attrs)} {noun}"
    elif attrs:
        head = f"{article(noun)} {noun} that is " + _join(attrs)
    else:
        head = f"{article(noun)} {noun}"
    opts = []
    for name, value in goal.options:
        if ("option", name) in hidden:
            continue
        v = reword(value, rng)
        forms = [f"{name} {v}", f"{v} {name}", f"with {name} {v}"]
        if name in _COLOR_DIMS:
            forms.append(f"in {v}")
        opts.append(forms[int(rng.integers(len(forms)))])
    order = rng.permutation(len(opts)).tolist()
    clauses = []
    if opts:
        clauses.append(_join([opts[i] for i in order]))
    if with_price and goal.price_ceiling is not None and ("price", "") not in hidden:
        c = float(goal.price_ceiling)
        clauses.append(_PRICE[int(rng.integers(len(_PRICE)))].format(c=c, w=number_words(c)))
    if len(clauses) == 2 and rng.random() < 0.5:
        clauses.reverse()
    return head + "".join(f", {c}" for c in clauses)


def _has(text: str, value: str) -> bool:
    return re.search(r"(?<![a-z0-9])" + re.escape(value.lower()) + r"(?![a-z0-9])", text.lower()) is not None


def verbatim_values(goal, text: str, hidden=()) -> tuple[int, int]:
    """(stated attribute and option values of `goal` found word for word in `text`, stated values)."""
    values = [a for a in goal.attributes if ("attribute", a) not in hidden]
    values += [v for n, v in goal.options if ("option", n) not in hidden]
    return sum(_has(text, v) for v in values), len(values)
