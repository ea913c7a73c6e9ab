"""Algorithm registry: `baselines.make(name, env_id=..., **overrides)`, `available()`, `register(...)`.

One name can exist for several env families (``ppo`` trains the LM agent on Shopping and the Gaussian hybrid
policy on Replenishment); the env id (or `family=`) picks the implementation. A third-party algorithm is either
registered with `register("myalgo", "mypkg.module:MyAlgo", family="shopping")` or used directly by import path:
``baselines.make("mypkg.module:MyAlgo")`` / ``shopsim train --algo mypkg.module:MyAlgo``.
"""

from __future__ import annotations

import importlib
from typing import Any

from baselines.base import Algorithm
from shopsim.envs import family_of
from shopsim.errors import UnknownNameError

#: (name, family) -> "module:Class". Imported only when made.
_REGISTRY: dict[tuple[str, str], str] = {
    # language agents (the shopping env)
    ("reinforce", "shopping"): "baselines.reinforce:Reinforce",
    ("ppo", "shopping"): "baselines.ppo:PPO",
    ("grpo", "shopping"): "baselines.grpo:GRPO",
    ("dapo", "shopping"): "baselines.dapo:DAPO",
    ("gigpo", "shopping"): "baselines.gigpo:GiGPO",
    ("vapo", "shopping"): "baselines.vapo:VAPO",
    ("mpo", "shopping"): "baselines.mpo:MPO",
    ("wapo", "shopping"): "baselines.wapo:WAPO",
    ("bipace", "shopping"): "baselines.bipace:BiPACE",
    ("basis", "shopping"): "baselines.basis:BASIS",
    ("arc", "shopping"): "baselines.arc:ARC",
    ("tropd", "shopping"): "baselines.tropd:TrOPD",
    ("delta", "shopping"): "baselines.delta:DelTA",
    ("midtrain", "shopping"): "baselines.midtrain:MidTrain",
    # proactive recommendation
    ("reinforce", "rec"): "baselines.prorl:RecReinforce",
    ("grpo", "rec"): "baselines.prorl:RecGRPO",
    ("prorl", "rec"): "baselines.prorl:ProRL",
    # two-stage retrieval (CA-PG family, one module)
    ("vpg", "retrieval"): "baselines.capg:VPG",
    ("vpg_swr", "retrieval"): "baselines.capg:VPGSwR",
    ("capg", "retrieval"): "baselines.capg:CAPG",
    ("capg_swr", "retrieval"): "baselines.capg:CAPGSwR",
    ("top1", "retrieval"): "baselines.capg:Top1",
    # inventory: the replenishment and multi-warehouse envs
    ("ppo", "inventory"): "baselines.hybrid_ppo:HybridPPO",
    ("hpo", "inventory"): "baselines.hpo:HPO",
}

#: the family used when a name exists in several and neither env_id nor family is given
DEFAULT_FAMILY = "shopping"


def register(name: str, target: str | type, *, family: str = DEFAULT_FAMILY, overwrite: bool = False) -> None:
    """Register an `Algorithm` subclass (or its "module:Class" path) under `name` for an env family."""
    key = (name, family)
    if key in _REGISTRY and not overwrite:
        raise ValueError(f"algorithm {name!r} is already registered for {family!r}; pass overwrite=True")
    _REGISTRY[key] = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def available(env_id: str | None = None, family: str | None = None) -> list[str]:
    """Registered algorithm names (for one env or family if given)."""
    if env_id is not None:
        family = family_of(env_id)
    return sorted({n for n, f in _REGISTRY if family is None or f == family})


def load_target(target: str) -> type:
    module, sep, attr = target.partition(":")
    if not sep or not attr:
        raise UnknownNameError(f"{target!r} is not an import path; write it as 'package.module:ClassName'")
    try:
        obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise UnknownNameError(f"cannot import {module!r} for algorithm {target!r}: {exc}") from exc
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise UnknownNameError(f"module {module!r} has no attribute {attr!r}") from exc
    return obj


def resolve(name: str, *, env_id: str | None = None, family: str | None = None) -> type[Algorithm]:
    """The algorithm class for `name` (a registered name or 'module:Class')."""
    if ":" in name:
        return load_target(name)
    if env_id is not None:
        family = family_of(env_id)
    families = sorted(f for n, f in _REGISTRY if n == name)
    if not families:
        raise UnknownNameError(f"unknown algorithm {name!r}; available: {', '.join(available())}")
    if family is None:
        family = families[0] if len(families) == 1 else DEFAULT_FAMILY
    if (name, family) not in _REGISTRY:
        raise UnknownNameError(
            f"algorithm {name!r} does not train {family!r} envs (it trains: {', '.join(families)}); "
            f"algorithms for {family!r}: {', '.join(available(family=family))}"
        )
    return load_target(_REGISTRY[(name, family)])


def make(name: str, *, env_id: str | None = None, family: str | None = None, **overrides: Any):
    """Build an algorithm with config `overrides` (unknown keys raise a ConfigError listing the valid ones)."""
    cls = resolve(name, env_id=env_id, family=family)
    return cls(**overrides)
