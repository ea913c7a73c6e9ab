"""The shopping env's tool table: each tool is one `Tool` entry (name, description, JSON schema, handler).

As in tau-bench (Yao et al. 2024, arXiv 2406.12045, §3), where each tool is one class with its schema and its
``invoke``, a tool here is one entry of `TOOLS`, and everything else is derived from that entry:

- the text grammar (`shopsim.envs.shopping.actions.parse_text`): ``name[a, b]`` takes the schema's properties in
  order, split at commas, the last one taking the rest of the text;
- the JSON tool-call form (`shopsim.envs.shopping.actions.parse_json`);
- argument checking against the schema (`check_arguments`), with one reason per bad call;
- the dispatch in `ShoppingEnv.step` (availability check, then ``handler(env, **arguments)``);
- the OpenAI-style function list agents see (`tool_schemas`, ``env.tool_schemas``).

Adding a tool is one `Tool(...)` entry in `TOOLS` (or `ShoppingEnv.register_tool` on one env instance).

Schema subset. ``parameters`` is a JSON schema ``{"type": "object", "properties": {...}, "required": [...],
"additionalProperties": false}`` whose properties are all required (the text form is positional) and each have a
``description`` and a ``type`` among ``string``, ``integer``, ``number``, ``boolean``, optionally ``enum`` and,
for strings, ``minLength``. `Tool` checks this shape when it is built, so a malformed entry fails at import.
Argument values are coerced to the declared type (the text form only has strings; JSON numbers are accepted for a
string argument as their text, as OpenAI-style callers often send ids as numbers), strings are stripped of
surrounding blanks, then ``minLength`` and ``enum`` are checked.

A handler receives the env and the checked arguments as keywords. It may return a string, which is appended to the
turn's feedback line, or change the env directly (page, cart, feedback, `ShoppingEnv._finish`). It raises
`ActionError` (or `orders.ToolError`) when the call does not apply in the current state; the env reports that as
an invalid action and the episode continues.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shopsim.envs.shopping.cache import product as _product
from shopsim.envs.shopping.orders import grade, position_ref
from shopsim.errors import ConfigError

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_TYPES = ("string", "integer", "number", "boolean")
_TYPE_WORD = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false"}


class ActionError(ValueError):
    """An action that does not parse, has bad arguments or does not apply now; the message is the reason shown
    to the agent."""


@dataclass(frozen=True)
class Tool:
    """One tool: its name, what agents are told about it, its argument schema and what it does.

    ``available(env) -> bool`` (None: always) says whether the tool applies to the current task at all; when it
    is False the call is an invalid action with the reason ``unavailable.format(name=name)``. ``hint(env) ->
    list[str]`` (None: no hint) adds text forms to ``info["valid_actions"]`` (the built-in tools are laid out
    there by `render.valid_actions` instead, in an order that interleaves them).
    """

    name: str
    description: str
    parameters: dict
    handler: Callable[..., str | None]
    available: Callable[[Any], bool] | None = None
    unavailable: str = "{name} is not available in this task"
    hint: Callable[[Any], list[str]] | None = field(default=None, compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(f"tool name {self.name!r} must be lower-case letters, digits and '_' (the text "
                              "grammar reads name[...])")
        if not isinstance(self.description, str) or not self.description.strip():
            raise ConfigError(f"tool {self.name}: give a non-empty description (agents read it)")
        if not callable(self.handler):
            raise ConfigError(f"tool {self.name}: handler must be a callable handler(env, **arguments)")
        check_schema(self.name, self.parameters)

    @property
    def arg_names(self) -> tuple[str, ...]:
        """Argument names in the text form's order (the schema's property order)."""
        return tuple(self.parameters["properties"])

    def schema(self) -> dict:
        """This tool in OpenAI function-calling style (``{"type": "function", "function": {...}}``)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def params(**descriptions: str) -> dict:
    """The schema of tools whose arguments are all non-empty strings: ``params(query="Search keywords.")``.

    Keyword order is the text form's argument order."""
    return {"type": "object",
            "properties": {a: {"type": "string", "minLength": 1, "description": d} for a, d in descriptions.items()},
            "required": list(descriptions), "additionalProperties": False}


