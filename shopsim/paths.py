"""Where shopsim finds its shipped data and keeps its caches.

* `data_dir()` / `DATA_DIR`: the shipped data (taxonomy, templates, evaluation split manifests, tokenizer, the LM
  checkpoint). An installed wheel carries the repository's top-level `data/` as the package resource
  `shopsim/_data` (pyproject maps the folder there), found with `importlib.resources`; a source or editable checkout
  has no such folder and reads `data/` beside the package. `SHOPSIM_DATA_DIR` overrides both.
* `cache_dir()`: built catalogs, search indexes and trained simulators; `SHOPSIM_CACHE_DIR` overrides the default
  `~/.cache/shopsim`. Read at call time so tests can point it at a temporary folder.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]
#: The resource folder that holds `data/` in an installed wheel (`[tool.setuptools.package-dir]` in pyproject).
PACKAGE_DATA = "_data"


def packaged_data_dir() -> Path | None:
    """`shopsim/_data` of an installed wheel, or None (a source checkout, or a package not on a real filesystem)."""
    root = resources.files(__package__).joinpath(PACKAGE_DATA)
    # Callers hand these folders to code that needs real paths (transformers' from_pretrained), so a zip import's
    # Traversable is not accepted.
    return root if isinstance(root, Path) and root.is_dir() else None


def data_dir() -> Path:
    """The shipped data folder: `SHOPSIM_DATA_DIR` if set, else the wheel's `shopsim/_data`, else the checkout's
    top-level `data/`."""
    override = os.environ.get("SHOPSIM_DATA_DIR")
    if override:
        return Path(override)
    return packaged_data_dir() or _REPO_ROOT / "data"


DATA_DIR = data_dir()


def portable_path(path: str | Path) -> str:
    """`path` as a results file records it: ``data/<path inside the shipped data folder>`` for a shipped file (so
    the record, and its config hash, are the same on every machine and install), else `path` as given."""
    try:
        inside = Path(path).resolve().relative_to(data_dir().resolve())
    except ValueError:
        return str(path)
    return str(Path("data") / inside)


def shipped_path(path: str | Path) -> Path:
    """`path` as given when it exists, else a relative ``data/...`` path looked up in the shipped data folder (the
    inverse of `portable_path`: ``data/lm/sft`` from any working directory, in a checkout or a wheel)."""
    p = Path(path).expanduser()
    if not p.exists() and not p.is_absolute() and p.parts and p.parts[0] == "data":
        return data_dir().joinpath(*p.parts[1:])
    return p


def cache_dir() -> Path:
    path = Path(os.environ.get("SHOPSIM_CACHE_DIR", Path.home() / ".cache" / "shopsim"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_path(final: Path) -> Path:
    """A temporary sibling of `final` to write to before `os.replace` (same folder, so the rename is atomic)."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` through `atomic_path` and a rename (creating the folder): readers never see half a
    file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic_path(path)
    tmp.write_text(text, encoding=encoding)
    os.replace(tmp, path)
    return path


def files_digest(path: str | Path, pattern: str = "*") -> str:
    """sha256 (hex) of a file, or of a folder's files matching `pattern` (recursively; relative names and bytes, in
    name order): what a run was made from, for deciding whether a recorded run still applies."""
    import hashlib

    p = Path(path)
    files = sorted(q for q in p.rglob(pattern) if q.is_file()) if p.is_dir() else [p]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
