"""Random text agent for the shopping env (`shopsim.envs.shopping`): the lower reference row.

It picks uniformly among ``info["valid_actions"]``; a template entry (one ending in ``[...]``, e.g. ``search[...]``,
``ask[...]``, ``exchange_item[W1, B0X, ...]``) gets 1-4 words drawn from the current observation in place of the
dots. All randomness comes from the generator seeded by ``reset(num_slots, seed)``.
"""

from __future__ import annotations

import re

from agents.base import ScriptedAgent
from shopsim.envs.records import SHOPPING

_WORD = re.compile(r"[A-Za-z0-9]+")


class RandomTextAgent(ScriptedAgent):
    """Uniform over the env's valid actions (see module docstring)."""

    name = "random"

    def __init__(self, env_id: str = SHOPPING.id, max_words: int = 4):
        self.env_id = env_id
        self.max_words = int(max_words)
        self.reset(1, 0)

    def act_one(self, slot, observation, info):
        actions = list(info.get("valid_actions") or ["search[...]"])
        action = actions[int(self.rng.integers(len(actions)))]
        if action.endswith(("[...]", ", ...]")):
            words = _WORD.findall(observation if isinstance(observation, str) else "") or ["item"]
            k = int(self.rng.integers(1, self.max_words + 1))
            filler = " ".join(words[int(i)] for i in self.rng.integers(0, len(words), size=k))
            action = action[: -len("...]")] + filler + "]"
        return action
