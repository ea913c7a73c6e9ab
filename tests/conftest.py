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

#: pyproject's `timeout` (300 s) is for the normal suite; a `slow` test (training, benchmark-sized) gets this much
#: unless it sets its own `@pytest.mark.timeout`.
SLOW_TIMEOUT_S = 1800


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
