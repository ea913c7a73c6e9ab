"""The Shopping-v0 action language: a WebShop-compatible text grammar and an equivalent JSON tool-call form.

An agent sends one string per step. A string whose first non-blank character is ``{`` is read as a JSON tool
call ``{"name": ..., "arguments": {...}}`` (``arguments`` may also be a JSON-encoded string, as OpenAI-style
function calling sends it); anything else is read as text. Both forms parse into the same `Action`
(name + tuple of string arguments), so the env never sees which form was used.

| text form | JSON tool call | what it does |
|---|---|---|
| ``search[q]`` | ``{"name": "search", "arguments": {"query": q}}`` | full-text search; shows results page 1 |
| ``click[x]`` | ``{"name": "click", "arguments": {"target": x}}`` | click a SKU on a results page (or its position on the page: ``click[#3]`` / ``click[3]`` = the 3rd result shown), an option value or a button (``buy now``, ``add to cart``, ``description``, ``next >``, ``< prev``, ``back to search``, ``checkout``) |
| ``back`` | ``{"name": "back", "arguments": {}}`` | return to the previous page |
| ``next_page`` / ``prev_page`` | ``{"name": "next_page"}`` / ``{"name": "prev_page"}`` | same as ``click[next >]`` / ``click[< prev]`` on a results page |
| ``ask[question]`` | ``{"name": "ask", "arguments": {"question": ...}}`` | ask the customer (costs patience) |
| ``answer[text]`` | ``{"name": "answer", "arguments": {"text": ...}}`` | a user-visible message to the customer |
| ``buy`` | ``{"name": "buy", "arguments": {}}`` | same as ``click[buy now]``: purchase the open product with the chosen options |
| ``add_to_cart`` | ``{"name": "add_to_cart", "arguments": {}}`` | same as ``click[add to cart]`` |
| ``remove_from_cart[sku]`` | ``{"name": "remove_from_cart", "arguments": {"sku": ...}}`` | remove a cart line |
| ``view_cart`` | ``{"name": "view_cart", "arguments": {}}`` | show the cart page |
| ``checkout`` | ``{"name": "checkout", "arguments": {}}`` | buy everything in the cart (ends the episode) |
| ``list_orders`` | ``{"name": "list_orders", "arguments": {}}`` | after-sales: the customer's orders |
| ``get_order[order_id]`` | ``{"name": "get_order", "arguments": {"order_id": ...}}`` | after-sales: one order's details |
| ``cancel_order[order_id, reason]`` | ``{"name": "cancel_order", "arguments": {"order_id": ..., "reason": ...}}`` | after-sales write |
| ``return_item[order_id, sku]`` | ``{"name": "return_item", "arguments": {"order_id": ..., "sku": ...}}`` | after-sales write |
| ``exchange_item[order_id, sku, new_sku]`` | ``{"name": "exchange_item", "arguments": {"order_id": ..., "sku": ..., "new_sku": ...}}`` | after-sales write |
| ``finish`` | ``{"name": "finish", "arguments": {}}`` | end the conversation (after-sales tasks are graded then) |

Action names are case-insensitive; argument text is stripped of surrounding blanks. Arguments of the
multi-argument tools are separated by commas in the text form; the last argument takes the rest of the text
(so a cancellation reason may contain commas). A bare action may also be written with empty brackets
(``view_cart[]``). Anything else raises `ActionError` with a reason, which the env reports as an invalid action.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: name -> (argument names, one-line description). The order of argument names is the text form's order.
TOOLS: dict[str, tuple[tuple[str, ...], str]] = {
    "search": (("query",), "Search the catalog with keywords; shows the first page of results."),
    "click": (("target",), ("Click a product SKU (or '#3' for the 3rd result shown), an option value or a button "
                            "shown on the current page "
                            "('buy now', 'add to cart', 'description', 'next >', '< prev', 'back to search', "
                            "'checkout').")),
    "back": ((), "Go back to the previous page."),
    "next_page": ((), "Next page of search results."),
    "prev_page": ((), "Previous page of search results."),
    "ask": (("question",), "Ask the customer a question (each question costs some of their patience)."),
    "answer": (("text",), "Send a message the customer sees."),
    "buy": ((), "Buy the open product with the chosen options (ends the episode)."),
    "add_to_cart": ((), "Add the open product with the chosen options to the cart."),
    "remove_from_cart": (("sku",), "Remove a product from the cart."),
    "view_cart": ((), "Show the cart."),
    "checkout": ((), "Buy everything in the cart (ends the episode)."),
    "list_orders": ((), "List the customer's orders."),
    "get_order": (("order_id",), "Show the details of one order."),
    "cancel_order": (("order_id", "reason"), ("Cancel a pending or processing order; reason is 'no longer "
                                              "needed' or 'ordered by mistake'.")),
    "return_item": (("order_id", "sku"), "Return one delivered item; the refund goes to the original payment."),
    "exchange_item": (("order_id", "sku", "new_sku"), ("Exchange one delivered item for another product of "
                                                       "the same type.")),
    "finish": ((), "End the conversation."),
}

#: a string longer than this (before stripping) is rejected without being parsed
DEFAULT_MAX_INPUT_CHARS = 1000


class ActionError(ValueError):
    """An action string that does not parse; the message is the reason shown to the agent."""


@dataclass(frozen=True)
class Action:
    """One parsed action: a tool name from `TOOLS` and its string arguments in `TOOLS` order."""

    name: str
    args: tuple[str, ...] = ()

    def to_text(self) -> str:
        """The canonical text form (``name`` or ``name[a, b]``)."""
        if not self.args:
            return self.name
        return f"{self.name}[{', '.join(self.args)}]"

    def to_json(self) -> str:
        """The canonical JSON tool-call form."""
        names = TOOLS[self.name][0]
        return json.dumps({"name": self.name, "arguments": dict(zip(names, self.args, strict=False))}, ensure_ascii=False)


def tool_schemas() -> list[dict]:
    """The tools in OpenAI function-calling style (``{"type": "function", "function": {...}}``)."""
    out = []
    for name, (arg_names, doc) in TOOLS.items():
        out.append({
            "type": "function",
            "function": {
                "name": name,
                "description": doc,
                "parameters": {
                    "type": "object",
                    "properties": {a: {"type": "string"} for a in arg_names},
                    "required": list(arg_names),
                    "additionalProperties": False,
                },
            },
        })
    return out


def _check_args(name: str, args: list[str]) -> Action:
    arg_names = TOOLS[name][0]
    if len(args) != len(arg_names):
        want = ", ".join(arg_names) or "no arguments"
        raise ActionError(f"{name} takes {len(arg_names)} argument(s) ({want}), got {len(args)}")
    args = [a.strip() for a in args]
    for a, n in zip(args, arg_names, strict=False):
        if not a:
            raise ActionError(f"{name}: argument {n!r} is empty")
    return Action(name, tuple(args))


def parse_text(text: str) -> Action:
    """Parse the text grammar (see the module table)."""
    s = text.strip()
    if not s:
        raise ActionError("empty action")
    bracket = s.find("[")
    if bracket < 0:
        name = s.lower()
        if name not in TOOLS:
            raise ActionError(f"unknown action {_short(s)!r}; use e.g. search[...], click[...], ask[...], answer[...]")
        return _check_args(name, [])
    if not s.endswith("]"):
        raise ActionError("missing closing ']'")
    name = s[:bracket].strip().lower()
    if name not in TOOLS:
        raise ActionError(f"unknown action {_short(s[:bracket])!r}")
    inner = s[bracket + 1:-1]
    n = len(TOOLS[name][0])
    if n == 0:
        if inner.strip():
            raise ActionError(f"{name} takes no arguments")
        return Action(name)
    args = inner.split(",", n - 1) if n > 1 else [inner]
    return _check_args(name, args)


def parse_json(text: str) -> Action:
    """Parse a JSON tool call ``{"name": ..., "arguments": {...}}``."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ActionError(f"malformed JSON tool call ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ActionError('a JSON tool call must be an object with a string "name"')
    name = obj["name"].strip().lower()
    if name not in TOOLS:
        raise ActionError(f"unknown tool {_short(obj['name'])!r}")
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise ActionError(f"{name}: arguments are not valid JSON") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ActionError(f"{name}: arguments must be an object")
    arg_names = TOOLS[name][0]
    extra = set(arguments) - set(arg_names)
    if extra:
        raise ActionError(f"{name}: unexpected argument(s) {sorted(map(str, extra))[:3]}")
    values = []
    for a in arg_names:
        if a not in arguments:
            raise ActionError(f"{name}: missing argument {a!r}")
        v = arguments[a]
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ActionError(f"{name}: argument {a!r} must be a string")
        values.append(str(v))
    return _check_args(name, values)


def parse(text, max_chars: int = DEFAULT_MAX_INPUT_CHARS) -> Action:
    """Parse one agent action string in either form; raises `ActionError` with the reason."""
    if not isinstance(text, str):
        raise ActionError(f"an action must be a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise ActionError(f"action too long ({len(text)} characters; at most {max_chars})")
    if text.lstrip().startswith("{"):
        return parse_json(text)
    return parse_text(text)


def _short(s: str, n: int = 40) -> str:
    s = str(s)
    return s if len(s) <= n else s[: n - 3] + "..."
