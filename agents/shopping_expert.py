"""Scripted expert for the shopping env (`shopsim.envs.shopping`; it reads the privileged ``info["oracle"]``).

Its episodes are the supervised-fine-tuning data of the language agent, so it acts like a good assistant would, in
the text grammar, and keeps episodes short:

Typical actions per task family:

* find_and_buy: ``search[<attributes> <option values> <type>]`` -> ``click[<sku>]`` (best-looking result;
  ``click[< prev]`` and the next one if the product page lacks an option; ``click[next >]`` if none fits) ->
  ``click[<option value>]`` per option -> ``click[buy now]``
* clarify_and_buy: one ``ask[...]`` per hidden preference (e.g. ``ask[Which color would you like?]``), then as
  find_and_buy
* bundle: per item: ``search`` -> ``click[<sku>]`` -> options -> ``click[add to cart]``; then ``view_cart`` ->
  ``answer[<summary>]`` -> ``click[checkout]``
* personalized_buy: ``get_profile`` -> as find_and_buy, searching ``<brand> <attributes> <option values> <type>``
  and opening only results of the profile's brand
* after_sales: ``list_orders`` -> ``get_order[<id>]`` -> (exchange: ``search[<new title>]``) -> the write
  (``cancel_order`` / ``return_item`` / ``exchange_item``), or none when the policy forbids it ->
  ``answer[<what was done / why not>]`` -> ``finish``; with ``order_refs="title"`` it starts with
  ``get_order["<the item's title>"]`` and an exchange searches ``search["<new title>"]``, both copied with their
  quotes from the request

It opens results judged from the result line alone (type and goal attributes in the title, price within the
ceiling), as a language agent must, and goes back (``click[< prev]``) when the product page shows a missing option.
If no matching product shows up in two result pages or after 6 wrong product pages it searches the target
product's title (a privileged fallback: about 3% of find_and_buy, 1% of clarify_and_buy and 7% of bundle
episodes on the 10k catalog). Options for SFT data that a small LM copies more easily: ``click_by="index"`` opens
a result by its position (``click[#3]``, see the env's ``numbered_results``) instead of its SKU; ``query="span"``
searches ``<attributes> <type>`` only (a contiguous phrase of the instruction) instead of also the option values;
``query="instruction"`` searches the task line itself up to its price clause or clarify hint (a prefix copy; in a
bundle, the current item's ``(k) <request>`` clause; plus the features and option values the customer named when
asked); ``price_clause=True`` ends every search with the price clause ``, and price lower than X dollars`` (as the
task line words it, with the budget the customer named, or in a bundle with the whole budget) that the env's search
turns into a price filter;
``arg_space=True`` writes a blank after the opening bracket (``click[ medium]``, ``search[ i need a ...]``; the env
strips argument blanks, so the action is the same), which with a byte-level BPE tokenizer makes the first argument word
the same token (``Ġmedium``) as in the task line the agent copies it from, instead of a different split (``m``,
``edium``).
Strategy instructions are followed: ``ask_first`` asks before searching,
``confirm_before_buying`` sends an ``answer[...]`` naming the product before buying, ``broad_then_filter`` first
searches the product type alone, ``compare_two`` opens the second-best result and goes back before opening the best
one; ``recommend_directly`` and ``all_in_one_query`` are what the expert does anyway.
"""

from __future__ import annotations

import re

import numpy as np

from agents.base import Decision, ScriptedAgent
from shopsim.envs.records import SHOPPING
from shopsim.envs.shopping.grading import Goal, best_options, satisfies, score_purchase

MAX_PAGES = 2
MAX_VIEWS = 6  # product pages that turned out wrong before the expert falls back to the target's title


def _bundle_items(instruction: str) -> list[str]:
    """The item requests of a bundle task line, "... dollars: (1) a x, with size s; (2) a y. Put them ...", each
    with its number: ["(1) a x, with size s", "(2) a y"]. The number starts the query copied from it, so that a
    language agent finds the next clause by its number rather than by the place of its own previous query."""
    body = instruction.split(". Put them")[0]
    parts = re.split(r"(?=\(\d+\) )", body)[1:]
    return [p.strip().rstrip(";").strip() for p in parts]


def _goal(d: dict) -> Goal:
    return Goal(d["product_type"], tuple(d["attributes"]), tuple(d["options"].items()), d["price_ceiling"],
                d["target_id"], brand=d.get("brand"))


