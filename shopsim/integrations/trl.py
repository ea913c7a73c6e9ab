"""The shopping env as an environment class for TRL's ``GRPOTrainer(environment_factory=...)`` (docs/clients.md).

TRL (``trl>=1.0``) trains tool-using agents through an *environment factory*: a callable returning an object
whose ``reset(**row)`` starts an episode (the dataset row's columns are its keyword arguments; a returned string is
appended to the prompt's last user message), whose public methods are the model's tools (their names, typed
arguments and Google-style docstrings become the JSON tool schema in the prompt) and whose ``get_reward()`` scores
the finished rollout. One instance serves one rollout at a time; TRL pools and resets them.

`environment_class` builds such a class from a Shopping tool table (default: the table of a `ShoppingEnv` built with
the same options, i.e. `shopsim.envs.shopping.tools.TOOLS` plus anything the env registers): one method per tool,
whose docstring is the tool's description with an ``Args:`` line per schema property (``(choices: [...])`` for an
``enum``), and whose arguments carry the schema's types (string -> str, integer -> int, number -> float, boolean ->
bool). A new entry in the tool table is a new method without any change here. Each call sends the JSON tool call to
``ShoppingEnv.step`` and returns the page the env renders next (with the feedback line, or the reason when the call
was an invalid action: invalid calls stay in the episode, as in the env); a call after the episode ended raises
`ValueError` (TRL reports it to the model as a tool error). ``get_reward()`` is the episode's return so far: the
final score (0 until the episode ends) minus invalid-action penalties.

`shopping_environment(**env_kwargs)` is the factory to pass; `task_dataset` builds the matching train dataset
(a ``prompt`` column plus the reset options ``split``, ``task_id``, ``family``, ``seed``). `sft_dataset` turns
episodes into an ``SFTTrainer`` dataset (`shopsim.datasets.to_messages`; in the tool-call form with the same tool
schemas in a ``tools`` column, so that supervised warm-up and GRPO show the model the same prompt).

TRL requirements met outside this module (the tiny test model hits both): the tokenizer's chat template must render
tool calls (TRL's ``supports_tool_calling``) and be one TRL can parse tool calls back from (``add_response_schema``
knows the Qwen, Llama 3.1/3.2, GLM, gpt-oss, Gemma 4, LFM2, ... templates). The shipped domain tokenizer's template
renders tool calls as the env's JSON actions (so `sft_dataset` in its tool-call form gives it non-empty assistant
targets) and tool messages as user messages, but it does not show tool schemas and TRL has no parser for it, so for
``GRPOTrainer`` `tool_chat_template` returns TRL's Qwen 2.5 template to set on it.
"""

from __future__ import annotations

import inspect
import json
import keyword
from typing import Any

from shopsim.errors import ConfigError

__all__ = ["DEFAULT_PROMPT", "environment_class", "sft_dataset", "shopping_environment", "task_dataset",
           "tool_chat_template"]

#: the user message each rollout starts from; `reset` appends the first page of the episode to it
DEFAULT_PROMPT = ("You are a shopping assistant serving a customer in an online shop. Use the tools to search, open "
                  "products, ask the customer, and buy (or handle their order). The first page follows.\n\n")

_PY_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}
_RESERVED = {"reset", "get_reward"}


def _docstring(tool) -> str:
    """The tool's description and a Google-style ``Args:`` block from its schema (what ``get_json_schema`` reads)."""
    lines = [tool.description.strip()]
    props = tool.parameters["properties"]
    if props:
        lines += ["", "Args:"]
        for name, p in props.items():
            desc = " ".join(p["description"].split())
            if "enum" in p:
                desc += f" (choices: {json.dumps(p['enum'])})"
            lines.append(f"    {name}: {desc}")
    lines += ["", "Returns:", "    The page shown after the action, with the shop's feedback."]
    return "\n".join(lines)


def _method(tool):
    """A function ``(self, <schema arguments>) -> str`` that calls `tool` in the instance's episode."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for name, p in tool.parameters["properties"].items():
        if keyword.iskeyword(name):
            raise ConfigError(f"tool {tool.name}: argument {name!r} is a Python keyword; rename it")
        annotations[name] = _PY_TYPES[p["type"]]
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotations[name]))
    annotations["return"] = str
    signature = inspect.Signature(params, return_annotation=str)
    tool_name = tool.name

    def method(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        return self._call(tool_name, arguments)

    method.__name__ = method.__qualname__ = tool_name
    method.__doc__ = _docstring(tool)
    method.__signature__ = signature
    method.__annotations__ = annotations
    return method


class _ShoppingToolEnvBase:
    """The episode logic shared by every generated class (only private names: TRL turns public methods into
    tools)."""

    _env_kwargs: dict = {}
    _tools: dict = {}

    def __init__(self, **env_kwargs):
        from shopsim.envs.shopping import ShoppingEnv

        self.env = ShoppingEnv(**{**self._env_kwargs, **env_kwargs})
        for tool in self._tools.values():  # a custom table: the env must know its extra tools too
            if tool.name not in self.env.tools:
                self.env.register_tool(tool)
        self.reward = 0.0
        self.done = False
        self.info: dict = {}
        self.turns = 0

    def reset(self, split: str | None = None, task_id: int | None = None, family: str | None = None,
              seed: int | None = None, strategy: str | None = None, **row) -> str:
        """Start the episode of the row's task (the shopping env's reset options; other columns such as ``prompt``
        are ignored) and return its first page."""
        options = {k: v for k, v in (("split", split), ("task_id", task_id), ("family", family),
                                     ("strategy", strategy)) if v is not None}
        obs, self.info = self.env.reset(seed=None if seed is None else int(seed), options=options)
        self.reward, self.done, self.turns = 0.0, False, 0
        return obs

    def get_reward(self) -> float:
        """The episode's return so far: its score once it ended, minus invalid-action penalties."""
        return float(self.reward)

    def _call(self, name: str, arguments: dict) -> str:
        if self.env.task is None:
            raise ValueError("no episode: reset() first")
        if self.done:
            raise ValueError("the episode is over; no more tool calls")
        action = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        obs, reward, terminated, truncated, self.info = self.env.step(action)
        self.turns += 1
        self.reward += reward
        self.done = bool(terminated or truncated)
        return obs


