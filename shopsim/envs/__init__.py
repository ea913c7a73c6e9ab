"""Environment registry: every shopsim env id, its entry point and its family.

Importing `shopsim` (or `shopsim.envs`) registers the ids with Gymnasium, so
``gymnasium.make("shopsim/Shopping-v0")`` works. The multi-warehouse env is a PettingZoo `ParallelEnv`
and is made with `shopsim.envs.multi_warehouse.parallel_env(...)` (PettingZoo has no registry in common use).

Families group envs by the kind of agent and trainer that fits them:

| family | envs | agents / trainers |
|---|---|---|
| shopping | Shopping-v0 | language agents; LM baselines |
| rec | ProactiveRec-v0 | semantic-ID transformer; reinforce/grpo/prorl |
| retrieval | TwoStageRetrieval-v0 | Plackett-Luce retrievers; capg family |
| inventory | Replenishment-v0, multi_warehouse | torch hybrid policies; ppo/hpo |
"""

from __future__ import annotations

import os
import sys

from gymnasium.envs.registration import register, registry

from shopsim.errors import UnknownNameError

MULTI_WAREHOUSE_ID = "shopsim/MultiWarehouse-v0"

#: env id -> (entry point, family, registration kwargs)
ENV_SPECS: dict[str, tuple[str, str, dict]] = {
    # --- language envs ---
    "shopsim/Shopping-v0": ("shopsim.envs.shopping:ShoppingEnv", "shopping", {"max_episode_steps": 60}),
    # --- recommendation / retrieval envs ---
    "shopsim/ProactiveRec-v0": ("shopsim.envs.proactive_rec:ProactiveRecEnv", "rec", {}),
    "shopsim/TwoStageRetrieval-v0": ("shopsim.envs.two_stage_retrieval:TwoStageRetrievalEnv", "retrieval", {}),
    # --- numeric envs ---
    "shopsim/Replenishment-v0": ("shopsim.envs.replenishment:ReplenishmentEnv", "inventory", {}),
}

#: PettingZoo envs (not in Gymnasium's registry): id -> (module, family)
PZ_ENVS: dict[str, tuple[str, str]] = {
    MULTI_WAREHOUSE_ID: ("shopsim.envs.multi_warehouse", "inventory"),
}



def _torch_single_thread_in_forked_child() -> None:
    """Run torch single-threaded in a process forked from one that imported torch.

    The Linux torch wheels use GNU OpenMP for their intra-op thread pool, and libgomp is not fork-safe: once the parent
    has run a parallel region (building ProactiveRec's SASRec simulator does), a forked child inherits the pool's
    bookkeeping but not its threads, and its first multi-threaded op waits forever for them (the
    `AsyncVectorEnv(context="fork")` hang, Linux's default start method). With one thread an op runs inline and never
    touches the pool. Env worker processes run one env each, so one thread is also what they should use; a child
    that needs more threads can start with spawn or forkserver, where torch starts fresh.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


# at fork time, in the child, before any user code runs (once per interpreter: this module is imported once)
os.register_at_fork(after_in_child=_torch_single_thread_in_forked_child)

for _env_id, (_entry, _family, _kw) in ENV_SPECS.items():
    if _env_id not in registry:
        register(id=_env_id, entry_point=_entry, **_kw)


def all_env_ids() -> list[str]:
    return [*ENV_SPECS, *PZ_ENVS]


def family_of(env_id: str) -> str:
    """The family of an env id (see module docstring); raises with the list of known ids."""
    if env_id in ENV_SPECS:
        return ENV_SPECS[env_id][1]
    if env_id in PZ_ENVS:
        return PZ_ENVS[env_id][1]
    raise UnknownNameError(f"unknown env {env_id!r}; available: {', '.join(all_env_ids())}")


def check_env_id(env_id: str) -> str:
    family_of(env_id)
    return env_id


def presentation_kwargs(env_id: str) -> frozenset:
    """Constructor options of `env_id` that change only how observations are rendered, not the task (the env class's
    ``PRESENTATION_KWARGS``): an agent may pick them (e.g. the rendering it was trained on) in a fixed evaluation."""
    import importlib

    entry = ENV_SPECS[env_id][0] if env_id in ENV_SPECS else PZ_ENVS[check_env_id(env_id)][0]
    module, _, attr = entry.partition(":")
    cls = getattr(importlib.import_module(module), attr, None) if attr else None
    return frozenset(getattr(cls, "PRESENTATION_KWARGS", ()))


def is_pettingzoo(env_id: str) -> bool:
    return env_id in PZ_ENVS


def make(env_id: str, **kwargs):
    """Make any shopsim env by id: Gymnasium envs via `gymnasium.make`, PettingZoo envs via `parallel_env`."""
    check_env_id(env_id)
    if env_id in PZ_ENVS:
        import importlib

        return importlib.import_module(PZ_ENVS[env_id][0]).parallel_env(**kwargs)
    import gymnasium

    return gymnasium.make(env_id, **kwargs)


def _constructor(env_id: str):
    """The ``__init__`` of `env_id`'s env class (None when it cannot be found without building the env)."""
    import importlib
    import typing

    if env_id in ENV_SPECS:
        module, _, attr = ENV_SPECS[env_id][0].partition(":")
        cls = getattr(importlib.import_module(module), attr, None)
    else:
        factory = importlib.import_module(PZ_ENVS[check_env_id(env_id)][0]).parallel_env
        try:
            cls = typing.get_type_hints(factory).get("return")
        except Exception:
            cls = None
    return getattr(cls, "__init__", None) if isinstance(cls, type) else None