def check_schema(name: str, schema) -> None:
    """Raise `ConfigError` unless `schema` is in the subset `check_arguments` implements (module docstring)."""
    where = f"tool {name}: parameters"
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ConfigError(f'{where} must be a JSON schema {{"type": "object", "properties": ...}}')
    props = schema.get("properties")
    if not isinstance(props, dict):
        raise ConfigError(f"{where} needs a 'properties' object (use {{}} for a tool without arguments)")
    unknown = set(schema) - {"type", "properties", "required", "additionalProperties"}
    if unknown:
        raise ConfigError(f"{where} has unsupported keys {sorted(unknown)}")
    if list(schema.get("required", [])) != list(props):
        raise ConfigError(f"{where}: 'required' must list every property in order (the text form is positional); "
                          f"got {schema.get('required')!r} for properties {list(props)}")
    if schema.get("additionalProperties", False) is not False:
        raise ConfigError(f"{where}: set 'additionalProperties': false (unknown arguments are rejected)")
    for arg, p in props.items():
        if not isinstance(arg, str) or not _NAME.match(arg):
            raise ConfigError(f"{where}: argument name {arg!r} must be lower-case letters, digits and '_'")
        if not isinstance(p, dict) or p.get("type") not in _TYPES:
            raise ConfigError(f"{where}.{arg}: 'type' must be one of {', '.join(_TYPES)}")
        if not isinstance(p.get("description"), str) or not p["description"].strip():
            raise ConfigError(f"{where}.{arg}: give a non-empty 'description'")
        extra = set(p) - {"type", "description", "enum", "minLength"}
        if extra:
            raise ConfigError(f"{where}.{arg} has unsupported keys {sorted(extra)}")
        if "minLength" in p and (p["type"] != "string" or type(p["minLength"]) is not int or p["minLength"] < 0):
            raise ConfigError(f"{where}.{arg}: 'minLength' is a non-negative integer, for strings only")
        if "enum" in p and (not isinstance(p["enum"], list) or not p["enum"]):
            raise ConfigError(f"{where}.{arg}: 'enum' must be a non-empty list")


def _coerce(tool: str, arg: str, kind: str, value):
    """`value` as the declared JSON type, or `ActionError` naming the argument and the type."""
    if kind == "string":
        # JSON numbers are taken as their text (ids sent as numbers); bool is an int subclass, refused
        if isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return str(value)
    elif kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            return int(value)
    elif kind == "number":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        if isinstance(value, str):
            try:
                x = float(value)
            except ValueError:
                x = math.nan
            if math.isfinite(x):
                return x
    elif kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    raise ActionError(f"{tool}: argument {arg!r} must be {_TYPE_WORD[kind]}")


def check_arguments(tool: Tool, arguments: dict) -> tuple:
    """The checked argument values of `tool`, in schema order; `ActionError` with the reason otherwise.

    Order of checks (the first failure is reported): unexpected names, then per argument in order missing /
    wrong type, then per argument in order empty (``minLength``) / not in ``enum``."""
    props = tool.parameters["properties"]
    extra = set(arguments) - set(props)
    if extra:
        raise ActionError(f"{tool.name}: unexpected argument(s) {sorted(map(str, extra))[:3]}")
    values = []
    for arg, p in props.items():
        if arg not in arguments:
            raise ActionError(f"{tool.name}: missing argument {arg!r}")
        values.append(_coerce(tool.name, arg, p["type"], arguments[arg]))
    out = []
    for (arg, p), v in zip(props.items(), values, strict=True):
        if isinstance(v, str):
            v = v.strip()
            if len(v) < p.get("minLength", 0):
                raise ActionError(f"{tool.name}: argument {arg!r} is empty")
        if "enum" in p and v not in p["enum"]:
            raise ActionError(f"{tool.name}: argument {arg!r} must be one of {', '.join(map(str, p['enum']))}")
        out.append(v)
    return tuple(out)


def tool_schemas(tools: dict[str, Tool] | None = None) -> list[dict]:
    """The tools of `tools` (default `TOOLS`) in OpenAI function-calling style, in table order."""
    return [t.schema() for t in (TOOLS if tools is None else tools).values()]


#: `system_prompt` forms: the text grammar written out, or tool calls (the schemas go to the chat template)
PROMPT_FORMS = ("text", "tools")

_ROLE = ("You are a shopping assistant in a web shop, serving one customer. Each turn you see the current page "
         "(the customer's request, search results, a product, the cart or their orders).")


