"""The after-sales order database of one task, its tools and its grading (tau-bench style).

Each after_sales task owns a small database: one customer's 3-5 orders of 1-3 catalog products each. The tools
(`list_orders`, `get_order`, `cancel_order`, `return_item`, `exchange_item`) read and write it. Tools enforce only
*hard* state rules (the order exists, the item is in it, cancel needs a pending/processing order, return and
exchange need a delivered, not yet returned/exchanged item, the new SKU exists). The *written policy* below is
the agent's job to follow, as in tau-bench (Yao et al. 2024, arXiv 2406.12045, §3): a write that breaks it goes
through and makes the final database differ from the gold one.

Grading (binary, like tau-bench's database hash): success iff the final `state_key()` equals the gold database's
(the initial database with the task's gold write applied, or unchanged when the request breaks the policy) and
the agent both opened the request's order (``get_order``) and sent at least one user-visible ``answer[...]``
(so that refusing by doing nothing is not free). Components are reported in ``info["reward_parts"]``.

Position references. Besides ids, every tool takes ``#k`` for an order (the k-th line of ``list_orders``) and for
an item (the k-th item line of its order's details), as WebShop-style agents click results by position; the
``order_refs="position"`` rendering (`ShoppingEnv`) shows those positions instead of the ids, so an agent never has
to copy a 10-character code. A product's title (as the customer wrote it, in quotes or not, any case) names the
item and, where an order is expected, the order that holds it: the titles of one customer's items are distinct, so
an agent can copy the product out of the request instead of matching it against the order list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

RETURN_WINDOW_DAYS = 30
_POSITION = re.compile(r"^#\s*(\d+)$")
CANCEL_REASONS = ("no longer needed", "ordered by mistake")
POLICY_SHORT = ("Policy: cancel only pending or processing orders, reason 'no longer needed' or 'ordered by "
                "mistake'; return or exchange only delivered items within 30 days of delivery; exchange only for "
                "the same product type; refunds go to the original payment method.")
POLICY_FULL = (
    "Store policy:\n"
    "1. An order can be cancelled only while its status is pending or processing. The cancellation reason must be "
    "either 'no longer needed' or 'ordered by mistake'. The full amount is refunded to the original payment method.\n"
    f"2. A delivered item can be returned within {RETURN_WINDOW_DAYS} days of delivery. The item price is refunded "
    "to the original payment method.\n"
    f"3. A delivered item can be exchanged within {RETURN_WINDOW_DAYS} days of delivery, only for a product of the "
    "same product type. The price difference is settled with the original payment method.\n"
    "4. Each item can be returned or exchanged once. Refuse requests that break these rules and tell the customer why."
)


class ToolError(ValueError):
    """A tool call the database rejects (unknown order, wrong status...); reported as an invalid action."""


def _title_key(text: str) -> str:
    return " ".join(text.strip().strip('"').lower().split())


def position_ref(ref: str, count: int, out_of_range: str) -> int | None:
    """The 0-based index a position reference ``#k`` names among `count` shown entries, None when `ref` is not one;
    `ToolError(out_of_range)` when there is no k-th entry."""
    m = _POSITION.match(ref.strip())
    if m is None:
        return None
    k = int(m.group(1))
    if not 1 <= k <= count:
        raise ToolError(out_of_range)
    return k - 1


@dataclass
class Item:
    sku: str
    product_id: int
    title: str
    product_type: str
    options: dict
    price: float
    status: str = "ordered"  # ordered | returned | exchanged
    exchanged_for: str | None = None


@dataclass
class Order:
    order_id: str
    status: str  # pending | processing | shipped | delivered | cancelled
    days_since_order: int
    days_since_delivery: int | None
    payment: str
    items: list[Item]
    cancel_reason: str | None = None
    refunds: list[tuple[float, str]] = field(default_factory=list)


class OrderDB:
    """One customer's orders; `copy()` before mutating a shared initial database."""

    def __init__(self, customer: str, orders: list[Order]):
        self.customer = customer
        self.orders = {o.order_id: o for o in orders}
        self.writes: list[tuple] = []  # (tool, args) of every successful write, for the reward parts

    def copy(self) -> OrderDB:
        """An independent copy (orders and items are copied field by field: much cheaper than deepcopy)."""
        orders = [replace(o, items=[replace(it, options=dict(it.options)) for it in o.items], refunds=list(o.refunds))
                  for o in self.orders.values()]
        out = OrderDB(self.customer, orders)
        out.writes = list(self.writes)
        return out

    # ---- reads -------------------------------------------------------------------------------------------
    def _order(self, order_id: str) -> Order:
        return self.orders[self.order_key(order_id)]

    def order_key(self, order_id: str) -> str:
        """The id of the order `order_id` names: an id (``W1234567``, ``#W1234567``), ``#k``, the k-th order of
        `list_orders`, or the title of one of its items; `ToolError` when there is none."""
        keys = list(self.orders)
        k = position_ref(order_id, len(keys),
                         f"no order {order_id.strip()[:20]!r}: this customer has orders #1 to #{len(keys)}")
        if k is not None:
            return keys[k]
        key = order_id.strip().lstrip("#").upper()
        if key in self.orders:
            return key
        title = _title_key(order_id)
        for o in self.orders.values():
            if any(_title_key(it.title) == title for it in o.items):
                return o.order_id
        raise ToolError(f"no order {order_id[:20]!r} for this customer (an order id, #k or an item's title); "
                        "see list_orders")

    def position(self, order_id: str) -> int:
        """The 1-based place of order `order_id` in `list_orders`."""
        return list(self.orders).index(order_id) + 1

    def list_orders(self, refs: str = "id") -> list[str]:
        """One line per order; ``refs="position"`` starts each with ``#k`` instead of the order id."""
        out = []
        for k, o in enumerate(self.orders.values(), 1):
            when = (f"delivered {o.days_since_delivery} days ago" if o.status == "delivered"
                    else f"{o.status}, ordered {o.days_since_order} days ago")
            ref = f"#{k}" if refs == "position" else o.order_id
            out.append(f"{ref} ({when}): " + "; ".join(it.title for it in o.items))
        return out

    def order_lines(self, order_id: str, refs: str = "id") -> list[str]:
        """The details page of one order; ``refs="position"`` names the order and its items by position."""
        o = self._order(order_id)
        position = refs == "position"
        head = f"Order {'#' + str(self.position(o.order_id)) if position else o.order_id}: {o.status}"
        if o.status == "delivered":
            head += f", delivered {o.days_since_delivery} days ago"
        else:
            head += f", ordered {o.days_since_order} days ago"
        if o.cancel_reason:
            head += f" (reason: {o.cancel_reason})"
        lines = [head, f"Payment: {o.payment}"]
        for j, it in enumerate(o.items, 1):
            opts = ", ".join(f"{k}={v}" for k, v in it.options.items())
            st = "" if it.status == "ordered" else f" [{it.status}" + (
                f" for {it.exchanged_for}]" if it.exchanged_for else "]")
            ref = f"#{j}" if position else f"[{it.sku}]"
            lines.append(f"- {ref} {it.title} ({opts}) ${it.price:.2f} [{it.product_type}]{st}")
        return lines

    # ---- writes ------------------------------------------------------------------------------------------
    def _item(self, o: Order, sku: str) -> Item:
        k = position_ref(sku, len(o.items),
                         f"order {o.order_id} has items #1 to #{len(o.items)}, not {sku.strip()[:20]!r}")
        if k is not None:
            return o.items[k]
        title = _title_key(sku)
        for it in o.items:
            if it.sku.upper() == sku.strip().upper() or _title_key(it.title) == title:
                return it
        raise ToolError(f"order {o.order_id} has no item {sku[:20]!r} (a SKU, #k or the item's title)")

    def cancel_order(self, order_id: str, reason: str) -> str:
        o = self._order(order_id)
        if o.status not in ("pending", "processing"):
            raise ToolError(f"order {o.order_id} is {o.status}; only pending or processing orders can be cancelled")
        o.status = "cancelled"
        o.cancel_reason = reason.strip().lower()
        amount = round(sum(it.price for it in o.items), 2)
        o.refunds.append((amount, o.payment))
        self.writes.append(("cancel_order", o.order_id, o.cancel_reason))
        return f"Order {o.order_id} cancelled; ${amount:.2f} refunded to {o.payment}."

    def return_item(self, order_id: str, sku: str) -> str:
        o = self._order(order_id)
        it = self._ready_item(o, sku)
        it.status = "returned"
        o.refunds.append((it.price, o.payment))
        self.writes.append(("return_item", o.order_id, it.sku))
        return f"Return of {it.sku} from {o.order_id} accepted; ${it.price:.2f} refunded to {o.payment}."

    def exchange_item(self, order_id: str, sku: str, new_product) -> str:
        o = self._order(order_id)
        it = self._ready_item(o, sku)
        if new_product is None:
            raise ToolError("new_sku is not a product in the catalog")
        it.status = "exchanged"
        it.exchanged_for = new_product.sku
        diff = round(new_product.price - it.price, 2)
        o.refunds.append((-diff, o.payment))
        self.writes.append(("exchange_item", o.order_id, it.sku, new_product.sku))
        settle = f"${-diff:.2f} refunded to" if diff <= 0 else f"${diff:.2f} charged to"
        return f"Exchange of {it.sku} for {new_product.sku} in {o.order_id} accepted; {settle} {o.payment}."

    def _ready_item(self, o: Order, sku: str) -> Item:
        if o.status != "delivered":
            raise ToolError(f"order {o.order_id} is {o.status}; only delivered items can be returned or exchanged")
        it = self._item(o, sku)
        if it.status != "ordered":
            raise ToolError(f"item {it.sku} was already {it.status}")
        return it

    # ---- grading -----------------------------------------------------------------------------------------
    def state_key(self) -> tuple:
        """Everything the grader compares (order status, reasons, item states, refunds), canonically ordered."""
        return tuple(
            (o.order_id, o.status, o.cancel_reason,
             tuple((it.sku, it.status, it.exchanged_for) for it in o.items),
             tuple((round(a, 2), m) for a, m in o.refunds))
            for o in sorted(self.orders.values(), key=lambda o: o.order_id))

    def structured(self) -> dict:
        return {"customer": self.customer, "orders": [
            {"order_id": o.order_id, "status": o.status, "days_since_order": o.days_since_order,
             "days_since_delivery": o.days_since_delivery, "payment": o.payment, "cancel_reason": o.cancel_reason,
             "items": [{"sku": it.sku, "title": it.title, "product_type": it.product_type, "options": dict(it.options),
                        "price": it.price, "status": it.status, "exchanged_for": it.exchanged_for}
                       for it in o.items]} for o in self.orders.values()]}


def apply_gold(db: OrderDB, request: dict, catalog) -> OrderDB:
    """The gold database: `db` with the task's correct write applied (none for a request the policy refuses)."""
    gold = db.copy()
    kind = request["kind"]
    if kind == "cancel":
        gold.cancel_order(request["order_id"], request["reason"])
    elif kind == "return":
        gold.return_item(request["order_id"], request["sku"])
    elif kind == "exchange":
        gold.exchange_item(request["order_id"], request["sku"], catalog.product(request["new_id"]))
    gold.writes = []
    return gold


def grade(db: OrderDB, gold: OrderDB, request: dict, answered: bool, viewed: set) -> tuple[float, dict]:
    """Binary after-sales reward and its components (see module docstring)."""
    db_match = db.state_key() == gold.state_key()
    target = request.get("order_id")
    touched = {w[1] for w in db.writes}
    looked = target in viewed
    parts = {"db_match": float(db_match), "answered": float(answered), "order_viewed": float(looked),
             "writes": float(len(db.writes)),
             "wrong_order_writes": float(len(touched - {target})),
             "policy_refusal_task": float(request["kind"].startswith("refuse"))}
    return float(db_match and answered and looked), parts
