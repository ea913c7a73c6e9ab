"""Shopping-v0 action grammar: text and JSON tool calls parse to the same action, errors have reasons."""

from __future__ import annotations

import json

import pytest

from shopsim.envs.shopping.actions import (
    TOOLS,
    Action,
    ActionError,
    parse,
    parse_json,
    parse_text,
    tool_schemas,
)

# one example argument list per tool (with commas and brackets inside the last argument where allowed)
EXAMPLES = {
    "search": ["waterproof hiking boots, brown"],
    "click": ["< prev"],
    "ask": ["Which color would you like?"],
    "answer": ["I found it [B0ABCDEFGH], shall I buy it?"],
    "remove_from_cart": ["B0ABCDEFGH"],
    "get_order": ["W1234567"],
    "cancel_order": ["W1234567", "ordered by mistake, sorry"],
    "return_item": ["W1234567", "B0ABCDEFGH"],
    "exchange_item": ["W1234567", "B0ABCDEFGH", "B0ZZZZZZZZ"],
}


def _example(name: str) -> Action:
    return Action(name, tuple(EXAMPLES.get(name, [])))


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_text_and_json_forms_are_equivalent(name):
    act = _example(name)
    assert len(act.args) == len(TOOLS[name].arg_names)
    text, js = act.to_text(), act.to_json()
    assert parse(text) == act
    assert parse(js) == act
    # OpenAI style: arguments as a JSON-encoded string; upper-case name; blanks around the text form
    obj = json.loads(js)
    obj["arguments"] = json.dumps(obj["arguments"])
    obj["name"] = obj["name"].upper()
    assert parse(json.dumps(obj)) == act
    assert parse("  " + text.replace(name, name.upper(), 1) + "\n") == act


def test_bare_actions_accept_empty_brackets_and_json_without_arguments():
    for name, tool in TOOLS.items():
        if not tool.arg_names:
            assert parse_text(f"{name}[]") == Action(name)
            assert parse_json(json.dumps({"name": name})) == Action(name)
            assert parse_json(json.dumps({"name": name, "arguments": None})) == Action(name)


def test_webshop_style_actions():
    assert parse("search[3 ounce bottle]") == Action("search", ("3 ounce bottle",))
    assert parse("click[Buy Now]") == Action("click", ("Buy Now",))
    assert parse("click[next >]") == Action("click", ("next >",))
    # numbers in JSON arguments are accepted as their text
    assert parse('{"name": "get_order", "arguments": {"order_id": 1234567}}') == Action("get_order", ("1234567",))


@pytest.mark.parametrize("bad, reason", [
    ("", "empty"),
    ("   ", "empty"),
    ("fly[away]", "unknown action"),
    ("jump", "unknown action"),
    ("search[boots", "missing closing"),
    ("search[]", "empty"),
    ("view_cart[now]", "takes no arguments"),
    ("return_item[W1]", "takes 2 argument"),
    ("exchange_item[W1, B0X]", "takes 3 argument"),
    ("cancel_order[W1, ]", "empty"),
    ("{", "malformed JSON"),
    ('{"name": 3}', "string \"name\""),
    ("[1, 2]", "unknown action"),
    ('{"name": "teleport", "arguments": {}}', "unknown tool"),
    ('{"name": "search", "arguments": {}}', "missing argument"),
    ('{"name": "search", "arguments": {"query": "a", "k": 3}}', "unexpected argument"),
    ('{"name": "search", "arguments": {"query": ["a"]}}', "must be a string"),
    ('{"name": "search", "arguments": {"query": true}}', "must be a string"),
    ('{"name": "search", "arguments": "{not json"}', "not valid JSON"),
    ('{"name": "search", "arguments": [1]}', "must be an object"),
])
def test_malformed_actions_raise_with_a_reason(bad, reason):
    with pytest.raises(ActionError, match=reason):
        parse(bad)


def test_too_long_and_non_string_inputs():
    with pytest.raises(ActionError, match="too long"):
        parse("search[" + "a" * 2000 + "]", max_chars=1000)
    with pytest.raises(ActionError, match="must be a string"):
        parse(None)
    with pytest.raises(ActionError, match="malformed JSON"):  # deep nesting: no RecursionError escapes
        parse('{"name": "search", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}", max_chars=10**6)


def test_tool_schemas_are_openai_style_and_cover_every_tool():
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOLS)
    for s in schemas:
        assert s["type"] == "function"
        params = s["function"]["parameters"]
        assert params["type"] == "object" and params["required"] == list(TOOLS[s["function"]["name"]].arg_names)
        assert set(params["properties"]) == set(params["required"])