def system_prompt(tools: dict[str, Tool] | None = None, form: str = "text") -> str:
    """A system prompt that tells a chat model how to act in the shopping env with the tools of `tools` (default
    `TOOLS`).

    ``form="text"``: the text grammar, one line per tool (``name[arg, ...]: description``), for a model whose chat
    template has no tool support; ``form="tools"``: only the role and the rule of one call per turn, for a template
    that renders the tool schemas itself (`tool_schemas`, passed as ``tools=``)."""
    if form not in PROMPT_FORMS:
        raise ConfigError(f"form={form!r}; choose one of {PROMPT_FORMS}")
    table = TOOLS if tools is None else tools
    if form == "tools":
        return f"{_ROLE} Act by calling exactly one of the given tools per turn, with no other text."
    lines = [f"{_ROLE} Reply with exactly one action on one line and nothing else. The actions:"]
    for t in table.values():
        form_text = f"{t.name}[{', '.join(t.arg_names)}]" if t.arg_names else t.name
        lines.append(f"{form_text}: {t.description}")
    lines.append("Arguments go in the brackets, separated by commas, e.g. search[waterproof hiking boots], "
                 "click[#2], click[buy now], cancel_order[W1234567, ordered by mistake].")
    return "\n".join(lines)


# ---- availability ----------------------------------------------------------------------------------------------
def _shopping(env) -> bool:
    return env.task.family != "after_sales"


def _after_sales(env) -> bool:
    return env.task.family == "after_sales"


def _personalized(env) -> bool:
    return env.task.profile is not None


_NOT_BUYING = "this customer is not buying anything; use the after-sales tools"
_NO_ORDERS = "{name} is an after-sales tool; this task has no order history"
_NO_PROFILE = "{name} needs a customer profile; only personalized_buy tasks have one"


# ---- handlers: handler(env, **arguments) -> feedback line or None ---------------------------------------------
def _search(env, query: str) -> None:
    env._search(query)


def _click(env, target: str) -> None:
    env._click(target)


def _back(env) -> None:
    if not env.history:
        raise ActionError("nothing to go back to")
    env._restore()


def _next_page(env) -> None:
    if env.page != "results":
        raise ActionError("next_page works on a results page")
    env._click("next >")


def _prev_page(env) -> None:
    if env.page != "results":
        raise ActionError("prev_page works on a results page")
    env._click("< prev")


def _ask(env, question: str) -> str:
    reply = env.customer.ask(question)
    if env.customer.left:
        env._finish(0.0, {"customer_left": 1.0}, "customer_left")
    return f"Customer: {reply}"


def _answer(env, text: str) -> str:
    if env.first_answer_turn is None:  # the turn-count of the first user-visible message (episode metric)
        env.first_answer_turn = env.turns - 1
    env.answered = True
    return f"Customer: {env.customer.hear(text)}"


def _finish(env) -> None:
    env.feedback.append("Conversation ended.")
    if env.task.family != "after_sales":
        env._finish(0.0, {"purchased": 0.0}, "finish_without_purchase")
    else:
        score, parts = grade(env.db, env._gold, env.task.request, env.answered, env.viewed)
        env._finish(score, parts, "finish")


def _buy(env) -> None:
    env._cart_action("buy", ())


def _add_to_cart(env) -> None:
    env._cart_action("add_to_cart", ())


def _remove_from_cart(env, sku: str) -> None:
    env._cart_action("remove_from_cart", (sku,))


def _view_cart(env) -> None:
    env._cart_action("view_cart", ())


def _checkout(env) -> None:
    env._cart_action("checkout", ())


def _get_profile(env) -> str:
    from shopsim.envs.shopping.profiles import profile_line

    return "Profile: " + profile_line(env.task.profile)


def _get_orders(env) -> str:
    from shopsim.envs.shopping.profiles import orders_line

    return "Past orders: " + orders_line(env.task.profile)


def _profile_hint(env) -> list[str]:
    return ["get_profile", "get_orders"]


def _list_orders(env) -> None:
    if env.page != "orders":
        env._goto("orders")


def _get_order(env, order_id: str) -> None:
    key = env.db.order_key(order_id)  # raises ToolError for an unknown order
    env._goto("order")
    env.order_id = key
    env.viewed.add(key)


def _cancel_order(env, order_id: str, reason: str) -> str:
    return env.db.cancel_order(order_id, reason)


def _return_item(env, order_id: str, sku: str) -> str:
    return env.db.return_item(order_id, sku)