def _question(slot: list[str]) -> str:
    kind, name = slot
    if kind == "option":
        return f"Which {name} would you like?"
    if kind == "attribute":
        return "Is there a feature it must have?"
    return "What is your budget?"


class ShoppingExpert(ScriptedAgent):
    """Oracle policy for every task family of the shopping env (see module docstring)."""

    name = "expert"

    def __init__(self, env_id: str = SHOPPING.id, catalog_size: int | None = None,
                 catalog_seed: int | None = None, click_by: str = "sku", query: str = "full",
                 arg_space: bool = False, order_refs: str = "id", noise: float = 0.0, price_clause: bool = False):
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"noise={noise!r}; give the share of perturbed clicks, in [0, 1)")
        if click_by not in ("sku", "index"):
            raise ValueError(f"click_by={click_by!r}; choose 'sku' or 'index'")
        if query not in ("full", "span", "instruction"):
            raise ValueError(f"query={query!r}; choose 'full' (attributes, option values, type), 'span' or "
                             "'instruction'")
        if order_refs not in ("id", "position", "title"):
            raise ValueError(f"order_refs={order_refs!r}; choose 'id', 'position' (#k, the env's order_refs) or "
                             "'title'")
        self.order_refs = order_refs
        self.env_id = env_id
        self.click_by, self.query, self.arg_space = click_by, query, bool(arg_space)
        self.catalog_size, self.catalog_seed = catalog_size, catalog_seed
        self.noise, self.price_clause = float(noise), bool(price_clause)
        self.state: dict[int, dict] = {}
        self._episode_rng: dict[int, np.random.Generator] = {}
        self._last_wrong: dict[int, bool] = {}

    def seed_episode(self, slot, seed) -> None:
        self._episode_rng[slot] = np.random.default_rng(seed)
        self._last_wrong[slot] = False

    def act(self, observations, infos, slots) -> list[Decision]:
        out = []
        for obs, info, slot in zip(observations, infos, slots, strict=True):
            action = self.act_one(slot, obs, info)
            # never twice in a row: each mistake is followed by the expert's recovery
            wrong = self._perturb(slot, action, info) if self.noise > 0 and not self._last_wrong.get(slot) else None
            self._last_wrong[slot] = wrong is not None
            out.append(Decision(action) if wrong is None else Decision(wrong, extra={"perturbed": True}))
        return out

    def _perturb(self, slot, action, info) -> str | None:
        """With probability `noise`, a wrong click in place of the expert's result or option click (DART, Laskey
        et al. 2017, "DART: Noise Injection for Robust Imitation Learning"): another result, another value of
        the option, or the click's argument garbled by one dropped character (an invalid action). The expert's
        next actions recover from it (back to the results, the right option, the click again), so the SFT data
        shows recovery from the states a learner's own mistakes lead to; the perturbed action itself is
        flagged ``turn.extra["perturbed"]`` and is not trained on (`agents.lm.sft.build_examples`). Only clicks
        are perturbed, never two turns in a row: they leave the expert's episode state as it was, and
        after-sales episodes are left alone."""
        m = re.fullmatch(r"click\[( ?)(.+)\]", action) if isinstance(action, str) else None
        s = info.get("structured", {})
        if m is None or info["oracle"]["family"] == "after_sales" or s.get("page") not in ("results", "item"):
            return None
        rng = self._episode_rng.get(slot, self.rng)
        if rng.random() >= self.noise:
            return None
        pad, arg = m.groups()
        alternatives = []
        if s["page"] == "results" and re.fullmatch(r"#\d+", arg):
            alternatives = [f"#{k + 1}" for k in range(len(s["results"])) if f"#{k + 1}" != arg]
        elif s["page"] == "item":
            for name, values in s["product"]["options"].items():
                labels = [self._label(s["product"], name, v) for v in values]
                if arg in labels:
                    alternatives = [x for x in labels if x != arg]
        if not alternatives or rng.random() < 0.3:
            if len(arg) < 3:
                return None
            cut = int(rng.integers(0, len(arg)))
            return f"click[{pad}{arg[:cut] + arg[cut + 1:]}]"
        return f"click[{pad}{alternatives[int(rng.integers(len(alternatives)))]}]"

    def begin_episode(self, slot, observation, info) -> None:
        self.state[slot] = {"asked": 0, "goal": 0, "pages": 0, "fallback": False, "confirmed": False,
                            "phase": "start", "visited": set(), "broad": False, "compared": False, "peeking": False,
                            "task": (info.get("task_id"), info.get("family"))}

    def _catalog(self, info):
        from shopsim.catalog import load_catalog

        cat = info["oracle"].get("catalog", {})
        size, seed = self.catalog_size or cat.get("size", 10_000), self.catalog_seed or cat.get("seed", 0)
        if cat.get("near_duplicates"):
            from shopsim.catalog.near_duplicates import load_near_duplicates

            return load_near_duplicates(size, seed, cat["near_duplicates"])
        return load_catalog(size, seed)

    def act_one(self, slot, observation, info):
        action = self._act(slot, observation, info)
        if self.arg_space and isinstance(action, str):
            action = re.sub(r"^(\w+)\[(?=\S)", r"\1[ ", action)
        return action

    def _act(self, slot, observation, info):
        st = self.state.get(slot)
        if st is None or st["task"] != (info.get("task_id"), info.get("family")):
            self.begin_episode(slot, observation, info)
            st = self.state[slot]
        oracle = info["oracle"]
        if oracle["family"] == "after_sales":
            return self._after_sales(st, oracle["request"], info)
        if "instruction" not in st and isinstance(observation, str) and observation.startswith("Task: "):
            line = observation.split("\n", 1)[0][len("Task: "):]
            # the request up to its price clause or the clarify hint ("I have more preferences ...")
            st["instruction"] = re.split(r", and price lower than|\.? I have more preferences", line)[0].strip()
        return self._shop(st, oracle, info)

    # ---- shopping families -------------------------------------------------------------------------------
    def _shop(self, st, oracle, info) -> str:
        s = info["structured"]
        hidden = oracle["hidden"]
        if st["asked"] < len(hidden):
            st["asked"] += 1
            return f"ask[{_question(hidden[st['asked'] - 1])}]"
        if oracle["family"] == "personalized_buy" and not st.get("profiled"):
            # read the profile as an assistant would (the oracle already holds it; the SFT data shows the call)
            st["profiled"] = True
            return "get_profile"
        if info.get("strategy") == "ask_first" and st["asked"] == 0:
            st["asked"] = 1
            return "ask[Is there anything else I should know before I search?]"
        goals = [_goal(g) for g in oracle["goals"]]
        bundle = oracle["family"] == "bundle"
        cat = self._catalog(info)
        if bundle:
            todo = [i for i, g in enumerate(goals) if not self._covered(cat, g, s["cart"])]
            if not todo:
                if s["page"] != "cart":
                    return "view_cart"
                if not st["confirmed"]:
                    st["confirmed"] = True
                    return (f"answer[Your {len(s['cart'])} items are in the cart for "
                            f"${s['cart_total']:.2f}, within your budget. Checking out now.]")
                return "click[checkout]"
            gi = todo[0]
        else:
            gi = 0
        goal = goals[gi]
        if st["goal"] != gi:
            st.update(goal=gi, pages=0, fallback=False, phase="start", visited=set())
        page = s["page"]
        strategy = info.get("strategy")
        if page == "item" and st["phase"] == "searched" and st["peeking"]:
            # compare_two: this was the runner-up, opened only to compare; go back to the best one
            st["peeking"] = False
            return "click[< prev]"
        if page == "item" and st["phase"] == "searched":
            prod = s["product"]
            if satisfies(goal, _P(prod, cat), with_price=not bundle) and self._affordable(cat, goals, gi, s, prod):
                want = best_options(goal, _P(prod, cat))
                for name, value in want.items():
                    if s["selected"].get(name) != value:
                        return f"click[{self._label(prod, name, value)}]"
                if bundle:
                    return "click[add to cart]"
                if info.get("strategy") == "confirm_before_buying" and not st["confirmed"]:
                    st["confirmed"] = True
                    return f"answer[I found the {prod['title']} for ${prod['price']:.2f}. I will buy it now.]"
                return "click[buy now]"
            st["visited"].add(prod["product_id"])
            return "click[< prev]"
        if page == "results" and st["phase"] == "searched":
            pick = self._candidate(goal, s, st, cat, goals, gi, bundle)
            if strategy == "compare_two" and not st["compared"] and pick is not None:
                st["compared"] = True
                runner_up = self._candidate(goal, s, st, cat, goals, gi, bundle, skip=1)
                if runner_up is not None:
                    st["peeking"] = True
                    return f"click[{runner_up}]"
            if len(st["visited"]) >= MAX_VIEWS and not st["fallback"]:
                pick = None  # too many near misses: go straight to the fallback search below
                st["pages"] = MAX_PAGES
            if pick is not None:
                return f"click[{pick}]"
            if not st["fallback"] and st["pages"] < MAX_PAGES - 1 and "click[next >]" in info["valid_actions"]:
                st["pages"] += 1
                return "click[next >]"
            if not st["fallback"]:
                st["fallback"] = True
                return f"search[{cat.product(goal.target_id).title.lower()}]"
            return "finish"  # nothing fits even after searching the target's title (not seen in tests)
        if strategy == "broad_then_filter" and not st["broad"]:
            # the product type alone; the phase stays "start", so the next step makes the detailed search
            st["broad"] = True
            return f"search[{goal.product_type}]"
        st["phase"] = "searched"
        st["pages"] = 0
        price = self._price(goal, s.get("budget") if bundle else None)
        if self.query == "instruction" and st.get("instruction"):
            items = _bundle_items(st["instruction"]) if bundle else []
            # a bundle's task line lists its items as "(k) <request>"; search the current item's own request
            query = items[gi] if gi < len(items) else st["instruction"]
            # what the customer named when asked (clarify_and_buy) goes into the query too: a must-have feature,
            # an option value (the index holds option values, so products offering it rank higher)
            told = [a for a in goal.attributes if a not in query]
            if goal.brand:  # personalized_buy: the profile's brand and options are not in the task line
                told = [goal.brand, *told, *(v for _, v in goal.options)]
            else:
                told += [v for _, v in goal.options if v not in query]
            return f"search[{' '.join([query, *told])}{price}]"
        opts = [v for _, v in goal.options] if self.query == "full" else []
        words = [*([goal.brand] if goal.brand else []), *goal.attributes, *opts, goal.product_type]
        return f"search[{' '.join(words)}{price}]"

    def _price(self, goal: Goal, budget: float | None) -> str:
        """With `price_clause`, the task line's own price clause (or the budget the customer named): the env's search
        keeps only results within it, so the first fitting result is usually #1 instead of one found by comparing
        prices. A bundle's item gets the whole cart's `budget`, a copy of the task line's number: it drops the
        products that alone would break the budget."""
        ceiling = budget if budget is not None else goal.price_ceiling
        if not self.price_clause or ceiling is None:
            return ""
        return f", and price lower than {ceiling:.2f} dollars"

    def _candidate(self, goal: Goal, s: dict, st: dict, cat, goals, gi, bundle, skip: int = 0) -> str | None:
        """The result to open, judged only from what the result line shows (title and price), as an LM must:
        the right type in the title, the price within the ceiling (budget), most goal attributes in the title.
        `skip=1` gives the runner-up instead (None when there is none)."""
        ranked = []
        for pos, r in enumerate(s["results"]):
            title = r["title"].lower()
            if r["product_id"] in st["visited"] or goal.product_type not in title:
                continue
            if goal.brand and not title.startswith(goal.brand.lower() + " "):  # titles start with the brand
                continue
            if not bundle and goal.price_ceiling is not None and r["price"] > goal.price_ceiling + 1e-9:
                continue
            if bundle and not self._affordable(cat, goals, gi, s, r):
                continue
            key = (-sum(a.lower() in title for a in goal.attributes), pos)
            ranked.append((key, r["sku"] if self.click_by == "sku" else f"#{pos + 1}"))
        ranked.sort()
        return ranked[skip][1] if len(ranked) > skip else None

    @staticmethod
    def _covered(cat, goal: Goal, cart: list[dict]) -> bool:
        for c in cart:
            p = cat.product(c["product_id"])
            if score_purchase(goal, p, c["options"], with_price=False)[0] >= 1.0 - 1e-9:
                return True
        return False

    @staticmethod
    def _affordable(cat, goals, gi, s, prod) -> bool:
        """Bundle: keep the remaining budget enough for the remaining goals' target prices."""
        if s.get("budget") is None:
            return True
        rest = sum(cat.prices[g.target_id] for i, g in enumerate(goals) if i > gi)
        return s["cart_total"] + prod["price"] + rest <= s["budget"] + 1e-9 or prod["product_id"] == goals[gi].target_id

    @staticmethod
    def _label(prod: dict, name: str, value: str) -> str:
        owners = [n for n, vals in prod["options"].items() if value.lower() in (v.lower() for v in vals)]
        return value if len(owners) == 1 else f"{name}: {value}"

    # ---- after-sales -------------------------------------------------------------------------------------
    def _after_sales(self, st, req, info) -> str:
        """list_orders -> get_order -> (search the new product) -> the gold write or none -> answer -> finish.

        With ``order_refs="position"`` the order, the item and the replacement are named by position (``#k``, as
        the env's ``order_refs="position"`` rendering shows them) and the answer names none of them. With
        ``order_refs="title"`` it opens the order by the item's title (copied from the request, no ``list_orders``)
        and names the item by that title, the order and the replacement by position."""
        kind, oid = req["kind"], req["order_id"]
        by_pos = self.order_refs in ("position", "title")
        phase = st["phase"]
        if phase == "start" and self.order_refs == "title":
            # the product's title, copied from the request, opens the order that holds it (no order list needed)
            cat = self._catalog(info)
            st["title"] = f'"{cat.product(cat.sku_to_id(req["sku"])).title.lower()}"'  # as the request quotes it
            st["phase"] = "titled"
            return f"get_order[{st['title']}]"
        if phase == "start":
            st["phase"] = "listed"
            return "list_orders"
        orders = info["structured"].get("orders") or []
        if phase == "titled":  # the details page is open: name the order by the position its header shows
            k = next(k for k, o in enumerate(orders, 1) if o["order_id"] == oid)
            st["refs"], phase = (f"#{k}", st["title"]), "viewed"
        if phase == "listed":
            st["phase"] = "viewed"
            if by_pos:
                k = next(k for k, o in enumerate(orders, 1) if o["order_id"] == oid)
                j = next(j for j, it in enumerate(orders[k - 1]["items"], 1) if it["sku"] == req["sku"])
                st["refs"] = (f"#{k}", f"#{j}")
            return f"get_order[{st['refs'][0] if by_pos else oid}]"
        order, item = st["refs"] if by_pos else (oid, req["sku"])
        if phase == "viewed":
            if kind == "exchange":
                st["phase"] = "searched"
                title = self._catalog(info).product(req["new_id"]).title.lower()
                # title mode copies the new title with the quotes the request puts around it: then its first word
                # is the same token as in the request (a bare word after the bracket would tokenize differently)
                return f'search["{title}"]' if self.order_refs == "title" else f"search[{title}]"
            st["phase"] = "written"
            if kind == "cancel":
                return f"cancel_order[{order}, {req['reason']}]"
            if kind == "return":
                return f"return_item[{order}, {item}]"
        if phase == "searched":
            st["phase"] = "written"
            new = req["new_sku"]
            if by_pos:  # the replacement's place on the results page (its SKU if the search missed it)
                rows = info["structured"]["results"]
                new = next((f"#{r}" for r, row in enumerate(rows, 1) if row["sku"] == req["new_sku"]), new)
            return f"exchange_item[{order}, {item}, {new}]"
        if phase in ("viewed", "written"):
            st["phase"] = "answered"
            if by_pos:
                msg = {
                    "cancel": "I cancelled your order; the refund goes to your original payment method.",
                    "return": "Your return is accepted; the refund goes to your original payment method.",
                    "exchange": "I exchanged your item for the new one.",
                    "refuse_window": "Sorry, that order was delivered more than 30 days ago, so the item can no "
                                     "longer be returned under our policy.",
                    "refuse_type": "Sorry, an item can only be exchanged for a product of the same type, so I "
                                   "cannot make this exchange.",
                }[kind]
            else:
                msg = {
                    "cancel": f"I cancelled order {oid}; the refund goes to your original payment method.",
                    "return": f"The return of item {req['sku']} from order {oid} is accepted; the refund goes to "
                              "your original payment method.",
                    "exchange": f"I exchanged item {req['sku']} in order {oid} for {req.get('new_sku')}.",
                    "refuse_window": f"Sorry, order {oid} was delivered more than 30 days ago, so the item can no "
                                     "longer be returned under our policy.",
                    "refuse_type": "Sorry, an item can only be exchanged for a product of the same type, so I "
                                   "cannot make this exchange.",
                }[kind]
            return f"answer[{msg}]"
        return "finish"


class _P:
    """Adapter: a structured product dict that quacks like `shopsim.catalog.Product` for grading (the brand, which
    the structured view leaves out, is read from the catalog)."""

    def __init__(self, d: dict, cat=None):
        self.product_type, self.attributes, self.price = d["product_type"], d["attributes"], d["price"]
        self.options = d["options"]
        self.product_id = d["product_id"]
        self.brand = cat.product(d["product_id"]).brand if cat is not None else None
