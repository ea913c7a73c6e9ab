"""Gymnasium wrappers that give the numeric envs the spaces Stable-Baselines3, CleanRL and RLlib accept.

Those libraries take a `Box`, `Discrete`, `MultiDiscrete` or `MultiBinary` action and a `Box` (or a `Dict` of
1-D spaces) observation. Two shopsim envs do not fit as they are:

* the replenishment env (`shopsim.envs.replenishment`) acts with a hybrid
  ``Dict(order=MultiBinary(N), quantity=Box(0, q_max, (N,)))``.
  `ReplenishmentBoxAction` takes a plain ``Box(0, q_max, (N,))`` of quantities instead: an order is placed for a SKU
  exactly when its quantity is > 0. This loses nothing: the env's dynamics and costs read only
  ``order * quantity`` and ``order * (quantity > 0)`` (`shopsim.envs.replenishment.step_numpy`), so the hybrid
  action ``(order, quantity)`` and the Box action ``order * quantity`` (`hybrid_to_box`) give the same period
  (tests/test_wrappers.py steps both forms side by side).
* the proactive-recommendation env (`shopsim.envs.proactive_rec`) observes a `Dict` with 2-D `MultiDiscrete` entries
  (``history_sid``, ``path_sid``), which SB3's ``MultiInputPolicy`` cannot encode. `FlattenRecObservation` flattens
  them: ``mode="multidiscrete"`` keeps a `Dict` of 1-D discrete spaces (SB3 one-hot encodes each entry;
  ``MultiInputPolicy``), ``mode="box"`` gives one float `Box` in [0, 1] with every id divided by its number of values
  (``MlpPolicy``; much smaller input).

The two-stage retrieval env (`Box` observation, `MultiDiscrete` action) needs no wrapper.

`make_sb3_env` builds any env whose record names an ``sb3_wrapper`` (`shopsim.envs.record.EnvRecord`: one of the
``sb3_*`` functions here) with the wrappers it needs. For replenishment it also applies Gymnasium's
`RescaleAction` (the Box action in [-1, 1], since SB3's Gaussian policies start around 0 with unit scale; -1 maps to
quantity 0, i.e. no order, and SB3 clips to the bounds, so "no order" is reachable) and `FlattenObservation` (the
`Dict` of (N,) and (N, L) arrays as one vector, which SB3's ``MlpPolicy`` takes).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shopsim.errors import ConfigError, ShopsimError

__all__ = ["FlattenRecObservation", "ReplenishmentBoxAction", "ReplenishmentNeutralAction", "hybrid_to_box",
           "make_sb3_env", "neutral_order", "neutral_action_to_quantity"]

#: `ReplenishmentNeutralAction`'s rules for the order at action 0
NEUTRAL_RULES = ("s_S", "base_stock")
#: half-width of the band of actions around 0 that all give the neutral order (`neutral_action_to_quantity`)
NEUTRAL_BAND = 0.25


def hybrid_to_box(action: dict) -> np.ndarray:
    """The Box-form action of a hybrid Replenishment action: ``order * quantity`` (float32, shape (N,))."""
    return (np.asarray(action["order"], np.float32) * np.asarray(action["quantity"], np.float32)).astype(np.float32)


class ReplenishmentBoxAction(gym.ActionWrapper):
    """The replenishment env with a ``Box(0, q_max, (N,), float32)`` action: per SKU the order quantity; 0 = no order.

    The hybrid action passed on is ``order = (quantity > 0)``, ``quantity`` unchanged. Quantities outside
    [0, q_max] or NaN are not clipped: the env raises its `InvalidActionError` as for a bad hybrid action.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        hybrid = env.action_space
        if not (isinstance(hybrid, spaces.Dict) and set(hybrid.spaces) == {"order", "quantity"}
                and isinstance(hybrid["quantity"], spaces.Box)):
            raise ConfigError("ReplenishmentBoxAction wraps the replenishment env (a Dict(order, quantity) "
                              f"action space); got {hybrid}")
        q = hybrid["quantity"]
        assert isinstance(q, spaces.Box)  # checked above
        self.action_space = spaces.Box(q.low, q.high, q.shape, np.float32)

    def action(self, action) -> dict:
        q = np.asarray(action, dtype=np.float32)
        return {"order": (q > 0).astype(np.int8), "quantity": q}


