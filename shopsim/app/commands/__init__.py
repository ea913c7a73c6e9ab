"""One module per `shopsim` subcommand (see `shopsim.app.cli`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from shopsim.errors import ShopsimError

#: folders `writable_output` created in this command, outermost first (`removing_unused_outputs`)
_CREATED: list[Path] = []


@contextlib.contextmanager
def removing_unused_outputs():
    """Run a command so that, if it fails, the folders `writable_output` created for it that are still empty are
    removed again: a command that stopped before writing (e.g. on a Ray cluster it could not join) leaves no empty
    output folder behind. Folders that existed before are never touched."""
    _CREATED.clear()
    try:
        yield
    except BaseException:
        for folder in reversed(_CREATED):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only an empty folder goes
        raise
    finally:
        _CREATED.clear()


def writable_output(path: str | os.PathLike, *, is_dir: bool = False, flag: str = "--out") -> Path:
    """Check, before any work, that `path` (a file, or a folder if `is_dir`) can be written; return it as a Path.

    Creates the missing parent folders (the folder itself if `is_dir`), then creates and removes a probe file where
    the command will write: a permission bit, a read-only or pseudo file system (``/proc``), a name too long for
    the file system or a file where a folder is needed all show up here, as a `ShopsimError` naming `flag`, rather
    than as a traceback after the work is done. The probe for a file is the temporary sibling that the atomic
    writers use (`shopsim.paths.atomic_path`), so its name is as long as any name the command will create. The
    folders it creates are removed again if the command fails while they are still empty
    (`removing_unused_outputs`, around every command of `shopsim.app.cli.main`).
    """
    from shopsim.paths import atomic_path

    if not str(path).strip():
        raise ShopsimError(f"{flag} is empty; give a {'folder' if is_dir else 'file'} path")
    p = Path(path).expanduser()
    want = "folder" if is_dir else "file"
    folder = p if is_dir else p.parent
    try:
        if p.exists() and p.is_dir() != is_dir:
            raise ShopsimError(f"{flag} {p} is {'a folder' if p.is_dir() else 'a file'}; give a {want} path")
        blocker = next((a for a in (folder, *folder.parents) if a.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise ShopsimError(f"{flag} {p}: {blocker} is a file, not a folder; choose a writable path")
        missing = [a for a in (folder, *folder.parents) if not a.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        _CREATED.extend(reversed(missing))  # outermost first
        probe = folder / f".shopsim-probe-{os.getpid()}" if is_dir else atomic_path(p)
        with open(probe, "xb"):
            pass
        probe.unlink()
    except FileExistsError:  # a leftover probe or temporary file of an interrupted run: overwritten later
        pass
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise ShopsimError(f"{flag} {p} cannot be written ({reason}); choose a writable path") from None
    return p


def positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def env_help() -> str:
    """The ``--env`` help of a command: the registered env ids (`shopsim.envs.all_env_ids`)."""
    from shopsim.envs import all_env_ids

    return f"env id, one of: {', '.join(all_env_ids())}"
