"""Environment registry: every shopsim env's record (`shopsim.envs.record.EnvRecord`), read by id.

Importing `shopsim` (or `shopsim.envs`) registers the records of `shopsim.envs.records` and, for the Gymnasium envs,
their ids with Gymnasium, so ``gymnasium.make(<env id>)`` works. A PettingZoo env (``api="pettingzoo"``) is made with
its module's ``parallel_env(...)`` (PettingZoo has no registry in common use); `make` makes either kind.
`register_env` adds a record at runtime (docs/adding-an-env.md).

Families group envs by the kind of agent and trainer that fits them (`EnvRecord.family`): agents and trainers are
registered per family (`agents.registry`, `baselines.registry`).
"""

from __future__ import annotations

import os
import sys

from gymnasium.envs.registration import register, registry

from shopsim.envs.record import RECORDS, EnvRecord, add_record, find_record
from shopsim.envs.records import SHIPPED
from shopsim.errors import UnknownNameError

__all__ = ["RECORDS", "EnvRecord", "all_env_ids", "check_env_id", "env_record", "family_of", "is_pettingzoo",
           "make", "register_env", "task_families"]


def register_env(record: EnvRecord) -> EnvRecord:
    """Add `record` to the registry (`RECORDS`) and, for a Gymnasium env, register its id with Gymnasium (once)."""
    add_record(record)
    if record.api == "gymnasium" and record.id not in registry:
        register(id=record.id, entry_point=record.entry_point, **record.register_kwargs)
    return record


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

for _record in SHIPPED:
    register_env(_record)


def all_env_ids() -> list[str]:
    """Every registered env id: the Gymnasium envs, then the PettingZoo ones, each in registration order."""
    return [*(r.id for r in RECORDS.values() if not r.multi_agent), *(r.id for r in RECORDS.values() if r.multi_agent)]


def env_record(env_id: str) -> EnvRecord:
    """The record of `env_id` (`shopsim.envs.record.EnvRecord`); raises with the list of known ids."""
    record = RECORDS.get(env_id)
    if record is None:
        raise UnknownNameError(f"unknown env {env_id!r}; available: {', '.join(all_env_ids())}")
    return record


def family_of(env_id: str) -> str:
    """The family of an env id (`EnvRecord.family`); raises with the list of known ids."""
    return env_record(env_id).family


def check_env_id(env_id: str) -> str:
    env_record(env_id)
    return env_id


def _entry(record: EnvRecord) -> tuple[str, str]:
    """(module, attribute) of a record's entry point; a PettingZoo env's attribute is its ``parallel_env``."""
    module, _, attr = record.entry_point.partition(":")
    return module, attr or ("parallel_env" if record.multi_agent else "")


def presentation_kwargs(env_id: str) -> frozenset:
    """Constructor options of `env_id` that change only how observations are rendered, not the task (the env class's
    ``PRESENTATION_KWARGS``): an agent may pick them (e.g. the rendering it was trained on) in a fixed evaluation."""
    import importlib

    record = env_record(env_id)
    module, attr = _entry(record)
    cls = getattr(importlib.import_module(module), attr, None) if attr and not record.multi_agent else None
    return frozenset(getattr(cls, "PRESENTATION_KWARGS", ()))


def task_families(env_id: str) -> tuple[str, ...]:
    """The task families `env_id` takes by name (its entry module's ``ALL_FAMILIES``, else ``FAMILIES``); empty for
    an env without named task families."""
    import importlib

    module = importlib.import_module(_entry(env_record(env_id))[0])
    return tuple(getattr(module, "ALL_FAMILIES", None) or getattr(module, "FAMILIES", None) or ())


def is_pettingzoo(env_id: str) -> bool:
    record = find_record(env_id)
    return record is not None and record.multi_agent


def make(env_id: str, **kwargs):
    """Make any shopsim env by id: Gymnasium envs via `gymnasium.make`, PettingZoo envs via `parallel_env`."""
    record = env_record(env_id)
    if record.multi_agent:
        import importlib

        module, attr = _entry(record)
        return getattr(importlib.import_module(module), attr)(**kwargs)
    import gymnasium

    return gymnasium.make(env_id, **kwargs)


def _constructor(env_id: str):
    """The ``__init__`` of `env_id`'s env class (None when it cannot be found without building the env)."""
    import importlib
    import typing

    record = env_record(env_id)
    module, attr = _entry(record)
    if not record.multi_agent:
        cls = getattr(importlib.import_module(module), attr, None)
    else:
        factory = getattr(importlib.import_module(module), attr)
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
        module, attr = _entry(env_record(env_id))
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