def check_env_options(env_id: str, kwargs, *, what: str = "env_kwargs") -> None:
    """Raise a one-line `ConfigError`, without building the env, if `kwargs` names an option `env_id` does not take
    or gives one a value of the wrong type (`shopsim.configs.checked_options` on the env's constructor), naming
    `what` (the flag or field they came from). Range and cross-option rules are checked when the env is built."""
    from shopsim.errors import ConfigError

    check_env_id(env_id)
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{what}: expected a JSON object of constructor options, got {kwargs!r}")
    check = getattr(_constructor(env_id), "check_options", None)
    if check is None:
        return
    try:
        check(kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def check_env_kwargs(env_id: str, kwargs: dict, *, what: str = "env_kwargs") -> None:
    """Raise a one-line `ConfigError` if `env_id`'s constructor rejects `kwargs` (an unknown option or a bad value),
    naming `what` (the flag or field they came from) and the valid options; builds the env once to find out."""
    import inspect
    import re

    from shopsim.errors import ConfigError, ShopsimError

    check_env_options(env_id, kwargs, what=what)
    try:
        env = make(env_id, **kwargs)
    except ShopsimError as exc:  # the env's own message already says what to change
        raise ConfigError(f"{what}: {exc}") from None
    except (TypeError, ValueError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        unknown = re.search(r"unexpected keyword argument '([^']+)'", message)
        if not unknown:
            raise ConfigError(f"{what}: {env_id} rejects {kwargs}: {message}") from None
        entry = ENV_SPECS[env_id][0] if env_id in ENV_SPECS else PZ_ENVS[env_id][0] + ":parallel_env"
        module, _, attr = entry.partition(":")
        import importlib

        mod = importlib.import_module(module)
        params = list(inspect.signature(getattr(mod, attr)).parameters.values())
        owner = re.match(r"(\w+)\.__init__\(\)", message)  # e.g. the env's config dataclass took the **kwargs
        if any(p.kind is p.VAR_KEYWORD for p in params) and owner and hasattr(mod, owner.group(1)):
            params = list(inspect.signature(getattr(mod, owner.group(1))).parameters.values())
        valid = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in ("self", "render_mode")]
        hint = f"; valid options: {', '.join(valid)}" if valid and not any(p.kind is p.VAR_KEYWORD for p in params) \
            else ""
        raise ConfigError(f"{what}: {env_id} has no option {unknown.group(1)!r}{hint}") from None
    close = getattr(env, "close", None)
    if close is not None:
        close()
