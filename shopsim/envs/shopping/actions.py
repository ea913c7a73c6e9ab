"""The shopping env's action language: a WebShop-compatible text grammar and an equivalent JSON tool-call form.

An agent sends one string per step. A string whose first non-blank character is ``{`` is read as a JSON tool
call ``{"name": ..., "arguments": {...}}`` (``arguments`` may also be a JSON-encoded string, as OpenAI-style
function calling sends it); anything else is read as text. Both forms parse into the same `Action`
(name + tuple of argument values), so the env never sees which form was used.

The tools themselves (names, descriptions, argument schemas, handlers) are one table, `tools.TOOLS`; this
module reads any such table. For a tool with arguments ``a, b`` the two forms are

    text:  name[a, b]                                   JSON:  {"name": "name", "arguments": {"a": ..., "b": ...}}

e.g. ``search[waterproof boots]``, ``click[#3]``, ``cancel_order[W1234567, no longer needed]``, ``view_cart``.

Action names are case-insensitive; argument text is stripped of surrounding blanks. Arguments of the
multi-argument tools are separated by commas in the text form; the last argument takes the rest of the text
(so a cancellation reason may contain commas). A bare action may also be written with empty brackets
(``view_cart[]``). Argument values are checked against the tool's schema (`tools.check_arguments`). Anything
else raises `ActionError` with a reason, which the env reports as an invalid action.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shopsim.envs.shopping.tools import TOOLS, ActionError, Tool, check_arguments, tool_schemas

__all__ = ["DEFAULT_MAX_INPUT_CHARS", "TOOLS", "Action", "ActionError", "Tool", "parse", "parse_json", "parse_text",
           "tool_schemas"]

#: a string longer than this (before stripping) is rejected without being parsed
DEFAULT_MAX_INPUT_CHARS = 1000


@dataclass(frozen=True)
class Action:
    """One parsed action: a tool name and its checked argument values in the tool's schema order."""

    name: str
    args: tuple = ()

    def to_text(self) -> str:
        """The canonical text form (``name`` or ``name[a, b]``)."""
        if not self.args:
            return self.name
        return f"{self.name}[{', '.join(map(str, self.args))}]"

    def to_json(self, tools: dict[str, Tool] | None = None) -> str:
        """The canonical JSON tool-call form (argument names from `tools`, default `TOOLS`)."""
        names = (TOOLS if tools is None else tools)[self.name].arg_names
        return json.dumps({"name": self.name, "arguments": dict(zip(names, self.args, strict=True))},
                          ensure_ascii=False)


def _tool(name: str, tools: dict[str, Tool] | None) -> Tool | None:
    return (TOOLS if tools is None else tools).get(name)


def parse_text(text: str, tools: dict[str, Tool] | None = None) -> Action:
    """Parse the text grammar (module docstring) against `tools` (default `TOOLS`)."""
    s = text.strip()
    if not s:
        raise ActionError("empty action")
    bracket = s.find("[")
    if bracket < 0:
        tool = _tool(s.lower(), tools)
        if tool is None:
            raise ActionError(f"unknown action {_short(s)!r}; use e.g. search[...], click[...], ask[...], answer[...]")
        return _positional(tool, [])
    if not s.endswith("]"):
        raise ActionError("missing closing ']'")
    tool = _tool(s[:bracket].strip().lower(), tools)
    if tool is None:
        raise ActionError(f"unknown action {_short(s[:bracket])!r}")
    inner = s[bracket + 1:-1]
    n = len(tool.arg_names)
    if n == 0:
        if inner.strip():
            raise ActionError(f"{tool.name} takes no arguments")
        return Action(tool.name)
    return _positional(tool, inner.split(",", n - 1) if n > 1 else [inner])


def _positional(tool: Tool, args: list[str]) -> Action:
    names = tool.arg_names
    if len(args) != len(names):
        want = ", ".join(names) or "no arguments"
        raise ActionError(f"{tool.name} takes {len(names)} argument(s) ({want}), got {len(args)}")
    return Action(tool.name, check_arguments(tool, dict(zip(names, args, strict=True))))


def parse_json(text: str, tools: dict[str, Tool] | None = None) -> Action:
    """Parse a JSON tool call ``{"name": ..., "arguments": {...}}`` against `tools` (default `TOOLS`)."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ActionError(f"malformed JSON tool call ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ActionError('a JSON tool call must be an object with a string "name"')
    tool = _tool(obj["name"].strip().lower(), tools)
    if tool is None:
        raise ActionError(f"unknown tool {_short(obj['name'])!r}")
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise ActionError(f"{tool.name}: arguments are not valid JSON") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ActionError(f"{tool.name}: arguments must be an object")
    return Action(tool.name, check_arguments(tool, arguments))


def parse(text, max_chars: int = DEFAULT_MAX_INPUT_CHARS, tools: dict[str, Tool] | None = None) -> Action:
    """Parse one agent action string in either form against `tools` (default `TOOLS`); raises `ActionError`."""
    if not isinstance(text, str):
        raise ActionError(f"an action must be a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise ActionError(f"action too long ({len(text)} characters; at most {max_chars})")
    if text.lstrip().startswith("{"):
        return parse_json(text, tools)
    return parse_text(text, tools)


def _short(s: str, n: int = 40) -> str:
    s = str(s)
    return s if len(s) <= n else s[: n - 3] + "..."
