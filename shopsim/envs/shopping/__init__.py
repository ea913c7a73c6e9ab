"""Shopping-v0: a multi-turn shopping assistant with a simulated customer (docs/envs.md).

Modules: `env` (the Gymnasium env), `tools` (the tool table: name -> schema + handler), `actions` (text grammar +
JSON tool calls over that table), `tasks` (families, splits),
`customer` (simulated user), `profiles` (personalized_buy profiles), `paraphrase` (reworded instructions),
`grading` (reward rules), `orders` (after-sales database), `render` (observations).
"""

from shopsim.envs.shopping.actions import Action, parse
from shopsim.envs.shopping.env import STRATEGIES, ShoppingEnv
from shopsim.envs.shopping.tasks import ALL_FAMILIES, FAMILIES, SPLITS, make_task
from shopsim.envs.shopping.tools import TOOLS, ActionError, Tool, tool_schemas

__all__ = ["ALL_FAMILIES", "FAMILIES", "SPLITS", "STRATEGIES", "TOOLS", "Action", "ActionError", "ShoppingEnv",
           "Tool", "make_task", "parse", "tool_schemas"]