def _inv_normal_cdf(p: np.ndarray) -> np.ndarray:
    from statistics import NormalDist

    nd = NormalDist()
    return np.array([nd.inv_cdf(float(min(max(x, 1e-6), 1 - 1e-6))) for x in np.ravel(p)]).reshape(np.shape(p))


def neutral_order(obs: dict[str, Any], q_max: float, rule: str = "s_S") -> np.ndarray:
    """The order per SKU at `ReplenishmentNeutralAction`'s action 0, from the env's own observation (float64, (N,)).

    With mean demand mu, holding h, backlog b, fixed cost K (all observed), lead time L (the pipeline's columns) and
    inventory position ``ip = on_hand + pipeline.sum()``:

    * the base-stock level ``S_b = mu (L+1) + z sqrt(mu (L+1))``, z the normal quantile of the newsvendor ratio
      b / (b + h) (Poisson standard deviation over the L+1 periods an order has to cover);
    * ``rule="base_stock"``: order ``S_b - ip`` when positive;
    * ``rule="s_S"`` (default): an (s, S) rule with the economic order quantity ``Q = sqrt(2 K mu / h)``: when
      ``ip <= s = S_b - mu``, order up to ``s + Q``; else no order.

    Clipped to [0, q_max]."""
    if rule not in NEUTRAL_RULES:
        raise ConfigError(f"neutral rule {rule!r}; choose one of {', '.join(NEUTRAL_RULES)}")
    get = lambda k: np.asarray(obs[k], np.float64)  # noqa: E731
    mu, h, b, k = get("demand_mean"), get("holding"), get("backlog"), get("fixed")
    pipe = get("pipeline")
    ip = get("on_hand") + pipe.sum(-1)
    cover = mu * (pipe.shape[-1] + 1)
    base = cover + _inv_normal_cdf(b / np.maximum(b + h, 1e-12)) * np.sqrt(cover)
    if rule == "base_stock":
        return np.clip(base - ip, 0.0, q_max)
    s = base - mu
    eoq = np.sqrt(2.0 * k * mu / np.maximum(h, 1e-9))
    return np.where(ip <= s, np.clip(s + eoq - ip, 0.0, q_max), 0.0)


def neutral_action_to_quantity(action, q0, q_max: float, band: float | None = None) -> np.ndarray:
    """`ReplenishmentNeutralAction`'s map from an action in [-1, 1] to an order quantity in [0, q_max] (float64).

    Monotone and piecewise around the neutral order `q0`: every action in the band ``|a| <= band`` gives q0; below
    it the quantity falls linearly to 0 at ``a = -1`` (no order), above it it rises quadratically to q_max at
    ``a = +1`` (so that actions just past the band stay near q0). Default band: `NEUTRAL_BAND`."""
    d = NEUTRAL_BAND if band is None else float(band)
    a = np.asarray(action, np.float64)
    q0 = np.asarray(q0, np.float64)
    lo = q0 * np.clip((a + 1.0) / (1.0 - d), 0.0, 1.0)
    hi = q0 + (q_max - q0) * np.clip((a - d) / (1.0 - d), 0.0, 1.0) ** 2
    return np.clip(np.where(a < -d, lo, np.where(a > d, hi, q0)), 0.0, q_max)