def _exchange_item(env, order_id: str, sku: str, new_sku: str) -> str:
    rows = env.page_rows() if env.page == "results" else []
    # '#k': the k-th result of the results page shown, as click[#k] reads it
    k = position_ref(new_sku, len(rows), f"exchange_item: new_sku {new_sku.strip()!r} names a result position; "
                     + (f"this page shows #1 to #{len(rows)}" if rows else
                        "search first, then name a result of the results page shown"))
    if k is not None:
        new_sku = rows[k][1]
    pid = env.catalog.sku_to_id(new_sku.strip().upper())
    new = None if pid is None else _product(env.catalog, pid)
    return env.db.exchange_item(order_id, sku, new)


_SKU = "A product SKU as shown in brackets, e.g. B0ABCDEFGH."
_ORDER = ("An order id from list_orders, e.g. W1234567, '#2' for the 2nd order listed, or the title of a product in "
          "the order.")
_ITEM = ("An item's SKU as shown in the order details, e.g. B0ABCDEFGH, '#1' for its 1st item, or the product's "
         "title.")
_NEW = "The new product's SKU, e.g. B0ABCDEFGH, or '#3' for the 3rd result of the results page shown."

#: the built-in tools, in the order agents see them (`tool_schemas`)
TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("search", ("Search the catalog with keywords; shows the first page of results. A price clause in the query "
                    "('price lower than 20.00 dollars', 'under $20') keeps only products priced at most that."),
         params(query="Keywords to search for, optionally with a price clause."), _search),
    Tool("click", ("Click a product SKU (or '#3' for the 3rd result shown), an option value or a button shown on the "
                   "current page ('buy now', 'add to cart', 'description', 'next >', '< prev', 'back to search', "
                   "'checkout')."),
         params(target="A SKU, '#<position>', an option value ('<option>: <value>' if ambiguous) or a button."),
         _click),
    Tool("back", "Go back to the previous page.", params(), _back),
    Tool("next_page", "Next page of search results.", params(), _next_page),
    Tool("prev_page", "Previous page of search results.", params(), _prev_page),
    Tool("ask", "Ask the customer a question (each question costs some of their patience).",
         params(question="The question for the customer."), _ask),
    Tool("answer", "Send a message the customer sees.", params(text="The message."), _answer),
    Tool("buy", "Buy the open product with the chosen options (ends the episode).", params(), _buy,
         _shopping, _NOT_BUYING),
    Tool("add_to_cart", "Add the open product with the chosen options to the cart.", params(), _add_to_cart,
         _shopping, _NOT_BUYING),
    Tool("remove_from_cart", "Remove a product from the cart.", params(sku=_SKU), _remove_from_cart,
         _shopping, _NOT_BUYING),
    Tool("view_cart", "Show the cart.", params(), _view_cart, _shopping, _NOT_BUYING),
    Tool("checkout", "Buy everything in the cart (ends the episode).", params(), _checkout, _shopping, _NOT_BUYING),
    Tool("list_orders", "List the customer's orders.", params(), _list_orders, _after_sales, _NO_ORDERS),
    Tool("get_order", "Show the details of one order.", params(order_id=_ORDER), _get_order,
         _after_sales, _NO_ORDERS),
    Tool("cancel_order", ("Cancel a pending or processing order; reason is 'no longer needed' or 'ordered by "
                          "mistake'."),
         params(order_id=_ORDER, reason="Why the customer cancels (the policy lists the accepted reasons)."),
         _cancel_order, _after_sales, _NO_ORDERS),
    Tool("return_item", "Return one delivered item; the refund goes to the original payment.",
         params(order_id=_ORDER, sku=_ITEM), _return_item, _after_sales, _NO_ORDERS),
    Tool("exchange_item", "Exchange one delivered item for another product of the same type.",
         params(order_id=_ORDER, sku=_ITEM, new_sku=_NEW),
         _exchange_item, _after_sales, _NO_ORDERS),
    Tool("get_profile", ("Show the customer's profile: favourite brands, price sensitivity (the most they spend per "
                         "product type), size and colour preferences."), params(), _get_profile, _personalized,
         _NO_PROFILE, _profile_hint),
    Tool("get_orders", "Show the customer's past purchases (brands, options chosen, prices).", params(), _get_orders,
         _personalized, _NO_PROFILE),
    Tool("finish", "End the conversation.", params(), _finish),
)}
