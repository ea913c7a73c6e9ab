"""Every registered Gymnasium env resets and steps under `gymnasium.vector.AsyncVectorEnv` with every start method.

The parent runs torch multi-threaded before the workers start (as a user's process does once it has built a
ProactiveRec env: its SASRec simulator runs parallel regions), because that is the state in which a forked worker
used to hang in its first torch op (libgomp's thread pool is not fork-safe; `shopsim.envs` makes forked children
single-threaded). Each reset and step waits at most `WAIT_S` seconds: a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import multiprocessing

import gymnasium
import numpy as np
import pytest
import torch

from shopsim.envs import RECORDS

WAIT_S = 90
#: small configurations where an env takes options that make building it expensive
ENV_KWARGS = {"shopsim/Shopping-v0": {"catalog_size": 1000}}
CONTEXTS = [None, "fork", "spawn", "forkserver"]


@pytest.fixture
def threaded_parent():
    """torch with 2 intra-op threads in this process, its OpenMP pool started by a parallel op (the conftest pins
    the suite to one thread, which would hide the fork hang)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    x = torch.randn(256, 256)
    (x @ x).exp().sum()
    yield
    torch.set_num_threads(before)


def _make(env_id: str, kwargs: dict):
    def make():
        import shopsim  # noqa: F401  (registers the ids in a spawned worker)

        return gymnasium.make(env_id, **kwargs)

    return make


@pytest.mark.timeout(4 * WAIT_S)
@pytest.mark.parametrize("context", CONTEXTS, ids=lambda c: c or "default")
@pytest.mark.parametrize("env_id", sorted(r.id for r in RECORDS.values() if r.api == "gymnasium"))
def test_async_vector_env_resets_and_steps(env_id, context, threaded_parent):
    if context is not None and context not in multiprocessing.get_all_start_methods():
        pytest.fail(f"start method {context} is not available on this platform")
    kwargs = ENV_KWARGS.get(env_id, {})
    single = gymnasium.make(env_id, **kwargs)  # the parent builds (and runs) the env too, as gymnasium's dummy env does
    single.reset(seed=0)
    single.close()
    vec = gymnasium.vector.AsyncVectorEnv([_make(env_id, kwargs)] * 2, shared_memory=False, context=context)
    try:
        vec.reset_async(seed=[0, 1])
        obs, infos = vec.reset_wait(timeout=WAIT_S)
        vec.action_space.seed(0)
        for _ in range(2):
            vec.step_async(vec.action_space.sample())
            obs, rewards, terminated, truncated, infos = vec.step_wait(timeout=WAIT_S)
        assert np.asarray(rewards).shape == (2,)
        assert np.all(np.isfinite(np.asarray(rewards, dtype=float)))
    finally:
        vec.close(terminate=True)
