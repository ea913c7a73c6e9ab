"""Gymnasium wrappers that give the numeric envs the spaces Stable-Baselines3, CleanRL and RLlib accept.

Those libraries take a `Box`, `Discrete`, `MultiDiscrete` or `MultiBinary` action and a `Box` (or a `Dict` of
1-D spaces) observation. Two shopsim envs do not fit as they are:

* ``Replenishment-v0`` acts with a hybrid ``Dict(order=MultiBinary(N), quantity=Box(0, q_max, (N,)))``.
  `ReplenishmentBoxAction` takes a plain ``Box(0, q_max, (N,))`` of quantities instead: an order is placed for a SKU
  exactly when its quantity is > 0. This loses nothing: the env's dynamics and costs read only
  ``order * quantity`` and ``order * (quantity > 0)`` (`shopsim.envs.replenishment.step_numpy`), so the hybrid
  action ``(order, quantity)`` and the Box action ``order * quantity`` (`hybrid_to_box`) give the same period
  (tests/test_wrappers.py steps both forms side by side).
* ``ProactiveRec-v0`` observes a `Dict` with 2-D `MultiDiscrete` entries (``history_sid``, ``path_sid``), which
  SB3's ``MultiInputPolicy`` cannot encode. `FlattenRecObservation` flattens them: ``mode="multidiscrete"`` keeps
  a `Dict` of 1-D discrete spaces (SB3 one-hot encodes each entry; ``MultiInputPolicy``), ``mode="box"`` gives one
  float `Box` in [0, 1] with every id divided by its number of values (``MlpPolicy``; much smaller input).

``TwoStageRetrieval-v0`` (`Box` observation, `MultiDiscrete` action) needs no wrapper.

`make_sb3_env` builds any numeric env with the wrappers it needs. For Replenishment it also applies Gymnasium's
`RescaleAction` (the Box action in [-1, 1], since SB3's Gaussian policies start around 0 with unit scale; -1 maps to
quantity 0, i.e. no order, and SB3 clips to the bounds, so "no order" is reachable) and `FlattenObservation` (the
`Dict` of (N,) and (N, L) arrays as one vector, which SB3's ``MlpPolicy`` takes).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shopsim.errors import ConfigError

__all__ = ["FlattenRecObservation", "ReplenishmentBoxAction", "hybrid_to_box", "make_sb3_env"]


def hybrid_to_box(action: dict) -> np.ndarray:
    """The Box-form action of a hybrid Replenishment action: ``order * quantity`` (float32, shape (N,))."""
    return (np.asarray(action["order"], np.float32) * np.asarray(action["quantity"], np.float32)).astype(np.float32)


class ReplenishmentBoxAction(gym.ActionWrapper):
    """Replenishment-v0 with a ``Box(0, q_max, (N,), float32)`` action: per SKU the order quantity; 0 = no order.

    The hybrid action passed on is ``order = (quantity > 0)``, ``quantity`` unchanged. Quantities outside
    [0, q_max] or NaN are not clipped: the env raises its `InvalidActionError` as for a bad hybrid action.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        hybrid = env.action_space
        if not (isinstance(hybrid, spaces.Dict) and set(hybrid.spaces) == {"order", "quantity"}):
            raise ConfigError("ReplenishmentBoxAction wraps shopsim/Replenishment-v0 (a Dict(order, quantity) "
                              f"action space); got {hybrid}")
        q = hybrid["quantity"]
        self.action_space = spaces.Box(q.low, q.high, q.shape, np.float32)

    def action(self, action) -> dict:
        q = np.asarray(action, dtype=np.float32)
        return {"order": (q > 0).astype(np.int8), "quantity": q}


def _flat_nvec(space: spaces.Space) -> np.ndarray:
    if isinstance(space, spaces.Discrete):
        return np.array([space.n], np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(space.nvec, np.int64).reshape(-1)
    raise ConfigError(f"FlattenRecObservation handles Discrete and MultiDiscrete entries, got {space}")


class FlattenRecObservation(gym.ObservationWrapper):
    """ProactiveRec-v0's `Dict` observation with every entry flattened (module docstring).

    ``mode="multidiscrete"``: the same keys, each a 1-D `MultiDiscrete` (a `Discrete` entry stays `Discrete`);
    the values are the env's, reshaped. ``mode="box"``: one ``Box(0, 1, (D,), float32)``, the entries concatenated
    in key order, each id divided by its number of values (``nvec``), so that an id and its padding stay apart.
    """

    MODES = ("multidiscrete", "box")

    def __init__(self, env: gym.Env, mode: str = "multidiscrete"):
        super().__init__(env)
        if mode not in self.MODES:
            raise ConfigError(f"FlattenRecObservation mode={mode!r}; choose one of {', '.join(self.MODES)}")
        obs = env.observation_space
        if not isinstance(obs, spaces.Dict):
            raise ConfigError(f"FlattenRecObservation wraps a Dict observation (ProactiveRec-v0); got {obs}")
        self.mode = mode
        self._nvec = {k: _flat_nvec(s) for k, s in obs.spaces.items()}
        if mode == "multidiscrete":
            self.observation_space = spaces.Dict({
                k: s if isinstance(s, spaces.Discrete) else spaces.MultiDiscrete(self._nvec[k])
                for k, s in obs.spaces.items()})
        else:
            self._scale = np.concatenate([self._nvec[k] for k in obs.spaces]).astype(np.float32)
            self.observation_space = spaces.Box(0.0, 1.0, self._scale.shape, np.float32)

    def observation(self, observation: dict[str, Any]):
        if self.mode == "multidiscrete":
            return {k: v if isinstance(self.env.observation_space[k], spaces.Discrete)
                    else np.asarray(v, np.int64).reshape(-1) for k, v in observation.items()}
        flat = np.concatenate([np.asarray(observation[k], np.float32).reshape(-1) for k in self._nvec])
        return flat / self._scale


def make_sb3_env(env_id: str, *, rec_mode: str = "box", rescale: bool = True, **kwargs) -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)`` wrapped for SB3 / CleanRL: Replenishment gets `ReplenishmentBoxAction` and a
    flat observation (the action rescaled to [-1, 1] when `rescale`), ProactiveRec `FlattenRecObservation(mode=
    rec_mode)` (default "box", for ``MlpPolicy``); TwoStageRetrieval is returned as made. Shopping-v0 (text) and
    the PettingZoo multi-warehouse env are refused."""
    from shopsim.envs import ENV_SPECS, check_env_id

    check_env_id(env_id)
    if env_id not in ENV_SPECS or env_id == "shopsim/Shopping-v0":
        raise ConfigError(f"{env_id} has no SB3 form; use shopsim/Replenishment-v0, shopsim/TwoStageRetrieval-v0 or "
                          "shopsim/ProactiveRec-v0 (Shopping-v0 is a text env: see shopsim.integrations.trl)")
    env = gym.make(env_id, **kwargs)
    if env_id == "shopsim/Replenishment-v0":
        env = gym.wrappers.FlattenObservation(ReplenishmentBoxAction(env))
        if rescale:
            ones = np.ones(env.action_space.shape, np.float32)  # float32 bounds: no precision-loss warning
            env = gym.wrappers.RescaleAction(env, -ones, ones)
    elif env_id == "shopsim/ProactiveRec-v0":
        env = FlattenRecObservation(env, mode=rec_mode)
    return env