def environment_class(tools: dict | None = None, name: str = "ShoppingToolEnv", **env_kwargs) -> type:
    """A class for ``GRPOTrainer(environment_factory=...)`` with one method per tool of `tools` (default: the tool
    table of a `ShoppingEnv` built with `env_kwargs`: `shopsim.envs.shopping.tools.TOOLS` plus any tool the env
    registers itself); instances build their `ShoppingEnv` with `env_kwargs` and register the table's tools it
    lacks."""
    if tools is None:
        from shopsim.envs.shopping import ShoppingEnv

        # the table of an env built with these options: the built-in tools plus any the env adds on construction
        # (the catalog is memoised, so the instances TRL builds later do not pay for it again)
        tools = ShoppingEnv(**env_kwargs).tools
    namespace: dict[str, Any] = {"_env_kwargs": dict(env_kwargs), "_tools": dict(tools), "__module__": __name__,
                                 "__doc__": f"Shopping-env tools for TRL: {', '.join(tools)}."}
    for tool in tools.values():
        if tool.name in _RESERVED or tool.name.startswith("_") or tool.name in namespace:
            raise ConfigError(f"tool name {tool.name!r} clashes with the TRL environment interface "
                              f"({', '.join(sorted(_RESERVED))}); rename the tool")
        namespace[tool.name] = _method(tool)
    return type(name, (_ShoppingToolEnvBase,), namespace)


def shopping_environment(**env_kwargs):
    """The ``environment_factory`` for GRPOTrainer: a class whose instances play the shopping env with `env_kwargs`
    (e.g. ``catalog_size=2000, family="find_and_buy", max_turns=10``)."""
    return environment_class(**env_kwargs)


def task_dataset(n: int, *, split: str = "train", family: str | None = None, seed: int = 0,
                 prompt: str = DEFAULT_PROMPT):
    """A `datasets.Dataset` of `n` rollout prompts: a conversational ``prompt`` column and the reset options
    (``split``, ``task_id`` = the split's first `n` task ids, ``seed`` = `seed` + row, and ``family`` if given)."""
    from datasets import Dataset

    from shopsim.envs.shopping.tasks import split_ids

    ids = split_ids(split)
    if not 1 <= n <= len(ids):
        raise ConfigError(f"n={n}: the {split} split has {len(ids)} tasks; choose 1 to {len(ids)}")
    rows = {"prompt": [[{"role": "user", "content": prompt}] for _ in range(n)],
            "split": [split] * n, "task_id": [int(t) for t in ids[:n]], "seed": [seed + i for i in range(n)]}
    if family is not None:
        rows["family"] = [family] * n
    return Dataset.from_dict(rows)


def sft_dataset(source, *, form: str = "tool_calls", tools: dict | None = None, **kwargs):
    """`shopsim.datasets.to_messages(source, form=form, tools=tools, **kwargs)` as a `datasets.Dataset` for TRL's
    ``SFTTrainer``. Each message is stored with datasets' `Json` feature: a plain Arrow struct would give every tool
    call the union of all argument names (the missing ones None), which the chat template would then render. In the
    tool-call form a ``tools`` column holds the tool schemas (JSON), which ``SFTTrainer`` renders into the prompt."""
    from datasets import Dataset, Features, Json, List, Value

    from shopsim.datasets import to_messages
    from shopsim.envs.shopping.tools import TOOLS, tool_schemas

    rows = to_messages(source, form=form, tools=tools, **kwargs)
    features = {"messages": List(Json())}
    if form == "tool_calls":
        schemas = json.dumps(tool_schemas(TOOLS if tools is None else tools))
        rows = [{**row, "tools": schemas} for row in rows]
        features["tools"] = Value("string")
    return Dataset.from_list(rows, features=Features(features))


def tool_chat_template() -> str:
    """TRL's copy of the Qwen 2.5 chat template: renders tool schemas and tool calls, and TRL parses its
    ``<tool_call>`` blocks back (set it as ``tokenizer.chat_template`` for a tokenizer whose template has no tools)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template
