"""Every registered env passes the conformance checks of `shopsim.testing` (docs/adding-an-env.md).

Parametrised over the env registry (`shopsim.envs.all_env_ids`: every env record, Gymnasium and PettingZoo), so a
newly registered env is checked without touching this file (built with its record's ``test_kwargs``):

* ``api`` — Gymnasium's `check_env` (PettingZoo's `parallel_api_test` and `api_test` for a PettingZoo env);
* ``determinism`` — two fresh runs with the same seed (the env's random agent) give the same observations, rewards
  and episode ends, and the reset seed matters;
* ``pickling`` — a copy pickled mid-episode continues exactly as the original does;
* ``protocol`` — the reference agent on a two-task protocol: a results file, read back and rendered into its
  leaderboard row.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.envs.registration import register, registry

import shopsim  # noqa: F401  (registers the env ids)
from agents.base import ScriptedAgent
from shopsim.envs import EnvRecord, all_env_ids, env_record
from shopsim.testing import CONFORMANCE_CHECKS


@pytest.mark.filterwarnings("ignore")  # the env's own tests judge the checkers' warnings; here their errors count
@pytest.mark.parametrize("check", list(CONFORMANCE_CHECKS))
@pytest.mark.parametrize("env_id", all_env_ids())
def test_env_conformance(env_id, check, tmp_path):
    fn = CONFORMANCE_CHECKS[check]
    kwargs = dict(env_record(env_id).test_kwargs)  # options that build the same tasks quickly
    if check == "protocol":
        row = fn(env_id, tmp_path / "results", kwargs)
        print(row)
    else:
        fn(env_id, kwargs)


# ---- each check can fail: a toy env with one defect at a time ------------------------------------------------------

class _Walk(gym.Env):
    """Walk left/right for 5 steps from a seeded start; the variants below each break one rule."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Box(-10.0, 10.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def _start(self) -> float:
        return float(self.np_random.uniform(-1, 1))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = self._start(), 0
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += 1.0 if int(action) else -1.0
        self.t += 1
        done = self.t >= 5
        info = {"episode_metrics": {"success": float(self.x > 0)}} if done else {}
        return np.array([self.x], np.float32), float(self.x > 0), done, False, info


class _OutOfSpace(_Walk):
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs.astype(np.float64), info  # not the Box's float32


class _Unseeded(_Walk):
    def _start(self) -> float:
        return float(np.random.default_rng().uniform(-1, 1))  # ignores the reset seed


class _Unpicklable(_Walk):
    def reset(self, *, seed=None, options=None):
        self.log = (t for t in range(3))  # a generator does not pickle
        return super().reset(seed=seed, options=options)


class _ForgetfulPickle(_Walk):
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "x"}

    def __setstate__(self, state):
        self.__dict__.update(state, x=0.0)  # restarts the walk from 0 instead of where it was


class _RandomWalker(ScriptedAgent):
    def __init__(self, *, env_id=None):
        self.name = "random"

    def act_one(self, slot, observation, info):
        return int(self.rng.integers(0, 2))


@pytest.mark.parametrize(("env_cls", "check", "error"), [
    (_OutOfSpace, "api", "observation"),
    (_Unseeded, "determinism", "differ"),
    (_Unpicklable, "pickling", "pickle"),
    (_ForgetfulPickle, "pickling", "unpickled copy differs"),
    (_Walk, "protocol", "no evaluation split"),
])
def test_each_check_fails_on_an_env_that_breaks_its_rule(env_cls, check, error, tmp_path, monkeypatch):
    import agents.registry
    import shopsim.envs

    env_id = f"test/{env_cls.__name__.strip('_')}-v0"
    if env_id not in registry:
        register(id=env_id, entry_point=f"{__name__}:{env_cls.__name__}")
    monkeypatch.setitem(shopsim.envs.RECORDS, env_id, EnvRecord(env_id, f"{__name__}:{env_cls.__name__}", "walk",
                                                                 description="a toy walk"))
    monkeypatch.setitem(agents.registry._REGISTRY, ("random", "walk"), f"{__name__}:_RandomWalker")
    monkeypatch.setenv("SHOPSIM_DATA_DIR", str(tmp_path / "data"))  # no splits file there
    args = (env_id, tmp_path / "results", {}) if check == "protocol" else (env_id, {})
    with pytest.raises(Exception, match=error):
        CONFORMANCE_CHECKS[check](*args)
    for other in CONFORMANCE_CHECKS if env_cls is _Walk else ():  # the sound walk passes the others
        if other != "protocol":
            CONFORMANCE_CHECKS[other](env_id, {})