class ReplenishmentNeutralAction(gym.Wrapper):
    """The replenishment env with a ``Box(-1, 1, (N,), float32)`` action around a sensible order at 0 (`make_sb3_env`'s
    default for Replenishment).

    Per SKU, ``a = -1`` is no order, ``a = 0`` the neutral order `neutral_order` (an (s, S) rule or a base-stock
    order computed from the current observation: demand mean, costs, lead time, inventory position), ``a = +1``
    the largest order q_max, linear in between below 0 and quadratic above (`neutral_action_to_quantity`). So an
    untrained Gaussian policy (mean 0) starts from the neutral rule rather than from half of q_max, and every
    quantity in [0, q_max] stays reachable in every state. An order is placed exactly where the quantity is > 0.
    Actions outside [-1, 1] or NaN raise the env's `InvalidActionError`; SB3 clips its samples to the bounds.
    """

    def __init__(self, env: gym.Env, neutral: str = "s_S"):
        super().__init__(env)
        hybrid = env.action_space
        if not (isinstance(hybrid, spaces.Dict) and set(hybrid.spaces) == {"order", "quantity"}
                and isinstance(hybrid["quantity"], spaces.Box)):
            raise ConfigError("ReplenishmentNeutralAction wraps the replenishment env (a Dict(order, quantity) "
                              f"action space); got {hybrid}")
        if neutral not in NEUTRAL_RULES:
            raise ConfigError(f"ReplenishmentNeutralAction neutral={neutral!r}; choose one of "
                              f"{', '.join(NEUTRAL_RULES)}")
        self.neutral = neutral
        q = hybrid["quantity"]
        assert isinstance(q, spaces.Box)  # checked above
        self.q_max = float(q.high.max())
        n = q.shape
        self.action_space = spaces.Box(-1.0, 1.0, n, np.float32)
        self._obs: dict | None = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._obs = obs
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(self.action(action))
        self._obs = obs
        return obs, reward, terminated, truncated, info

    def action(self, action) -> dict:
        """The hybrid action of a Box action in the current state."""
        from shopsim.envs.replenishment import InvalidActionError

        if self._obs is None:
            raise ShopsimError("call reset() before step()")
        a = np.asarray(action, np.float64)
        if a.shape != self.action_space.shape or not np.isfinite(a).all() or np.abs(a).max() > 1 + 1e-6:
            raise InvalidActionError(f"action must be {self.action_space.shape} floats in [-1, 1], got {action!r}")
        q = neutral_action_to_quantity(a, neutral_order(self._obs, self.q_max, self.neutral), self.q_max)
        return {"order": (q > 0).astype(np.int8), "quantity": q.astype(np.float32)}


