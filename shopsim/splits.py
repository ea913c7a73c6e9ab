"""The split manifests (``data/splits/<Name-vN>.json``, the env record's ``split_file``): the one place that reads
them (docs/design.md).

A manifest names an env's task ids per split, shared by the env (``reset(options={"split": ..., "task_id": ...})``),
the trainers and the leaderboard::

    {"env_id": "<env id>", "train": {"range": [lo, hi]}, "dev": [...], "test": [...],
     "eval_seeds": [0, 1, 2], "tries": 4}

`load_splits` reads and caches a manifest (the cache is keyed by the file's path, size and modification time, so a
rewritten file is read again); everything else in shopsim calls it. `sample_tasks` and `eval_tasks` turn a manifest
into task ids: training draws from the train range with the caller's RNG, evaluation takes the first n ids of the
dev/test list, so every algorithm and seed is evaluated on the same tasks. Task families: when the env package
exposes ``task_family(task_id) -> str`` the lists are filtered by it; else, when it exposes ``FAMILIES``, the
default-mix rule of the shopping env, ``FAMILIES[task_id % len(FAMILIES)]``, is used.

The returned manifest is shared between callers: read it, do not modify it.
"""

from __future__ import annotations

import importlib
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from shopsim.errors import DatasetError
from shopsim.paths import data_dir

SPLITS = ("train", "dev", "test")


def splits_path(env_id: str, root: str | Path | None = None) -> Path:
    """The split manifest of `env_id` (or its ``Name-vN``) under `root` (default `data_dir`): its record's
    ``split_file``, and ``splits/<Name-vN>.json`` for an env without a record."""
    from shopsim.envs.record import find_record

    record = find_record(env_id)
    rel = record.split_file if record is not None else f"splits/{env_id.split('/')[-1]}.json"
    return Path(root if root is not None else data_dir()) / rel


def has_splits(env_id: str, root: str | Path | None = None) -> bool:
    """Whether `env_id` has a split manifest."""
    return splits_path(env_id, root).is_file()


def load_splits(env_id: str, root: str | Path | None = None) -> dict:
    """The split manifest of `env_id` (a JSON object); `DatasetError` when it is missing or malformed."""
    path = splits_path(env_id, root)
    if not path.is_file():
        raise DatasetError(f"split manifest {path} for {env_id} is missing; it ships with shopsim in data/splits/ "
                           "(or set SHOPSIM_DATA_DIR to a folder that has splits/)")
    return read_manifest(path)


def read_manifest(path: str | Path) -> dict:
    """The split manifest at `path`, read once per version of the file (see module docstring)."""
    path = Path(path).resolve()
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DatasetError(f"split manifest {path} is missing") from None
    return _read(str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int, size: int) -> dict:
    # mtime and size are part of the key only, so that a rewritten file misses the cache
    try:
        spec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path} is not valid JSON ({exc}); fix or regenerate it") from exc
    if not isinstance(spec, dict):
        raise DatasetError(f"{path} must hold a JSON object with 'train', 'dev' and 'test' keys")
    return spec


def _family_fn(env_id: str):
    from shopsim.envs.record import find_record

    record = find_record(env_id)
    if record is None:
        return None
    try:
        mod = importlib.import_module(record.entry_point.split(":")[0])
    except Exception:
        return None
    fn = getattr(mod, "task_family", None)
    fams = getattr(mod, "FAMILIES", None)
    if fn is None and fams:
        # the documented default mix of the shopping env: family = FAMILIES[task_id % len(FAMILIES)]
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


def _split_of(env_id: str, split: str):
    if not has_splits(env_id):
        return None
    return load_splits(env_id).get(split)


def sample_tasks(env_id: str, split: str, rng: np.random.Generator, n: int, families=()) -> list | None:
    """`n` task ids of `split` drawn with `rng` (in `families` when given); None when the env has no such split."""
    part = _split_of(env_id, split)
    if part is None:
        return None
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
    """The first `n` task ids of `split` (families interleaved when given); None when the env has no such split."""
    part = _split_of(env_id, split)
    if part is None:
        return None
    ids = list(range(*part["range"])) if isinstance(part, dict) else list(part)
    ids = _filter(env_id, ids, families)
    if not families or _family_fn(env_id) is None:
        return ids[:n]
    # interleave families so a small n still covers each
    by: dict = {}
    fn = _family_fn(env_id)
    for t in ids:
        by.setdefault(fn(t), []).append(t)
    out: list = []
    i = 0
    while len(out) < n and any(i < len(v) for v in by.values()):
        for f in families:
            if i < len(by.get(f, [])) and len(out) < n:
                out.append(by[f][i])
        i += 1
    return out
