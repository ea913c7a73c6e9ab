"""Task families and splits of the shopping env: a task is a pure function of (family, task id, catalog).

Families (docs/envs.md):

* find_and_buy — goal: one product: type, 1-3 attributes, every option of a real catalog product, a price ceiling;
  reward: WebShop partial credit (`grading.score_purchase`)
* clarify_and_buy — goal: the same, but 1-3 constraints (options, one attribute, the price ceiling) are hidden; the
  customer reveals one per relevant question; reward: the same; 0 if the customer runs out of patience
* bundle — goal: 2-4 products of different types (attributes + options) under one total budget; reward: mean item
  score × budget satisfied (`grading.score_bundle`)
* after_sales — goal: cancel / return / exchange an item of one of the customer's orders, or refuse a request that
  breaks the policy; reward: binary on the final order database (`orders.grade`)
* personalized_buy — goal: one product whose type and must-have features the instruction names, while the brand,
  every option and the price ceiling come from the customer's profile (`profiles`: favourite brands, price
  sensitivity, size and colour preferences, purchase history); reward: the purchase score with the brand as one more
  constraint. Not in the default mix (``family="personalized_buy"``).

**Splits.** Task ids live in disjoint ranges: train ``[0, 1_000_000)``, dev ``1_000_000 + i``, test
``2_000_000 + i``; the lists used for evaluation are in the record's split file (``data/splits/<Name-vN>.json``).
Target products are partitioned by a hash of the product id: products with ``h(id) % 10 == 0`` are targets only of
test tasks, the rest only of train/dev tasks, so the test split asks for products training never targeted. The task
RNG is seeded with ``(family, task_id, catalog size, catalog seed)`` only; the reset seed drives the episode's own
randomness (customer phrasing), never the task.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from shopsim.envs.records import SHOPPING
from shopsim.envs.shopping.cache import product as _product
from shopsim.envs.shopping.grading import Goal
from shopsim.envs.shopping.orders import CANCEL_REASONS, RETURN_WINDOW_DAYS, Item, Order, OrderDB
from shopsim.envs.shopping.paraphrase import paraphrase
from shopsim.envs.shopping.profiles import Profile, make_profile
from shopsim.envs.shopping.task_text import describe, price_ceiling, slot_label
from shopsim.errors import ConfigError
from shopsim.paths import data_dir

#: the default mix: without a family, task id t is of family FAMILIES[t % 4] (unchanged since v0)
FAMILIES = ("find_and_buy", "clarify_and_buy", "bundle", "after_sales")
#: every family; the ones after the default mix are chosen by name only (``family=...``)
ALL_FAMILIES = (*FAMILIES, "personalized_buy")
SPLITS = ("train", "dev", "test")
#: template: WebShop-style, every value verbatim; paraphrase: seeded rewording (`paraphrase`), the same task
INSTRUCTION_STYLES = ("template", "paraphrase")
TRAIN_RANGE = (0, 1_000_000)
DEV_BASE, TEST_BASE = 1_000_000, 2_000_000
N_DEV, N_TEST = 200, 500
TEST_SHARE = 10  # one product in TEST_SHARE is a test-only target
ENV_ID = SHOPPING.id


@lru_cache(maxsize=1)
def templates() -> dict:
    return json.loads((data_dir() / "shopping" / "templates.json").read_text())


def split_of(task_id: int) -> str | None:
    """The split a task id belongs to (None if it is in no split)."""
    if TRAIN_RANGE[0] <= task_id < TRAIN_RANGE[1]:
        return "train"
    if DEV_BASE <= task_id < DEV_BASE + N_DEV:
        return "dev"
    if TEST_BASE <= task_id < TEST_BASE + N_TEST:
        return "test"
    return None


def split_ids(split: str) -> range:
    if split == "train":
        return range(*TRAIN_RANGE)
    if split == "dev":
        return range(DEV_BASE, DEV_BASE + N_DEV)
    if split == "test":
        return range(TEST_BASE, TEST_BASE + N_TEST)
    raise ConfigError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")


def splits_manifest() -> dict:
    """The content of the env's split file (written by `write_splits`)."""
    return {"env_id": ENV_ID, "train": {"range": list(TRAIN_RANGE)}, "dev": list(split_ids("dev")),
            "test": list(split_ids("test")), "eval_seeds": [0, 1, 2], "families": list(FAMILIES),
            "named_families": list(ALL_FAMILIES[len(FAMILIES):]),
            "note": "task = f(family, task_id, catalog); pass family via env kwargs or reset options; "
                    "test target products are disjoint from train/dev targets; families = the default mix "
                    "(family = families[task_id % 4]); named_families run on the same ids when named"}


