"""Where shopsim finds its shipped data and keeps its caches.

* `DATA_DIR`: the repository's `data/` (taxonomy, templates, evaluation split manifests, small shipped artefacts);
  override with `SHOPSIM_DATA_DIR`.
* `cache_dir()`: built catalogs, search indexes and trained simulators; `SHOPSIM_CACHE_DIR` overrides the default
  `~/.cache/shopsim`. Read at call time so tests can point it at a temporary folder.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    return Path(os.environ.get("SHOPSIM_DATA_DIR", _REPO_ROOT / "data"))


DATA_DIR = data_dir()


def cache_dir() -> Path:
    path = Path(os.environ.get("SHOPSIM_CACHE_DIR", Path.home() / ".cache" / "shopsim"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_path(final: Path) -> Path:
    """A temporary sibling of `final` to write to before `os.replace` (same folder, so the rename is atomic)."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")
