"""Agent registry: `agents.make(name, env_id, **kwargs)`.

An agent name ("expert", "random", "lm", ...) resolves per env family, because an expert for the shopping env
and an expert for replenishment are different classes. Entries are import paths, imported only when made, so
registering costs nothing and a missing optional dependency only matters when that agent is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from shopsim.envs import family_of
from shopsim.errors import UnknownNameError

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
    import os
    from pathlib import Path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"class": f"{cls.__module__}:{cls.__qualname__}", "env_id": env_id, **info}
    tmp = directory / f".{CHECKPOINT_MANIFEST}.tmp"
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True))
    os.replace(tmp, directory / CHECKPOINT_MANIFEST)


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


def load_checkpoint(directory, env_id: str | None = None, **kwargs: Any):
    """Rebuild the agent saved in a checkpoint folder (see `save_manifest`)."""
    import json
    from pathlib import Path

    directory = Path(directory)
    manifest = directory / CHECKPOINT_MANIFEST
    if not manifest.is_file():
        raise UnknownNameError(f"{directory} is not a shopsim checkpoint (no {CHECKPOINT_MANIFEST}); "
                               "pass the folder a training run wrote (OUT/checkpoint)")
    payload = json.loads(manifest.read_text())
    cls = _load(payload["class"])
    agent = cls.from_checkpoint(directory, env_id=env_id or payload["env_id"], **kwargs)
    agent.name = getattr(agent, "name", None) or cls.__name__
    agent.env_kwargs = manifest_env_kwargs(manifest)
    return agent
