"""Agent registry: `agents.make(name, env_id, **kwargs)`.

An agent name ("expert", "random", "lm", ...) resolves per env family, because an expert for the shopping env
and an expert for replenishment are different classes. Entries are import paths, imported only when made, so
registering costs nothing and a missing optional dependency only matters when that agent is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from shopsim.envs import family_of
from shopsim.errors import ConfigError, ShopsimError, UnknownNameError

#: (name, family) -> "module:Class"
_REGISTRY: dict[tuple[str, str], str] = {
    # shopping (text)
    ("expert", "shopping"): "agents.shopping_expert:ShoppingExpert",
    ("random", "shopping"): "agents.random_agent:RandomTextAgent",
    ("lm", "shopping"): "agents.lm.agent:LMAgent",
    # recommendation
    ("expert", "rec"): "agents.rec_policies:GreedyRecExpert",
    ("random", "rec"): "agents.rec_policies:RandomRecAgent",
    # retrieval
    ("expert", "retrieval"): "agents.retrieval_policies:OracleRetriever",
    ("random", "retrieval"): "agents.retrieval_policies:RandomRetriever",
    # inventory
    ("expert", "inventory"): "agents.inventory_policies:SSPolicyAgent",
    ("s_S", "inventory"): "agents.inventory_policies:SSPolicyAgent",
    ("base_stock", "inventory"): "agents.inventory_policies:BaseStockAgent",
    ("random", "inventory"): "agents.inventory_policies:RandomInventoryAgent",
    ("constant", "inventory"): "agents.inventory_policies:ConstantOrderAgent",
}


#: modules whose agent classes a checkpoint manifest may name besides the registered ones: shopsim's own agents that
#: are only ever loaded from checkpoints (trained policies)
CHECKPOINT_MODULES = frozenset({"agents.lm.agent", "agents.inventory_policies", "agents.retrieval_policies",
                                "agents.rec_policies"})


def register(name: str, family: str, target: str | type, *, overwrite: bool = False) -> None:
    """Register an agent class (or "module:Class" path) under `name` for an env family."""
    key = (name, family)
    if key in _REGISTRY and not overwrite:
        raise ValueError(f"agent {name!r} is already registered for family {family!r}; pass overwrite=True")
    _REGISTRY[key] = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def available(env_id: str | None = None) -> list[str]:
    """Agent names, for one env (if given) or for any env."""
    if env_id is None:
        return sorted({n for n, _ in _REGISTRY})
    fam = family_of(env_id)
    return sorted(n for n, f in _REGISTRY if f == fam)


def _load(target: str) -> type:
    module, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise UnknownNameError(f"cannot import agent module {module!r}: {exc}") from exc
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve(name: str, env_id: str) -> type:
    """The agent class for `name` on `env_id`; `name` may also be a 'module:Class' path."""
    if ":" in name:
        return _load(name)
    fam = family_of(env_id)
    target = _REGISTRY.get((name, fam))
    if target is None:
        raise UnknownNameError(
            f"unknown agent {name!r} for {env_id}; available: {', '.join(available(env_id)) or 'none'}"
        )
    return _load(target)


def make(name: str, env_id: str, **kwargs):
    """Build agent `name` for env `env_id` (constructors take `env_id` as a keyword plus their own options)."""
    cls = resolve(name, env_id)
    agent = cls(env_id=env_id, **kwargs)
    agent.name = name if ":" not in name else cls.__name__
    return agent


CHECKPOINT_MANIFEST = "shopsim_agent.json"


def save_manifest(directory, cls: type, env_id: str, **info: Any) -> None:
    """Write the manifest that lets `load_checkpoint` rebuild an agent from a checkpoint folder.

    The folder then holds `shopsim_agent.json` = {"class": "module:Class", "env_id": ..., **info}; the class must
    provide ``from_checkpoint(directory, env_id=..., **kwargs)``.
    """
    import json
    from pathlib import Path

    from shopsim.paths import write_text_atomic

    payload = {"class": f"{cls.__module__}:{cls.__qualname__}", "env_id": env_id, **info}
    write_text_atomic(Path(directory) / CHECKPOINT_MANIFEST, json.dumps(payload, indent=2, sort_keys=True))


def manifest_env_kwargs(path) -> dict:
    """Env options a checkpoint records (a checkpoint folder or its manifest file): manifest ``env_kwargs``, else
    ``config.env_kwargs``, else none."""
    import json
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_MANIFEST
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    kw = data.get("env_kwargs")
    if kw is None and isinstance(data.get("config"), dict):
        kw = data["config"].get("env_kwargs")
    return dict(kw or {})


def read_manifest(directory) -> dict:
    """The manifest of a checkpoint folder (`save_manifest`); raise a `ShopsimError` that says what to pass if the
    folder is missing, is not a checkpoint, or its manifest is unreadable."""
    import json
    from pathlib import Path

    directory = Path(directory)
    manifest = directory / CHECKPOINT_MANIFEST
    if directory.is_file():
        raise UnknownNameError(f"{directory} is a file, not a shopsim checkpoint folder; pass the folder a training "
                               "run wrote (OUT/checkpoint)")
    if not directory.is_dir():
        hint = _similar_checkpoints(directory)
        raise UnknownNameError(f"{directory} is not a shopsim checkpoint: no such folder"
                               + (f"; did you mean {' or '.join(map(str, hint))}?" if hint else
                                  "; pass the folder a training run wrote (OUT/checkpoint)"))
    if not manifest.is_file():
        raise UnknownNameError(f"{directory} is not a shopsim checkpoint (no {CHECKPOINT_MANIFEST}); "
                               "pass the folder a training run wrote (OUT/checkpoint)")
    try:
        payload = json.loads(manifest.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ShopsimError(f"{manifest}: not valid JSON ({exc}); re-save the checkpoint") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("class"), str):
        raise ShopsimError(f"{manifest}: no \"class\" entry; re-save the checkpoint")
    return payload


def _similar_checkpoints(directory) -> list:
    """Checkpoint folders of sibling runs whose name starts with the missing run's name (``runs/hpo/checkpoint``
    missing but ``runs/hpo-seed0/checkpoint`` there: `shopsim train`'s default ``--out`` is ``runs/<algo>-seed<S>``)."""
    run, leaf = (directory.parent, directory.name) if directory.name == "checkpoint" else (directory, None)
    if not run.parent.is_dir() or not run.name:
        return []
    found = []
    for cand in sorted(run.parent.glob(f"{run.name}*")):
        ckpt = cand / leaf if leaf else cand
        if cand != run and (ckpt / CHECKPOINT_MANIFEST).is_file():
            found.append(ckpt)
    return found[:3]


