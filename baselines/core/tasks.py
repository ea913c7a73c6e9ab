"""Task ids for training and evaluation, from the env's split manifest (`data/splits/<Name-vN>.json`).

Training tasks are drawn with the trainer's RNG from the train range; evaluation uses the first n ids of the
dev/test list, so every algorithm and seed is evaluated on the same tasks. Task families: when the env package
exposes ``task_family(task_id) -> str`` the lists are filtered by it; else, when it exposes ``FAMILIES``, the
Shopping-v0 default-mix rule ``FAMILIES[task_id % len(FAMILIES)]`` is used.
"""

from __future__ import annotations

import importlib
import json
from functools import cache

import numpy as np

from shopsim.paths import data_dir


@cache
def load_split(env_id: str) -> dict | None:
    name = env_id.split("/")[-1]
    path = data_dir() / "splits" / f"{name}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _family_fn(env_id: str):
    from shopsim.envs import ENV_SPECS

    spec = ENV_SPECS.get(env_id)
    if spec is None:
        return None
    try:
        mod = importlib.import_module(spec[0].split(":")[0])
    except Exception:
        return None
    fn = getattr(mod, "task_family", None)
    fams = getattr(mod, "FAMILIES", None)
    if fn is None and fams:
        # Shopping-v0's documented default mix: family = FAMILIES[task_id % len(FAMILIES)]
        def fn(task_id, _f=tuple(fams)):
            return _f[int(task_id) % len(_f)]
    return fn


def _filter(env_id: str, ids, families) -> list:
    if not families:
        return list(ids)
    fn = _family_fn(env_id)
    if fn is None:
        return list(ids)
    fam = set(families)
    return [t for t in ids if fn(t) in fam]


def sample_tasks(env_id: str, split: str, rng: np.random.Generator, n: int, families=()) -> list | None:
    spl = load_split(env_id)
    if spl is None or split not in spl:
        return None
    part = spl[split]
    if isinstance(part, dict) and "range" in part:
        lo, hi = part["range"]
        if families and _family_fn(env_id) is not None:
            out: list = []
            while len(out) < n:
                cand = [int(x) for x in rng.integers(lo, hi, size=4 * n)]
                out.extend(_filter(env_id, cand, families))
            return out[:n]
        return [int(x) for x in rng.integers(lo, hi, size=n)]
    ids = _filter(env_id, part, families)
    return [ids[int(i)] for i in rng.integers(0, len(ids), size=n)]


def eval_tasks(env_id: str, split: str, n: int, families=()) -> list | None:
    spl = load_split(env_id)
    if spl is None or split not in spl:
        return None
    part = spl[split]
    ids = list(range(*part["range"])) if isinstance(part, dict) else list(part)
    ids = _filter(env_id, ids, families)
    if not families or _family_fn(env_id) is None:
        return ids[:n]
    # interleave families so a small n still covers each
    by = {}
    fn = _family_fn(env_id)
    for t in ids:
        by.setdefault(fn(t), []).append(t)
    out = []
    i = 0
    while len(out) < n and any(i < len(v) for v in by.values()):
        for f in families:
            if i < len(by.get(f, [])) and len(out) < n:
                out.append(by[f][i])
        i += 1
    return out
