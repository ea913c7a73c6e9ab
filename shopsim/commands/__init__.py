"""One module per `shopsim` subcommand (see `shopsim.cli`)."""

from __future__ import annotations

import os
from pathlib import Path

from shopsim.errors import ShopsimError


def writable_output(path: str | os.PathLike, *, is_dir: bool = False) -> Path:
    """Check early that `path` (a file, or a folder if `is_dir`) can be written; raise a ShopsimError if not."""
    p = Path(path)
    parent = p if is_dir else p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ShopsimError(f"cannot create folder {parent}: {exc.strerror}; choose a writable path") from exc
    if not os.access(parent, os.W_OK):
        raise ShopsimError(f"folder {parent} is not writable; choose a writable path")
    if p.exists() and p.is_dir() != is_dir:
        kind = "a folder" if p.is_dir() else "a file"
        raise ShopsimError(f"{p} is {kind}; give a {'folder' if is_dir else 'file'} path")
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
