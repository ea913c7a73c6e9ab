"""Baseline RL algorithms, one module per algorithm, plus a shared core (`baselines.core`).

`baselines.make(name, env_id=..., **overrides)`, `baselines.available()`, `baselines.register(...)`.
Keep shopsim in its own virtual environment: `baselines` is a generic top-level name.
"""

from baselines.base import Algorithm, TrainResult
from baselines.registry import available, make, register, resolve

__all__ = ["Algorithm", "TrainResult", "available", "make", "register", "resolve"]