def manifest_families(directory) -> list[str] | None:
    """The task families a checkpoint was trained on, if its manifest records them (an SFT run's ``sft.families``,
    a trainer's ``config.families`` / ``config.family``, a ``family`` reset option or env option); None if it
    records none."""
    payload = read_manifest(directory)
    for section in (payload, payload.get("sft"), payload.get("config")):
        if not isinstance(section, dict):
            continue
        fams = section.get("families", section.get("family"))
        for options in ("reset_options", "env_kwargs"):  # an LM trainer's task choice, an env option
            if fams is None and isinstance(section.get(options), dict):
                fams = section[options].get("family")
        if isinstance(fams, str):
            return [fams]
        if isinstance(fams, list) and fams and all(isinstance(f, str) for f in fams):
            return list(fams)
    return None


def checkpoint_class(target: str, manifest) -> Any:
    """The agent class a checkpoint manifest names (``"module:Class"``), imported only when it is a registered
    agent or lives in one of `CHECKPOINT_MODULES`: a downloaded checkpoint must not choose which code is imported.
    Anything else raises a `ShopsimError` that says how to allow it. (Typed Any: an `Agent` subclass with a
    `from_checkpoint`, checked here, which `Agent` itself does not declare.)"""
    from agents.base import Agent

    module, _, attr = target.partition(":")
    if target not in set(_REGISTRY.values()) and module not in CHECKPOINT_MODULES:
        raise ShopsimError(f"{manifest}: \"class\" {target!r} is not a shopsim agent, so it is not imported; a "
                           "checkpoint of your own agent class loads once it is registered (agents.register(name, "
                           "family, cls))")
    try:
        cls = _load(target)
    except AttributeError:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, Agent) and hasattr(cls, "from_checkpoint")):
        raise ShopsimError(f"{manifest}: \"class\" {target!r} is not an agent class with from_checkpoint; re-save "
                           "the checkpoint")
    return cls


def load_checkpoint(directory, env_id: str | None = None, **kwargs: Any):
    """Rebuild the agent saved in a checkpoint folder (see `save_manifest`) for `env_id` (default: the env it was
    saved for); a checkpoint of another env family (a retrieval policy asked to shop) raises a `ConfigError`
    naming the checkpoint's env."""
    from pathlib import Path

    directory = Path(directory)
    payload = read_manifest(directory)
    saved_env = payload.get("env_id")
    if env_id is not None and isinstance(saved_env, str) and saved_env != env_id:
        try:
            other_family = family_of(saved_env) != family_of(env_id)
        except UnknownNameError:  # an env registered only where it was saved (a test env): let the class decide
            other_family = False
        if other_family:
            raise ConfigError(f"{directory} is a checkpoint for {saved_env} ({payload['class']}), not for "
                              f"{env_id}; use --env {saved_env}")
    cls = checkpoint_class(payload["class"], directory / CHECKPOINT_MANIFEST)
    try:
        agent = cls.from_checkpoint(directory, env_id=env_id or saved_env, **kwargs)
    except FileNotFoundError as exc:  # a manifest without its weights: an interrupted copy or save
        raise ShopsimError(f"{directory} is an incomplete checkpoint ({Path(exc.filename or '?').name} is missing); "
                           "copy or save it again") from None
    agent.name = getattr(agent, "name", None) or cls.__name__
    agent.env_kwargs = manifest_env_kwargs(directory / CHECKPOINT_MANIFEST)
    return agent
