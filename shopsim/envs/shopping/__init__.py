"""Shopping-v0: a multi-turn shopping assistant with a simulated customer (docs/envs.md).

Modules: `env` (the Gymnasium env), `actions` (text grammar + JSON tool calls), `tasks` (families, splits),
`customer` (simulated user), `grading` (reward rules), `orders` (after-sales database), `render` (observations).
"""

from shopsim.envs.shopping.actions import TOOLS, Action, ActionError, parse, tool_schemas
from shopsim.envs.shopping.env import STRATEGIES, ShoppingEnv
from shopsim.envs.shopping.tasks import FAMILIES, SPLITS, make_task

__all__ = ["FAMILIES", "SPLITS", "STRATEGIES", "TOOLS", "Action", "ActionError", "ShoppingEnv", "make_task",
           "parse", "tool_schemas"]
