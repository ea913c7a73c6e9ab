"""Shopping-v0 tool table: every entry is a well-formed schema + handler, both action forms reach the same handler,
and a tool added in one place (`ShoppingEnv.register_tool`) is parsed, checked, dispatched and listed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shopsim.envs.shopping import ShoppingEnv
from shopsim.envs.shopping.actions import Action, ActionError, parse
from shopsim.envs.shopping.tools import TOOLS, Tool, check_schema, params, tool_schemas
from shopsim.errors import ConfigError

SIZE = 2000
JSON_TYPES = {"string", "integer", "number", "boolean"}


@pytest.fixture(scope="module")
def env():
    return ShoppingEnv(catalog_size=SIZE)


# ---- the table itself ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TOOLS))
def test_every_entry_is_a_json_schema_shaped_tool(name):
    tool = TOOLS[name]
    assert tool.name == name and tool.description.strip()
    s = tool.parameters
    assert s["type"] == "object" and s["additionalProperties"] is False
    assert isinstance(s["properties"], dict) and s["required"] == list(s["properties"])
    for arg, p in s["properties"].items():
        assert p["type"] in JSON_TYPES and p["description"].strip(), (name, arg)
        assert set(p) <= {"type", "description", "enum", "minLength"}
    fn = tool.schema()
    assert fn == {"type": "function", "function": {"name": name, "description": tool.description, "parameters": s}}
    assert json.loads(json.dumps(fn)) == fn  # plain JSON, as sent to an LLM API


def test_tool_schemas_follow_the_table_order():
    assert [s["function"]["name"] for s in tool_schemas()] == list(TOOLS)
    assert ShoppingEnv(catalog_size=SIZE).tool_schemas == tool_schemas()


@pytest.mark.parametrize("schema, reason", [
    ({"type": "array"}, "JSON schema"),
    ({"type": "object"}, "'properties'"),
    ({"type": "object", "properties": {"q": {"type": "string", "description": "x"}}, "required": []}, "every property"),
    ({"type": "object", "properties": {"q": {"type": "list", "description": "x"}}, "required": ["q"]}, "'type'"),
    ({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, "description"),
    ({"type": "object", "properties": {}, "additionalProperties": True}, "additionalProperties"),
    ({"type": "object", "properties": {"q": {"type": "integer", "description": "x", "minLength": 1}},
      "required": ["q"]}, "minLength"),
    ({"type": "object", "properties": {"q": {"type": "string", "description": "x", "format": "uri"}},
      "required": ["q"]}, "unsupported"),
])
def test_malformed_schemas_are_refused_when_the_tool_is_built(schema, reason):
    with pytest.raises(ConfigError, match=reason):
        check_schema("toy", schema)
    with pytest.raises(ConfigError, match=reason):
        Tool("toy", "A toy.", schema, lambda env: None)


def test_malformed_tool_names_and_handlers_are_refused():
    with pytest.raises(ConfigError, match="lower-case"):
        Tool("Rate It", "A toy.", params(), lambda env: None)
    with pytest.raises(ConfigError, match="handler"):
        Tool("rate", "A toy.", params(), handler=None)


# ---- text and JSON forms reach the same handler ----------------------------------------------------------------
def _after_sales_task(env, kind: str) -> tuple[int, dict]:
    for task_id in range(200):
        _, info = env.reset(seed=0, options={"family": "after_sales", "task_id": task_id})
        if info["oracle"]["request"]["kind"] == kind:
            return task_id, info["oracle"]["request"]
    raise AssertionError(f"no {kind} task among the first 200")


def _cases(env) -> list[tuple[str, int, list[str], Action]]:
    """(family, task id, setup actions, action) with each tool in a state where it applies."""
    env.reset(seed=0, options={"family": "bundle", "task_id": 12})
    _, _, _, _, info = env.step("search[shirt]")
    sku = info["structured"]["results"][0]["sku"]
    item = ["search[shirt]", f"click[{sku}]"]
    cart = [*item, "add_to_cart"]
    c_id, cancel = _after_sales_task(env, "cancel")
    r_id, ret = _after_sales_task(env, "return")
    x_id, exch = _after_sales_task(env, "exchange")
    return [
        ("bundle", 12, [], Action("search", ("shirt",))),
        ("bundle", 12, ["search[shirt]"], Action("click", (sku,))),
        ("bundle", 12, item, Action("back")),
        ("bundle", 12, ["search[shirt]"], Action("next_page")),
        ("bundle", 12, ["search[shirt]", "next_page"], Action("prev_page")),
        ("clarify_and_buy", 5, [], Action("ask", ("Which color would you like?",))),
        ("bundle", 12, [], Action("answer", ("hello",))),
        ("bundle", 12, item, Action("buy")),
        ("bundle", 12, item, Action("add_to_cart")),
        ("bundle", 12, cart, Action("remove_from_cart", (sku,))),
        ("bundle", 12, cart, Action("view_cart")),
        ("bundle", 12, cart, Action("checkout")),
        ("after_sales", c_id, [], Action("list_orders")),
        ("after_sales", c_id, [], Action("get_order", (cancel["order_id"],))),
        ("after_sales", c_id, [], Action("cancel_order", (cancel["order_id"], cancel["reason"]))),
        ("after_sales", r_id, [], Action("return_item", (ret["order_id"], ret["sku"]))),
        ("after_sales", x_id, [], Action("exchange_item", (exch["order_id"], exch["sku"], exch["new_sku"]))),
        ("after_sales", c_id, [f"get_order[{cancel['order_id']}]", "answer[done]"], Action("finish")),
        ("personalized_buy", 3, [], Action("get_profile")),
        ("personalized_buy", 3, [], Action("get_orders")),
    ]


def test_cases_cover_every_tool(env):
    assert sorted(a.name for _, _, _, a in _cases(env)) == sorted(TOOLS)


def test_text_and_json_forms_call_the_same_handler_with_the_same_result(env):
    calls = []

    def spy(tool):
        def handler(e, **kwargs):
            result = tool.handler(e, **kwargs)
            calls.append((tool.name, kwargs, result))
            return result
        return dataclasses.replace(tool, handler=handler)

    env = ShoppingEnv(catalog_size=SIZE)
    for tool in TOOLS.values():
        env.register_tool(spy(tool), replace=True)
    for family, task_id, setup, action in _cases(env):
        outs, seen = [], []
        for form in (action.to_text(), action.to_json()):
            env.reset(seed=0, options={"family": family, "task_id": task_id})
            for s in setup:
                env.step(s)
            del calls[:]
            obs, reward, term, trunc, info = env.step(form)
            assert info["invalid_action"] is None, (form, info["invalid_action"])
            seen.append(list(calls))
            info.pop("chars_before_first_answer")  # the two forms differ in length, by design
            info.get("episode_metrics", {}).pop("chars_before_first_answer", None)
            outs.append((obs, reward, term, trunc, info))
        assert len(seen[0]) == 1 and seen[0][0][0] == action.name, (action, seen[0])
        assert seen[0] == seen[1], action
        assert seen[0][0][1] == dict(zip(TOOLS[action.name].arg_names, action.args, strict=True))
        assert outs[0] == outs[1], action


def test_after_sales_writes_return_their_feedback(env):
    task_id, req = _after_sales_task(env, "return")
    env.reset(seed=0, options={"family": "after_sales", "task_id": task_id})
    obs, *_ = env.step(f"return_item[{req['order_id']}, {req['sku']}]")
    assert f"Feedback: Return of {req['sku']} from {req['order_id']} accepted" in obs


@pytest.mark.parametrize("action, reason", [
    ("buy", "not buying anything"),
    ('{"name": "checkout", "arguments": {}}', "not buying anything"),
])
def test_availability_comes_from_the_table(env, action, reason):
    env.reset(seed=0, options={"family": "after_sales", "task_id": 1})
    obs, _, _, _, info = env.step(action)
    assert reason in info["invalid_action"] and "Invalid action" in obs
    env.reset(seed=0, options={"family": "bundle", "task_id": 1})
    _, _, _, _, info = env.step("list_orders")
    assert info["invalid_action"] == "list_orders is an after-sales tool; this task has no order history"


# ---- adding a tool is one place --------------------------------------------------------------------------------
def _rate_tool(rated: list) -> Tool:
    def rate(env, sku: str, stars: int, public: bool) -> str:
        rated.append((sku, stars, public))
        return f"Rated {sku} {stars} stars."

    return Tool("rate", "Rate a product for the customer.",
                {"type": "object", "additionalProperties": False, "required": ["sku", "stars", "public"],
                 "properties": {"sku": {"type": "string", "minLength": 1, "description": "The product SKU."},
                                "stars": {"type": "integer", "enum": [1, 2, 3, 4, 5], "description": "1 to 5."},
                                "public": {"type": "boolean", "description": "Show the rating to others."}}},
                rate, available=lambda env: env.task.family != "after_sales",
                unavailable="{name} needs a shopping task", hint=lambda env: ["rate[..., 5, true]"])


def test_a_registered_tool_is_parsed_checked_dispatched_and_listed():
    rated: list = []
    env, other = ShoppingEnv(catalog_size=SIZE), ShoppingEnv(catalog_size=SIZE)
    tool = _rate_tool(rated)
    env.register_tool(tool)
    # listed: in this env's schemas (after the built-ins), and in valid_actions through its hint
    assert env.tool_schemas == [*tool_schemas(), tool.schema()]
    _, info = env.reset(seed=0, options={"family": "bundle", "task_id": 3})
    assert info["valid_actions"][-1] == "rate[..., 5, true]"
    # dispatched, from both forms, with typed arguments
    obs, reward, term, trunc, info = env.step("rate[B0ABCDEFGH, 4, true]")
    assert info["invalid_action"] is None and "Feedback: Rated B0ABCDEFGH 4 stars." in obs
    env.step(json.dumps({"name": "rate", "arguments": {"sku": "B0X", "stars": 5, "public": False}}))
    assert rated == [("B0ABCDEFGH", 4, True), ("B0X", 5, False)]
    assert type(rated[0][1]) is int
    # checked: each bad call is an invalid action with a reason; the handler never runs, the episode goes on
    bad = {
        "rate[B0X, four, true]": "rate: argument 'stars' must be an integer",
        "rate[B0X, 9, true]": "rate: argument 'stars' must be one of 1, 2, 3, 4, 5",
        "rate[B0X, 4, maybe]": "rate: argument 'public' must be true or false",
        "rate[B0X, 4]": "rate takes 3 argument(s) (sku, stars, public), got 2",
        "rate[ , 4, true]": "rate: argument 'sku' is empty",
        '{"name": "rate", "arguments": {"sku": "B0X", "stars": "4.5", "public": true}}':
            "rate: argument 'stars' must be an integer",
        '{"name": "rate", "arguments": {"sku": "B0X", "stars": true, "public": true}}':
            "rate: argument 'stars' must be an integer",
        '{"name": "rate", "arguments": {"sku": ["B0X"], "stars": 4, "public": true}}':
            "rate: argument 'sku' must be a string",
        '{"name": "rate", "arguments": {"sku": "B0X", "stars": 4}}': "rate: missing argument 'public'",
        '{"name": "rate", "arguments": {"sku": "B0X", "stars": 4, "public": 1, "x": 1}}':
            "rate: unexpected argument(s) ['x']",
    }
    for action, reason in bad.items():
        obs, reward, term, trunc, info = env.step(action)
        assert info["invalid_action"] == reason, action
        assert f"Feedback: Invalid action: {reason}." in obs and not term and not trunc
        env.step("search[shirt]")  # a valid action resets the run of invalid ones
    assert len(rated) == 2
    # availability: the tool's own predicate and message
    env.reset(seed=0, options={"family": "after_sales", "task_id": 1})
    _, _, _, _, info = env.step("rate[B0X, 4, true]")
    assert info["invalid_action"] == "rate needs a shopping task" and "rate[..., 5, true]" not in info["valid_actions"]
    # one env only: the module table and other envs are unchanged
    assert "rate" not in TOOLS and other.tool_schemas == tool_schemas()
    other.reset(seed=0, options={"family": "bundle", "task_id": 3})
    assert other.step("rate[B0X, 4, true]")[4]["invalid_action"].startswith("unknown action 'rate'")


def test_register_tool_refuses_duplicates_and_non_tools():
    env = ShoppingEnv(catalog_size=SIZE)
    with pytest.raises(ConfigError, match="already exists"):
        env.register_tool(dataclasses.replace(TOOLS["search"], description="Other."))
    with pytest.raises(ConfigError, match="takes a shopsim.envs.shopping.tools.Tool"):
        env.register_tool({"name": "rate"})


def test_the_grammar_reads_any_table():
    tools = {**TOOLS, "rate": _rate_tool([])}
    act = parse("rate[B0X, 3, FALSE]", tools=tools)
    assert act == Action("rate", ("B0X", 3, False))
    assert parse(act.to_json(tools), tools=tools) == act
    with pytest.raises(ActionError, match="unknown action"):
        parse("rate[B0X, 3, false]")
