"""Generated text -> env action for the shopping env (text grammar or JSON tool call).

The env parses and validates actions itself (``search[...]``, ``click[...]``, ``{"name": ..., "arguments": ...}``);
this module only cuts the model's output down to the one action it wrote. Anything it cannot recognise goes to the
env unchanged, so the env flags it as an invalid action with its reason (never dropped or "repaired" here: a repair
would hide the model's mistakes from the reward).
"""

from __future__ import annotations

import json
import re

_GRAMMAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[.*\])?$", re.DOTALL)


#: the tags chat templates wrap a tool call in (Qwen 2.5 / Hermes ``<tool_call>``, Mistral ``[TOOL_CALLS]``,
#: Llama 3.1 ``<|python_tag|>``); the call inside is the JSON object
_TOOL_TAGS = re.compile(r"^(<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>)\s*")


def extract_action(text: str) -> str:
    """The action in a generated text: a JSON object (also inside a chat template's tool-call tag), one grammar
    action, or the stripped text as is."""
    text = text.strip()
    tagged = _TOOL_TAGS.match(text)
    if tagged:
        text = text[tagged.end():].lstrip()
        if text.startswith("["):  # a list of calls (Mistral): the first one
            text = text[1:].lstrip()
    if text.startswith("{"):
        try:
            obj, end = json.JSONDecoder().raw_decode(text)
        except json.JSONDecodeError:
            return text
        if not isinstance(obj, dict):
            return text
        if "arguments" not in obj and "parameters" in obj:  # the Llama 3.1 template's name for the arguments
            obj = dict(obj)
            obj["arguments"] = obj.pop("parameters")
        return json.dumps(obj, ensure_ascii=False)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if _GRAMMAR.match(first):
        return first
    return text


def decode_action(tokenizer, action_ids: list[int]) -> str:
    """Decode generated ids (special tokens such as the stop token dropped) and extract the action."""
    return extract_action(tokenizer.decode(action_ids, skip_special_tokens=True))


def is_tool_call(action: str) -> bool:
    """Whether an extracted action is a JSON tool call (``{"name": ..., "arguments": {...}}``)."""
    try:
        obj = json.loads(action)
    except (TypeError, json.JSONDecodeError):
        return False
    return isinstance(obj, dict) and "name" in obj
