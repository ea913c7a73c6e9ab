"""Fuzzing Shopping-v0 with garbage: nothing raises, every garbage action is flagged invalid."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shopsim.envs.shopping import ShoppingEnv

SIZE = 2000


def garbage(rng: np.random.Generator) -> str:
    """An action string that must be invalid: random bytes, unicode, empty, huge, malformed or ill-typed JSON."""
    kind = int(rng.integers(10))
    if kind == 0:
        return ""
    if kind == 1:
        return "".join(chr(int(c)) for c in rng.integers(0x80, 0x2FFFF, size=int(rng.integers(1, 40)))
                       if not 0xD800 <= c <= 0xDFFF)
    if kind == 2:
        return "search[" + "x" * 100_000 + "]"  # 100 kB
    if kind == 3:
        return "{" + "".join(chr(int(c)) for c in rng.integers(32, 127, size=int(rng.integers(0, 60))))
    if kind == 4:
        return json.dumps({"name": "search", "arguments": {"query": [1, {"a": None}]}})
    if kind == 5:
        return json.dumps({"name": ["click"], "arguments": {}})
    if kind == 6:
        return json.dumps({"name": "return_item", "arguments": {"order_id": "W1"}})
    if kind == 7:
        return "~" + "".join(chr(int(c)) for c in rng.integers(32, 127, size=int(rng.integers(0, 80))))
    if kind == 8:
        return "click[\x00\u202e\ud7ff" + "é" * int(rng.integers(1, 5)) + "]"  # nothing clickable has these
    return "\n\t " + "[]" * int(rng.integers(1, 5))


def _fuzz(steps: int, seed: int) -> int:
    env = ShoppingEnv(catalog_size=SIZE, max_invalid=10**9, max_turns=10**9)
    rng = np.random.default_rng(seed)
    flagged = 0
    for fam in ("find_and_buy", "clarify_and_buy", "bundle", "after_sales"):
        obs, info = env.reset(seed=seed, options={"family": fam})
        # reach a page with clickables first, so garbage is also tried on results/product/order pages
        env.step("list_orders" if fam == "after_sales" else "search[shirt]")
        for _ in range(steps // 4):
            a = garbage(rng)
            obs, r, term, trunc, info = env.step(a)
            assert info["invalid_action"], repr(a[:50])
            assert env.observation_space.contains(obs) and not term and not trunc and r == 0.0
            flagged += 1
    return flagged


def test_fuzz_garbage_is_flagged_never_raises():
    assert _fuzz(2000, 0) == 2000


@pytest.mark.slow
def test_fuzz_long():
    assert _fuzz(20_000, 1) == 20_000


def test_action_space_samples_never_raise():
    env = ShoppingEnv(catalog_size=SIZE)
    env.action_space.seed(0)
    obs, info = env.reset(seed=0)
    for _ in range(1000):
        obs, r, term, trunc, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        assert isinstance(info["invalid_action"], (str, type(None)))
        if term or trunc:
            obs, info = env.reset()
