"""Observation text, valid actions, structured view and anchor key of the shopping env (pure functions of env state).

Compact mode (what small language models see; about 400 tokens or fewer at 10 results per page) is, line by line:

    Task: <instruction>
    Strategy: <strategy text>                      (only if a strategy was set)
    Policy: <one-line store policy>                (after_sales only)
    Profile: <profile> / Past orders: <history>    (personalized_buy only)
    Customer said: <revealed preferences>          (only once something was revealed)
    Cart: <n> items, $<total> (budget $<budget>)   (bundle, or any non-empty cart)
    Page: <page header>
    <page body: results, product, cart lines, orders or order details>
    Buttons: [..] [..]                             (clickable buttons of the page)
    Feedback: <what the last action did, the customer's reply, or why it was invalid>

Full mode adds the product description, ratings on result lines, the full written policy, the customer's patience
and the list of valid actions.

Terse mode (``obs_mode="terse"``, for language agents that keep the whole episode in context) states the task,
strategy and policy once, in the first observation of the episode (with ``task_reminder=True`` the task line
again in the observation after each cart change), and shortens the page: result lines are
``#<position> <title> $<price>`` (full title, no SKU: the agent clicks by position; after-sales tasks keep the
``[<sku>]``, since ``exchange_item`` takes it), the product page is
``Product: <title>`` / ``$<price>`` / ``Features: ...`` / option lines, and the product page's fixed buttons are
left out (they never change; ``Buttons:`` appears where the set does: results paging, the cart); the customer's
replies appear once, in the feedback of the turn that asked. Every position, title word, option value and price of
``info["structured"]`` is in the text (tested). Cart lines and after-sales pages keep their SKUs and order ids, which
their tools take as arguments. Text is ASCII only: anything else the agent typed is echoed as ``?``, so the observation
always lies in the observation space's charset.
"""

from __future__ import annotations

import re

from shopsim.envs.shopping.cache import split_price

_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e\n]")
_QUERY_WORD = re.compile(r"[a-z0-9]+")
OBS_CHARSET = "".join(chr(c) for c in range(32, 127)) + "\n"
TITLE_CHARS = 70


def clean(text: str) -> str:
    """Map `text` into the observation charset (non-ASCII and control characters become '?')."""
    if text.isascii() and text.isprintable():
        return text
    return _NOT_PRINTABLE.sub("?", text)


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def option_label(env, name: str, value: str) -> str:
    """How an option value is clicked: the bare value, or 'name: value' when the value is ambiguous."""
    return value if env._option_owner.get(value.lower()) == name else f"{name}: {value}"


def buttons(env) -> list[str]:
    page = env.page
    if page == "results":
        out = []
        if env.page_num > 0:
            out.append("< prev")
        if (env.page_num + 1) * env.results_per_page < len(env.hits):
            out.append("next >")
        return out + ["back to search"]
    if page == "item":
        if env.task.family == "after_sales":
            return ["description", "< prev", "back to search"]
        return ["buy now", "add to cart", "description", "< prev", "back to search"]
    if page == "cart":
        return (["checkout"] if env.cart else []) + ["back to search"]
    if page in ("orders", "order"):
        return ["back to search"]
    return []


def _priced(env) -> str:
    """The price filter a query's price clause set (`cache.split_price`), as the results header states it."""
    ceiling = split_price(env.query)[1]
    return "" if ceiling is None else f" at most ${ceiling:.2f}"


