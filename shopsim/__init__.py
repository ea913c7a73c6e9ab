"""shopsim: simulated e-commerce environments for RL, with baseline trainers.

Importing the package registers the environments with Gymnasium (`gymnasium.make("shopsim/Shopping-v0")`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from shopsim import envs as envs  # noqa: E402  (registers the env ids)
from shopsim.envs import all_env_ids, family_of, make  # noqa: E402

__all__ = ["__version__", "all_env_ids", "family_of", "make"]