def _flat_nvec(space: spaces.Space) -> np.ndarray:
    if isinstance(space, spaces.Discrete):
        return np.array([space.n], np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(space.nvec, np.int64).reshape(-1)
    raise ConfigError(f"FlattenRecObservation handles Discrete and MultiDiscrete entries, got {space}")


class FlattenRecObservation(gym.ObservationWrapper):
    """The proactive-recommendation env's `Dict` observation with every entry flattened (module docstring).

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
            raise ConfigError(f"FlattenRecObservation wraps a Dict observation (the proactive-recommendation env); "
                              f"got {obs}")
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
            space = self.env.observation_space
            assert isinstance(space, spaces.Dict)  # checked in __init__
            return {k: v if isinstance(space[k], spaces.Discrete)
                    else np.asarray(v, np.int64).reshape(-1) for k, v in observation.items()}
        flat = np.concatenate([np.asarray(observation[k], np.float32).reshape(-1) for k in self._nvec])
        return flat / self._scale


#: `make_sb3_env`'s Replenishment action forms: around a neutral rule (`ReplenishmentNeutralAction`), or the
#: order quantity itself (`ReplenishmentBoxAction`, rescaled to [-1, 1] unless ``rescale=False``)
REPL_ACTIONS = (*NEUTRAL_RULES, "quantity")


def make_sb3_env(env_id: str, *, rec_mode: str = "box", repl_action: str = "s_S", rescale: bool = True,
                 **kwargs) -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)`` wrapped for SB3 / CleanRL by the function its record names
    (``sb3_wrapper``; `sb3_replenishment`, `sb3_proactive_rec`, `sb3_as_made`), which reads the options below that
    concern its env. An env without one (a text env, a PettingZoo env) is refused.

    Replenishment: a ``Box(-1, 1, (N,))`` action and a flat observation. ``repl_action="s_S"`` (default) or
    ``"base_stock"``: `ReplenishmentNeutralAction` with that neutral rule (0 = the rule's order, -1 = no order,
    +1 = q_max); ``"quantity"``: the order quantity itself (`ReplenishmentBoxAction`), rescaled to [-1, 1] when
    `rescale` (-1 = no order, 0 = q_max / 2; the form before the neutral action) or ``Box(0, q_max)`` without.
    ProactiveRec: `FlattenRecObservation(mode=rec_mode)` (default "box", for ``MlpPolicy``) and, unless
    ``action_mode`` is given, ``action_mode="item"``: a ``Discrete(n_items + 1)`` item id (the last is stop), so that
    every action names an existing item; with ``action_mode="semantic_id"`` almost every uniformly drawn digit tuple
    names no item and is penalised, and a policy that stops at once scores above such random actions."""
    import importlib

    from shopsim.envs import RECORDS, env_record

    record = env_record(env_id)
    if record.sb3_wrapper is None:
        usable = [r.id for r in RECORDS.values() if r.sb3_wrapper]
        hint = " (a text env: see shopsim.integrations.trl)" if record.text else ""
        raise ConfigError(f"{env_id} has no SB3 form{hint}; use one of {', '.join(usable)}")
    if repl_action not in REPL_ACTIONS:
        raise ConfigError(f"repl_action={repl_action!r}; choose one of {', '.join(REPL_ACTIONS)}")
    module, _, attr = record.sb3_wrapper.partition(":")
    wrap = getattr(importlib.import_module(module), attr)
    return wrap(env_id, rec_mode=rec_mode, repl_action=repl_action, rescale=rescale, **kwargs)


def sb3_replenishment(env_id: str, *, repl_action: str = "s_S", rescale: bool = True, rec_mode: str = "box",
                      **kwargs) -> gym.Env:
    """The replenishment env for SB3 (`make_sb3_env`): a Box action (`repl_action`, `rescale`) and a flat
    observation; `rec_mode` is not its option and is ignored."""
    env = gym.make(env_id, **kwargs)
    if repl_action == "quantity":
        env = gym.wrappers.FlattenObservation(ReplenishmentBoxAction(env))
        if rescale:
            shape = env.action_space.shape
            assert shape is not None  # the Box of ReplenishmentBoxAction
            ones = np.ones(shape, np.float32)  # float32 bounds: no precision-loss warning
            env = gym.wrappers.RescaleAction(env, -ones, ones)
        return env
    return gym.wrappers.FlattenObservation(ReplenishmentNeutralAction(env, neutral=repl_action))


def sb3_proactive_rec(env_id: str, *, rec_mode: str = "box", repl_action: str = "s_S", rescale: bool = True,
                      **kwargs) -> gym.Env:
    """The proactive-recommendation env for SB3 (`make_sb3_env`): item-id actions unless ``action_mode`` is given,
    the observation flattened (`rec_mode`); `repl_action` and `rescale` are not its options and are ignored."""
    kwargs.setdefault("action_mode", "item")
    return FlattenRecObservation(gym.make(env_id, **kwargs), mode=rec_mode)


def sb3_as_made(env_id: str, *, rec_mode: str = "box", repl_action: str = "s_S", rescale: bool = True,
                **kwargs) -> gym.Env:
    """An env whose spaces SB3 takes as they are (`make_sb3_env`); the wrapper options are ignored."""
    return gym.make(env_id, **kwargs)
