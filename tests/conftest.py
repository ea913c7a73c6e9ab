"""Shared test setup: a per-checkout cache folder, deterministic torch, and the fixtures every test module can use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


@pytest.fixture
def toy_world(tmp_path, monkeypatch):
    """The leaderboard's toy world (`tests.fixtures.leaderboard_toy`): a registered coin env with its agents and
    algorithms and a data dir holding its splits file; returns the data dir."""
    from tests.fixtures import leaderboard_toy

    return leaderboard_toy.install(tmp_path / "data", monkeypatch)


@pytest.fixture(scope="session")
def tok():
    """The shipped LM tokenizer (`agents.lm.tokenizer.load_tokenizer`); read-only in the tests, so shared."""
    from agents.lm.tokenizer import load_tokenizer

    return load_tokenizer()


#: pyproject's `timeout` (300 s) is for the normal suite; a `slow` test (training, benchmark-sized) gets this much
#: unless it sets its own `@pytest.mark.timeout`.
SLOW_TIMEOUT_S = 1800


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