def write_splits() -> None:
    path = data_dir() / SHOPPING.split_file
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in splits_manifest().items()]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


def _mix(x: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64 of the product ids (vectorised, stable across platforms)."""
    z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15) * np.uint64(seed + 1))
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_POOLS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def pools(catalog) -> tuple[np.ndarray, np.ndarray]:
    """(train/dev target ids, test target ids) for a catalog; computed once per catalog per process."""
    key = (catalog.size, catalog.seed, id(catalog))
    if key not in _POOLS:
        # a near-duplicate catalog (`shopsim.catalog.near_duplicates`) draws targets among its cluster heads only
        heads = getattr(catalog, "cluster_heads", None)
        ids = np.arange(len(catalog), dtype=np.int64) if heads is None else np.asarray(heads, dtype=np.int64)
        test = (_mix(ids, catalog.seed) % np.uint64(TEST_SHARE)) == 0
        _POOLS[key] = (ids[~test], ids[test])
    return _POOLS[key]


def is_test_target(catalog, product_id: int) -> bool:
    return bool(_mix(np.array([product_id]), catalog.seed)[0] % np.uint64(TEST_SHARE) == 0)


@dataclass
class Task:
    """Everything that defines one task (immutable during an episode; the env copies the order database)."""

    family: str
    split: str
    task_id: int
    instruction: str
    goals: list[Goal]
    hidden: tuple[tuple[str, str], ...] = ()
    """clarify_and_buy: hidden slots, ("option", dim) | ("attribute", value) | ("price", "")."""
    budget: float | None = None
    patience: int = 3
    customer: str = ""
    request: dict = field(default_factory=dict)
    orders: OrderDB | None = None
    profile: Profile | None = None
    """personalized_buy: the customer's profile and purchase history."""

    def oracle(self) -> dict:
        """Privileged view for scripted experts (``info["oracle"]``)."""
        out: dict[str, Any] = {"family": self.family, "goals": [g.to_dict() for g in self.goals],
               "hidden": [list(h) for h in self.hidden], "budget": self.budget}
        if self.request:
            out["request"] = {k: v for k, v in self.request.items()}
        if self.profile is not None:
            out["profile"] = self.profile.to_dict()
        return out


def _pick_goal(rng, product, n_attr_max: int = 3, with_price: bool = True) -> Goal:
    attrs = list(product.attributes)
    k = int(rng.integers(1, min(n_attr_max, len(attrs)) + 1))
    pick = sorted(rng.choice(len(attrs), size=k, replace=False).tolist())
    opts = tuple((n, vals[int(rng.integers(len(vals)))]) for n, vals in zip(product.option_names,
                                                                            product.option_values, strict=False))
    ceiling = price_ceiling(product.price, int(rng.integers(0, 3))) if with_price else None
    return Goal(product.product_type, tuple(attrs[i] for i in pick), opts, ceiling, int(product.product_id))


def _goal_for(catalog, rng, product, **kw) -> Goal:
    """`_pick_goal`, plus, on a near-duplicate catalog, the constraints that tell the target's cluster apart (the
    attributes and option value its siblings change; the price is in every one-item goal anyway)."""
    goal = _pick_goal(rng, product, **kw)
    cluster = getattr(catalog, "clusters", {}).get(int(product.product_id))
    if cluster is None:
        return goal
    need = set(goal.attributes) | set(cluster["attributes"])
    attrs = tuple(a for a in product.attributes if a in need)
    opts = goal.options
    if cluster["option"] is not None:
        dim, value = cluster["option"]
        opts = tuple((n, value if n == dim else v) for n, v in opts)
    return Goal(goal.product_type, attrs, opts, goal.price_ceiling, goal.target_id)


def make_task(catalog, family: str, split: str, task_id: int, instruction_style: str = "template") -> Task:
    """Build task `task_id` of `family` on `catalog` (deterministic; see module docstring).

    ``instruction_style="paraphrase"`` rewords the instruction (`paraphrase`) with its own RNG, so the goal, hidden
    slots and grading are those of the template task."""
    if instruction_style not in INSTRUCTION_STYLES:
        raise ConfigError(f"instruction_style={instruction_style!r}; choose one of {', '.join(INSTRUCTION_STYLES)}")
    if family not in ALL_FAMILIES:
        raise ConfigError(f"unknown task family {family!r}; choose one of {', '.join(ALL_FAMILIES)}")
    if split_of(task_id) != split:
        raise ConfigError(f"task id {task_id} is not in split {split!r} (train ids are {TRAIN_RANGE[0]}.."
                          f"{TRAIN_RANGE[1] - 1}, dev {DEV_BASE}+0..{N_DEV - 1}, test {TEST_BASE}+0..{N_TEST - 1})")
    rng = np.random.default_rng(np.random.SeedSequence(
        [ALL_FAMILIES.index(family), int(task_id), int(catalog.size), int(catalog.seed), 0x5E0]))
    pool = pools(catalog)[1 if split == "test" else 0]
    tpl = templates()
    opener = tpl["openers"][int(rng.integers(len(tpl["openers"])))]
    # the paraphrase draws from its own stream: the task (goal, hidden slots) is the same in both styles
    say = describe
    if instruction_style == "paraphrase":
        prng = np.random.default_rng(np.random.SeedSequence(
            [ALL_FAMILIES.index(family), int(task_id), int(catalog.size), int(catalog.seed), 0x9A2]))

        def say(goal, hidden=(), with_price=True):
            return paraphrase(goal, prng, hidden, with_price)
    if family in ("find_and_buy", "clarify_and_buy"):
        product = _product(catalog, int(pool[rng.integers(len(pool))]))
        goal = _goal_for(catalog, rng, product)
        if family == "find_and_buy":
            return Task(family, split, task_id, f"{opener} {say(goal)}", [goal], patience=3)
        slots = [("option", n) for n, _ in goal.options] + [("attribute", goal.attributes[-1]), ("price", "")]
        k = int(rng.integers(1, min(3, len(slots)) + 1))
        hidden = tuple(slots[i] for i in sorted(rng.choice(len(slots), size=k, replace=False).tolist()))
        hint = tpl["clarify_hint"].format(slots=", ".join(slot_label(s) for s in hidden))
        text = f"{opener} {say(goal, hidden)}. {hint}"
        return Task(family, split, task_id, text, [goal], hidden=hidden, patience=len(hidden) + 2)
    if family == "bundle":
        return _bundle(catalog, split, task_id, rng, pool, tpl, say)
    if family == "personalized_buy":
        return _personalized(catalog, split, task_id, rng, pool, opener, say)
    return _after_sales(catalog, split, task_id, rng, pool, tpl)


def _bundle(catalog, split, task_id, rng, pool, tpl, say=describe) -> Task:
    n = int(rng.integers(2, 5))
    goals: list[Goal] = []
    types: set[str] = set()
    while len(goals) < n:
        p = _product(catalog, int(pool[rng.integers(len(pool))]))
        if p.product_type in types:
            continue
        types.add(p.product_type)
        goals.append(_goal_for(catalog, rng, p, n_attr_max=2, with_price=False))
    total = sum(catalog.prices[g.target_id] for g in goals)
    budget = float(math.ceil(total * float(rng.uniform(1.1, 1.3)) / 5.0) * 5.0)
    opener = tpl["bundle_openers"][int(rng.integers(len(tpl["bundle_openers"])))]
    items = "; ".join(f"({i + 1}) {say(g, with_price=False)}" for i, g in enumerate(goals))
    text = f"{opener}, total budget {budget:.2f} dollars: {items}. Put them in the cart and check out once."
    return Task("bundle", split, task_id, text, goals, budget=budget, patience=3)


PERSONALIZED_HINTS = (
    "Pick the brand, {dims} and price that fit my profile.",
    "You know my favourite brands, my usual {dims} and what I like to spend; choose accordingly.",
    "Go by my profile for the brand, {dims} and budget.",
)


def _personalized(catalog, split, task_id, rng, pool, opener, say) -> Task:
    """personalized_buy: the instruction names type + features; brand, options and price come from the profile."""
    product = _product(catalog, int(pool[rng.integers(len(pool))]))
    g = _goal_for(catalog, rng, product)
    goal = Goal(g.product_type, g.attributes, g.options, g.price_ceiling, g.target_id, brand=product.brand)
    profile = make_profile(catalog, rng, product, goal, _fake_name(int(rng.integers(1 << 31))))
    left_open = tuple(("option", n) for n, _ in goal.options) + (("price", ""),)
    dims = " and ".join(n for n, _ in goal.options) if len(goal.options) <= 2 else \
        ", ".join(n for n, _ in goal.options)
    hint = PERSONALIZED_HINTS[int(rng.integers(len(PERSONALIZED_HINTS)))].format(dims=dims)
    text = f"{opener} {say(goal, left_open)}. {hint}"
    return Task("personalized_buy", split, task_id, text, [goal], patience=3, customer=profile.name,
                profile=profile)


def _fake_name(seed: int) -> str:

    fake = _faker()
    fake.seed_instance(seed)
    return f"{fake.first_name()} {fake.last_name()}"


@lru_cache(maxsize=1)
def _faker():
    from faker import Faker

    return Faker("en_US")


def _after_sales(catalog, split, task_id, rng, pool, tpl) -> Task:
    name = _fake_name(int(rng.integers(1 << 31)))
    kinds = ["cancel", "return", "exchange", "refuse_window", "refuse_type"]
    kind = kinds[int(rng.choice(len(kinds), p=[0.25, 0.25, 0.25, 0.125, 0.125]))]
    n_orders = int(rng.integers(3, 6))
    target_o = int(rng.integers(n_orders))
    orders, seen_titles = [], set()
    target: Order | None = None
    payments = ["paypal", "gift card"] + [f"credit card ending in {int(rng.integers(1000, 10000))}"]
    for k in range(n_orders):
        items: list[Item] = []
        want = int(rng.integers(1, 4))
        for _ in range(want + 10):  # distinct titles, so the customer's wording names one item
            if len(items) == want:
                break
            p = _product(catalog, int(pool[rng.integers(len(pool))]))
            if p.title in seen_titles:
                continue
            seen_titles.add(p.title)
            opts = {nm: vals[int(rng.integers(len(vals)))]
                    for nm, vals in zip(p.option_names, p.option_values, strict=False)}
            items.append(Item(p.sku, int(p.product_id), p.title, p.product_type, opts, float(p.price)))
        if k == target_o:
            status = "processing" if kind == "cancel" and rng.random() < 0.5 else (
                "pending" if kind == "cancel" else "delivered")
        else:
            status = str(rng.choice(["pending", "processing", "shipped", "delivered", "delivered", "cancelled"]))
        days_order = int(rng.integers(1, 5)) if status in ("pending", "processing") else int(rng.integers(3, 120))
        days_deliv = None
        if status == "delivered":
            if k == target_o:
                lo, hi = ((RETURN_WINDOW_DAYS + 1, 90) if kind == "refuse_window" else (1, RETURN_WINDOW_DAYS))
                days_deliv = int(rng.integers(lo, hi + 1))
            else:
                days_deliv = int(rng.integers(1, 90))
            days_order = days_deliv + int(rng.integers(2, 8))
        oid = f"W{int(rng.integers(1_000_000, 10_000_000))}"
        order = Order(oid, status, days_order, days_deliv, payments[int(rng.integers(len(payments)))], items,
                      cancel_reason=None if status != "cancelled" else "no longer needed")
        if k == target_o:
            target = order
        orders.append(order)
    assert target is not None  # target_o < n_orders, so the loop set it
    item = target.items[int(rng.integers(len(target.items)))]
    request: dict[str, Any] = {"kind": kind, "order_id": target.order_id, "sku": item.sku}
    greet = tpl["after_sales_greeting"][int(rng.integers(3))].format(name=name)

    def pick(key):
        return tpl[key][int(rng.integers(len(tpl[key])))]

    if kind == "cancel":
        reason = CANCEL_REASONS[int(rng.integers(2))]
        request["reason"] = reason
        reason_text = tpl["cancel_reason_text"][reason][int(rng.integers(2))]
        text = pick("cancel_request").format(title=item.title.lower(), reason_text=reason_text)
    elif kind in ("return", "refuse_window"):
        text = pick("return_request").format(title=item.title.lower())
    else:
        new = _exchange_target(catalog, rng, pool, item, same_type=(kind == "exchange"))
        request["new_id"], request["new_sku"] = int(new.product_id), new.sku
        # customers write product names in lower case, as every other task line is written
        text = pick("exchange_request").format(title=item.title.lower(), new_title=new.title.lower())
    db = OrderDB(name, orders)
    return Task("after_sales", split, task_id, f"{greet} {text}", [], customer=name, request=request,
                orders=db, patience=3)


def _exchange_target(catalog, rng, pool, item, same_type: bool):
    """A product with a catalog-unique title: same type as `item` (exchange) or another type (refusal)."""
    type_ids = catalog.type_ids[pool]
    t = catalog.product_types.index(item.product_type)
    cand = pool[type_ids == t] if same_type else pool[type_ids != t]
    index = catalog.index()
    for _ in range(50):
        p = _product(catalog, int(cand[rng.integers(len(cand))]))
        if p.product_id == item.product_id:
            continue
        hits = index.search(p.title, k=5)
        if sum(_product(catalog, i).title == p.title for i, _ in hits) == 1:
            return p
    return p