def _terse_page_lines(env) -> list[str] | None:
    page = env.page
    if page == "results":
        n_pages = max(1, -(-len(env.hits) // env.results_per_page))
        lines = [f"Results page {env.page_num + 1}/{n_pages} ({len(env.hits)} hits{_priced(env)}):"]
        # after-sales tools name the replacement by SKU (exchange_item), so those tasks keep it on result lines
        skus = env.task is not None and env.task.family == "after_sales" and env.order_refs == "id"
        lines += [f"#{pos} " + (f"[{sku}] " if skus else "") + f"{title} ${price:.2f}"
                  for pos, (_, sku, title, price) in enumerate(env.page_rows(), 1)]
        return lines
    if page == "item":
        p = env.product
        lines = [f"Product: {p.title}", f"${p.price:.2f}", "Features: " + ", ".join(p.attributes)]
        for name, values in p.options.items():
            chosen = env.selected.get(name)
            opts = " ".join(f"[{option_label(env, name, v)}]" for v in values)
            lines.append(f"{name}: {opts}" + (f" (chosen: {chosen})" if chosen else ""))
        return lines
    return None


def page_lines(env, full: bool, terse: bool = False) -> list[str]:
    page = env.page
    if terse:
        lines = _terse_page_lines(env)
        if lines is not None:
            return lines
    if page == "search":
        return ["Page: search (use search[keywords])"]
    if page == "results":
        n_pages = max(1, -(-len(env.hits) // env.results_per_page))
        lines = [(f'Page: results for "{clean(_short(env.query, 80))}" (page {env.page_num + 1} of {n_pages}, '
                  f"{len(env.hits)} results{_priced(env)})")]
        for pos, (pid, sku, title, price) in enumerate(env.page_rows(), 1):
            line = f"[{sku}] {_short(title, TITLE_CHARS if not full else 200)} ${price:.2f}"
            if getattr(env, "numbered_results", False):
                line = f"#{pos} {line}"
            if full:
                line += f" ({env._rating(pid)})"
            lines.append(line)
        return lines
    if page == "item":
        p = env.product
        lines = [f"Page: product {p.sku}", _short(p.title, 200),
                 f"Price: ${p.price:.2f} | Rating: {p.rating:.1f} ({p.num_reviews} reviews)",
                 "Features: " + ", ".join(p.attributes)]
        for name, values in p.options.items():
            chosen = env.selected.get(name)
            opts = " ".join(f"[{option_label(env, name, v)}]" for v in values)
            lines.append(f"{name}: {opts}" + (f" (chosen: {chosen})" if chosen else ""))
        if full:
            lines.append("Description: " + p.description)
        return lines
    if page == "cart":
        lines = [f"Page: cart ({len(env.cart)} items, total ${env.cart_total():.2f})"]
        for pid, chosen in env.cart:
            opts = ", ".join(f"{k}={v}" for k, v in chosen.items()) or "no options chosen"
            lines.append(f"[{env._sku(pid)}] {_short(env._title(pid), TITLE_CHARS)} ${env.catalog.prices[pid]:.2f}"
                         f" ({opts})")
        return lines
    if page == "orders":
        return ["Page: orders of " + env.db.customer] + env.db.list_orders(env.order_refs)
    if page == "order":
        return ["Page: order details"] + env.db.order_lines(env.order_id, env.order_refs)
    raise AssertionError(page)


def observation(env) -> str:
    full = env.obs_mode == "full"
    terse = env.obs_mode == "terse"
    task = env.task
    # terse: what never changes during an episode is said once, in the first observation
    header = not terse or env.turns == 0
    # task_reminder: the task line again after a cart change (a multi-item request's next item is then near)
    remind = terse and env.task_reminder and env.cart_changed
    lines = ["Task: " + task.instruction] if header or remind else []
    if env.strategy and header:
        lines.append("Strategy: " + env.strategy_text)
    if task.family == "after_sales" and header:
        from shopsim.envs.shopping.orders import POLICY_FULL, POLICY_SHORT

        lines.append(POLICY_FULL if full else POLICY_SHORT)
    if task.profile is not None and header:
        from shopsim.envs.shopping.profiles import orders_line, profile_line

        lines.append("Profile: " + profile_line(task.profile))
        lines.append("Past orders: " + orders_line(task.profile))
    said = [] if terse else env.customer.said()  # terse: each reply is in that turn's feedback
    if said:
        lines.append("Customer said: " + " ".join(said))
    if full and task.family != "after_sales":
        lines.append(f"Customer patience: {env.customer.patience} questions left")
    if task.family == "bundle" or env.cart:
        budget = f" (budget ${task.budget:.2f})" if task.budget else ""
        lines.append(f"Cart: {len(env.cart)} items, ${env.cart_total():.2f}{budget}")
    lines.extend(page_lines(env, full, terse))
    b = buttons(env)
    if b and not (terse and env.page == "item"):
        lines.append("Buttons: " + " ".join(f"[{x}]" for x in b))
    if env.feedback:
        lines.append("Feedback: " + " ".join(env.feedback))
    if full:
        lines.append("Valid actions: " + " | ".join(valid_actions(env)))
    return clean("\n".join(lines))[: env.observation_space.max_length]


def valid_actions(env) -> list[str]:
    """Text form of the actions that make sense now (bounded: page clickables + generic actions).

    Entries ending in ``[...]`` are templates for free-text arguments (fill in the dots)."""
    fam = env.task.family
    out = ["search[...]"]
    page = env.page
    if page == "results":
        out += [f"click[{sku}]" for _, sku, _, _ in env.page_rows()]
    elif page == "item":
        for name, values in env.product.options.items():
            out += [f"click[{option_label(env, name, v)}]" for v in values]
    elif page == "cart":
        out += [f"remove_from_cart[{env._sku(pid)}]" for pid, _ in env.cart]
    elif page == "order":
        o = env.db.orders[env.order_id]
        by_pos = env.order_refs == "position"
        ref = f"#{env.db.position(o.order_id)}" if by_pos else o.order_id
        if o.status in ("pending", "processing"):
            out += [f"cancel_order[{ref}, {r}]" for r in ("no longer needed", "ordered by mistake")]
        if o.status == "delivered":
            for j, it in enumerate(o.items, 1):
                if it.status == "ordered":
                    item = f"#{j}" if by_pos else it.sku
                    out += [f"return_item[{ref}, {item}]", f"exchange_item[{ref}, {item}, ...]"]
    out += [f"click[{b}]" for b in buttons(env)]
    if env.history:
        out.append("back")
    if fam == "after_sales":
        out.append("list_orders")
        if env.page == "orders":
            out += [f"get_order[#{k}]" if env.order_refs == "position" else f"get_order[{oid}]"
                    for k, oid in enumerate(env.db.orders, 1)]
    elif fam != "after_sales" and env.cart:
        out.append("view_cart")
    out += ["ask[...]", "answer[...]", "finish"]
    return out


def structured(env) -> dict:
    """A JSON-serialisable view of the page for non-language agents.

    Keys are the same on every page and a dict-valued key never holds None (``product`` is ``{}`` off a product
    page): Gymnasium's vector envs batch infos key by key and mangle a None next to a dict."""
    d = {"page": env.page, "family": env.task.family, "query": env.query, "page_num": env.page_num,
         "num_results": len(env.hits), "results": [], "product": {}, "selected": dict(env.selected),
         "cart": [{"sku": env._sku(pid), "product_id": int(pid), "options": dict(c)} for pid, c in env.cart],
         "cart_total": round(env.cart_total(), 2), "budget": env.task.budget, "revealed": env.customer.said(),
         "patience": env.customer.patience, "order_id": env.order_id}
    if env.page == "results":
        d["results"] = [{"sku": sku, "product_id": int(pid), "title": title, "price": price}
                        for pid, sku, title, price in env.page_rows()]
    if env.page == "item":
        p = env.product
        d["product"] = {"sku": p.sku, "product_id": int(p.product_id), "title": p.title, "price": p.price,
                        "product_type": p.product_type, "attributes": list(p.attributes), "options": p.options}
    if env.task.family == "after_sales" and env.page in ("orders", "order"):
        d["orders"] = env.db.structured()["orders"]
    return d


def anchor(env) -> str:
    """A canonical key of the current state without history (GiGPO's anchor-state grouping)."""
    if env.page == "results":
        # the query as a sorted word set: "Boots, waterproof" and "waterproof boots" are the same state
        key = " ".join(sorted(set(_QUERY_WORD.findall(env.query.lower())))) + f"#{env.page_num}"
    elif env.page == "item":
        key = env.product.sku + "|" + ",".join(f"{k}={v}" for k, v in sorted(env.selected.items()))
    elif env.page == "order":
        key = env.order_id
    else:
        key = ""
    cart = ",".join(sorted(env._sku(pid) for pid, _ in env.cart))
    extra = f"|writes={len(env.db.writes)}" if env.db is not None else ""
    return f"{env.page}:{key}|cart={cart}|revealed={len(env.customer.revealed)}{extra}"
