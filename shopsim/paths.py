"""Where shopsim finds its shipped data and keeps its caches.

* `data_dir()` / `DATA_DIR`: the shipped data (taxonomy, templates, evaluation split manifests, tokenizer, the LM
  checkpoint). An installed wheel carries the repository's top-level `data/` as the package resource
  `shopsim/_data` (pyproject maps the folder there), found with `importlib.resources`; a source or editable checkout
  has no such folder and reads `data/` beside the package. `SHOPSIM_DATA_DIR` overrides both.
* `cache_dir()`: built catalogs, search indexes and trained simulators; `SHOPSIM_CACHE_DIR` overrides the default
  `~/.cache/shopsim`. Read at call time so tests can point it at a temporary folder.
* `atomic_write` / `atomic_files` / `write_text_atomic`: files others read (datasets, checkpoints, resume states,
  results) are written to a temporary sibling (`atomic_path`) and renamed into place with the normal file mode, so
  a kill mid-write never leaves a truncated file under the final name; the next process that writes into the
  folder removes the temporaries of killed writers (`remove_stale_temps`).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


#: folders this process already cleared of stale temporaries (`remove_stale_temps`): once per folder per process
_SWEPT: set[Path] = set()
_SWEPT_LOCK = threading.Lock()


def _host_tag() -> str:
    """8 hex digits naming this machine in temporary names: a writer on another machine sharing the folder (NFS)
    has a process table this one cannot see, so its temporaries are never judged stale here."""
    import hashlib
    import socket

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)(?:-(?P<tid>\d+))?(?:-(?P<host>[0-9a-f]{8}))?$")


def atomic_path(final: Path) -> Path:
    """A temporary sibling of `final` to write to before `os.replace` (same folder, so the rename is atomic), named
    ``.NAME.tmp-PID-THREAD-HOST``: unique per writing thread, and enough to tell later whether its writer is alive.

    The first call for a folder in a process also removes the temporaries killed writers left there
    (`remove_stale_temps`), so a rerun after a kill leaves no debris."""
    final = Path(final)
    remove_stale_temps(final.parent)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{threading.get_ident()}-{_host_tag()}")


def _writer_alive(pid: int, tid: int | None) -> bool:
    """Whether the process `pid` (on this machine), and in this process the thread `tid`, may still be writing."""
    if pid == os.getpid():
        # a temporary with this process's id but no live thread of it was left by an earlier process that had the
        # same id (containers reuse small ids)
        return tid is not None and any(t.ident == tid for t in threading.enumerate())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: the process exists, under another user
        return True
    return True


def remove_stale_temps(folder: Path) -> list[Path]:
    """Remove the temporaries (`atomic_path` names, files or folders) in `folder` whose writer is gone: written on
    this machine by a process that no longer runs, or by this process's id but no live thread of it. Those of live
    writers and of other machines stay. Runs once per folder per process; returns what it removed."""
    import shutil

    folder = Path(folder)
    key = folder.resolve() if folder.exists() else folder.absolute()
    with _SWEPT_LOCK:
        if key in _SWEPT:
            return []
        _SWEPT.add(key)
    try:
        entries = list(os.scandir(folder))
    except OSError:  # not there yet, or not listable: nothing to clear
        return []
    host, removed = _host_tag(), []
    for entry in entries:
        m = _TEMP_NAME.match(entry.name)
        if m is None or (m["host"] is not None and m["host"] != host):
            continue
        if _writer_alive(int(m["pid"]), None if m["tid"] is None else int(m["tid"])):
            continue
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:  # another process cleared it first
            continue
        removed.append(path)
    return removed


def normal_file_mode() -> int:
    """The mode a new file gets in this process (0o666 less the umask): what `atomic_write` gives every file, since
    some writers (safetensors) create theirs readable by the owner only, which breaks shared folders."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _SWEPT_LOCK:  # os.umask both reads and sets: restore it at once
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """Write a file atomically: yields the temporary path (`atomic_path`) to write; when the block ends without an
    exception the file gets the normal mode (`normal_file_mode`) and is renamed to `path`, else it is removed.
    Readers never see half a file, and a kill mid-write leaves the previous file in place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic_path(path)
    try:
        yield tmp
        os.chmod(tmp, normal_file_mode())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_files(directory: str | Path) -> Iterator[Path]:
    """Write several files into `directory`, each atomically: yields an empty temporary folder inside `directory`
    (for writers that take a folder, such as ``save_pretrained``); when the block ends without an exception every
    file written there (recursively) gets the normal mode and is renamed over its namesake in `directory`. The
    temporary folder is removed either way."""
    import shutil

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = atomic_path(directory / "files")
    tmp.mkdir()
    try:
        yield tmp
        mode = normal_file_mode()
        for src in sorted(p for p in tmp.rglob("*") if p.is_file()):
            dst = directory / src.relative_to(tmp)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(src, mode)
            os.replace(src, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` through `atomic_write` (creating the folder): readers never see half a file."""
    path = Path(path)
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding=encoding)
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


@contextmanager
def interprocess_lock(path: Path):
    """Exclusive advisory lock on `path` (created if needed) so that concurrent processes build a cache once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: builds may race, writes are still atomic
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
