"""Files of nested state (training resume states, cached simulators) that load without running any code.

`save_state(path, state)` writes a nested structure of dicts, lists, tuples, numbers, strings, None, torch tensors
and numpy arrays/scalars as one safetensors file: the tensors (and numpy arrays, as tensors) are its tensors, and
everything else is a JSON document in its header (metadata key ``shopsim_state``) in which every tensor is a
reference by name. `load_state(path)` rebuilds the structure. Neither pickle nor ``torch.load`` is involved, so a
crafted file in a run folder can at worst be refused (`ShopsimError`), never execute code; the state of python's
`random` and of numpy's generators is plain JSON, torch generator states are uint8 tensors.

`load_weights(path)` reads a ``torch.save`` file of tensors (checkpoint weights such as ``policy.pt``) with
``torch.load(weights_only=True)``, with a one-line error for a damaged file.

JSON cannot tell a tuple from a list, or hold a dict with non-string keys (an optimizer's per-parameter state) or a
numpy scalar's type, so those are tagged objects with one ``$``-key: ``{"$tuple": [...]}``,
``{"$items": [[key, value], ...]}``, ``{"$scalar": [dtype, value]}``, ``{"$tensor": name}`` and
``{"$ndarray": name}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shopsim.errors import ShopsimError

__all__ = ["STATE_KEY", "load_state", "load_weights", "save_state"]

#: the safetensors metadata key holding the JSON document
STATE_KEY = "shopsim_state"
_TAGS = frozenset({"$tuple", "$items", "$scalar", "$tensor", "$ndarray"})


class _Tensors:
    """The tensors of a state being saved, by name; the same view of the same memory (tied weights) is stored once."""

    def __init__(self) -> None:
        self.by_name: dict = {}
        self._views: dict[tuple, str] = {}
        self._storages: set[int] = set()

    def add(self, t) -> str:
        t = t.detach().cpu()
        if t.numel() == 0:  # no memory to share
            return self._store(t.clone())
        ptr = t.untyped_storage().data_ptr()
        view = (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if view in self._views:
            return self._views[view]
        # safetensors refuses tensors that share memory: another view of memory already stored is copied
        name = self._store(t.clone() if ptr in self._storages else t.contiguous())
        self._views[view] = name
        self._storages.add(ptr)
        return name

    def _store(self, t) -> str:
        name = f"t{len(self.by_name)}"
        self.by_name[name] = t
        return name


def _encode(obj: Any, tensors: _Tensors, where: str) -> Any:
    import numpy as np
    import torch

    if isinstance(obj, np.generic):  # before the Python types: np.float64 is a float, but keeps its type here
        return {"$scalar": [obj.dtype.str, obj.item()]}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, torch.Tensor):
        return {"$tensor": tensors.add(obj)}
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError(f"cannot save a numpy array of Python objects at {where}")
        return {"$ndarray": tensors.add(torch.from_numpy(np.ascontiguousarray(obj)))}
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (len(obj) == 1 and next(iter(obj)) in _TAGS):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {"$items": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")]
                           for k, v in obj.items()]}
    raise TypeError(f"cannot save a {type(obj).__name__} at {where}: state files hold tensors, arrays, numbers, "
                    "strings and containers of them")


def _decode(obj: Any, tensors: dict) -> Any:
    import numpy as np

    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, value), = obj.items()
        if tag == "$tensor":
            return tensors[value]
        if tag == "$ndarray":
            return tensors[value].numpy()
        if tag == "$tuple":
            return tuple(_decode(v, tensors) for v in value)
        if tag == "$items":
            return {_decode(k, tensors): _decode(v, tensors) for k, v in value}
        if tag == "$scalar":
            return np.dtype(value[0]).type(value[1])
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save_state(path: str | Path, state: Any) -> Path:
    """Write `state` to `path` (see module docstring), atomically (`shopsim.paths.atomic_write`)."""
    from safetensors.torch import save_file

    from shopsim.paths import atomic_write

    tensors = _Tensors()
    document = json.dumps(_encode(state, tensors, "state"))
    path = Path(path)
    with atomic_write(path) as tmp:
        save_file(tensors.by_name, str(tmp), metadata={STATE_KEY: document})
    return path


def load_state(path: str | Path) -> Any:
    """The state `save_state` wrote to `path`. A file that is damaged or not a shopsim state file raises a
    `ShopsimError` naming it; nothing in the file is executed."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            document = (f.metadata() or {}).get(STATE_KEY)
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - a safe_open handle
    except (SafetensorError, OSError) as exc:
        raise ShopsimError(f"{path} is damaged or not a shopsim state file ({_first_line(exc)}); delete it") from None
    if document is None:
        raise ShopsimError(f"{path} is not a shopsim state file (no {STATE_KEY} record); delete it")
    try:
        return _decode(json.loads(document), tensors)
    except (ValueError, KeyError, TypeError) as exc:
        raise ShopsimError(f"{path} holds a malformed state record ({_first_line(exc)}); delete it") from None


def load_weights(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU: tensors and plain containers only, so a crafted file is
    refused rather than run. A truncated or foreign file raises a `ShopsimError` naming it."""
    import pickle

    import torch
    from safetensors import SafetensorError

    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError, OSError, SafetensorError) as exc:
        raise ShopsimError(f"{path} is damaged or not a weights file ({_first_line(exc)}); copy or save the "
                           "checkpoint again") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
