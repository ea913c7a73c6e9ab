"""Shared test setup: a per-checkout cache folder, deterministic torch, the `slow` marker."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Built catalogs / indexes / simulators are cached here so repeated local runs are fast; CI starts empty.
os.environ.setdefault("SHOPSIM_CACHE_DIR", str(ROOT / ".cache" / "test"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
except ImportError:  # pragma: no cover - torch is a hard dependency
    pass
