"""TwoStageRetrieval-v0: the Gymnasium env, the vectorised simulator, splits, invalid actions and the agents."""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agents
import shopsim  # noqa: F401  (registers the ids)
from agents.retrieval_policies import OracleRetriever, PLRetriever, RandomRetriever
from shopsim.envs.two_stage_retrieval import (
    TwoStageRetrievalConfig,
    TwoStageRetrievalEnv,
    TwoStageRetrievalSim,
    hash_uniform,
    load_splits,
)
from shopsim.errors import ConfigError, ShopsimError

ENV = "shopsim/TwoStageRetrieval-v0"


@pytest.mark.parametrize("kwargs", [{}, {"lsr": "noisy", "l": 3, "k": 20, "n_user_types": 3}, {"lsr": "uniform"},
                                    {"lsr": "anti", "l": 2}, {"item_source": "catalog"}],
                         ids=["default", "noisy", "uniform", "anti", "catalog"])
def test_check_env_passes_without_warnings(kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(gym.make(ENV, **kwargs).unwrapped)
    assert [str(w.message) for w in caught] == []


def test_episode_contract_and_metrics():
    env = gym.make(ENV)
    obs, info = env.reset(seed=0, options={"split": "dev", "task_id": 1_000_003})
    assert obs.dtype == np.float32 and np.linalg.norm(obs) == pytest.approx(1.0, abs=1e-5)
    assert info["task_id"] == 1_000_003 and len(info["oracle"]["top_k"]) == 10
    _, r, term, trunc, info = env.step(np.arange(10))
    assert type(r) is float and term is True and trunc is False
    m = info["episode_metrics"]
    assert set(m) == {"reward", "value", "oracle_value", "regret", "recall", "invalid"}
    assert all(type(v) is float for v in m.values())
    assert info["score"] == m["value"] and isinstance(info["success"], bool)
    assert m["regret"] >= 0 and len(info["shown"]) == 1 and info["shown"][0] in info["candidates"]
    # the optimal LSR shows the candidate with the highest expected reward
    sim = env.unwrapped.sim
    mu = sim.expected_reward(obs[None], np.arange(10)[None])[0]
    assert info["shown"][0] == int(np.argmax(mu)) and info["value"] == pytest.approx(float(mu.max()), 1e-5)


def test_seed_determinism_and_task_ids():
    e1, e2 = gym.make(ENV), gym.make(ENV)
    a = np.arange(10) * 7
    outs = []
    for env, seed in ((e1, 5), (e2, 5)):
        o, i = env.reset(seed=seed, options={"split": "train", "task_id": 42})
        outs.append((o, i, env.step(a)))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    assert outs[0][2][1] == outs[1][2][1] and outs[0][2][4] == outs[1][2][4]
    # the task fixes the context, the seed only the noise
    o3, _ = e1.reset(seed=6, options={"task_id": 42})
    np.testing.assert_array_equal(o3, outs[0][0])
    r3 = e1.step(a)[1]
    assert r3 != outs[0][2][1]
    # without a task id the env draws one from the split with np_random (same seed -> same task)
    t1 = e1.reset(seed=9, options={"split": "test"})[1]["task_id"]
    t2 = e2.reset(seed=9, options={"split": "test"})[1]["task_id"]
    assert t1 == t2 and t1 in set(load_splits()["test"])
    # batch contexts are the same pure function of task ids
    sim = e1.unwrapped.sim
    np.testing.assert_array_equal(sim.contexts([42])[0], outs[0][0])
    assert not np.allclose(sim.contexts([43]), sim.contexts([42]))


def test_splits_are_disjoint():
    s = load_splits()
    lo, hi = s["train"]["range"]
    held = np.asarray(s["dev"] + s["test"])
    assert s["env_id"] == ENV and not ((held >= lo) & (held < hi)).any()
    assert len(set(s["dev"]) & set(s["test"])) == 0


def test_hash_uniform_is_uniform_and_pure():
    u = hash_uniform(1, np.arange(50_000), 3)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    np.testing.assert_array_equal(hash_uniform(1, [7, 8], 3), u[7:9])
    assert not np.allclose(hash_uniform(2, [7], 3), u[7])


@pytest.mark.parametrize("action,reason", [(np.arange(9), "expected 10"), (np.arange(11), "expected 10"),
                                            (np.r_[np.arange(9), 1000], "in [0, 1000)"),
                                            (np.r_[np.arange(9), -1], "in [0, 1000)"),
                                            (np.r_[np.arange(9), 3], "repeat"),
                                            (np.linspace(0, 9, 10), "integers"), ("search[shoes]", "expected 10")])
def test_invalid_actions_are_flagged_steps(action, reason):
    env = gym.make(ENV)
    env.reset(seed=0)
    _, r, term, _, info = env.step(action)
    assert r == 0.0 and term is True and reason in info["invalid_action"]
    assert info["episode_metrics"]["invalid"] == 1.0 and info["success"] is False


def test_batch_api_raises_clear_errors():
    sim = TwoStageRetrievalSim()
    x = sim.contexts(np.arange(3))
    good = np.tile(np.arange(10), (3, 1))
    assert sim.step_batch(x, good, np.random.default_rng(0)).shape == (3,)
    bad = good.copy()
    bad[2, 4] = 3
    with pytest.raises(ShopsimError, match="row 2: a candidate set must not repeat"):
        sim.step_batch(x, bad)
    bad = good.copy()
    bad[1, 0] = 1000
    with pytest.raises(ShopsimError, match=r"row 1: item ids must be in \[0, 1000\)"):
        sim.step_batch(x, bad)
    with pytest.raises(ShopsimError, match="shape"):
        sim.step_batch(x, good[:, :5])
    with pytest.raises(ShopsimError, match="contexts"):
        sim.step_batch(x[:2], good)


def test_rewards_match_the_model():
    sim = TwoStageRetrievalSim(k=10)
    ids = np.zeros(40_000, dtype=np.int64) + 11
    x = sim.contexts(ids)
    cand = np.tile(np.arange(10), (len(ids), 1))
    out = sim.evaluate_batch(x, cand, np.random.default_rng(0))
    assert np.all(out.shown == out.shown[0])  # optimal LSR is deterministic
    mu = out.value[0]
    # observed reward ~ Normal(μ, σ) with σ in (0, 1): mean μ, std below 1, positive
    assert out.reward.mean() == pytest.approx(mu, abs=0.02) and 0 < out.reward.std() < 1
    assert (out.reward > 0).mean() > 0.99
    # q = 10 xᵀ((1−η)M0 + ηMz)e_a recomputed by hand for one pair
    xa, e = x[0].astype(np.float64), sim.items[out.shown[0, 0]]
    def sig(v):
        return 1 / (1 + np.exp(-v))
    eta = np.sqrt(sig(sim.w_x @ xa + 3) * sig(sim.w_a @ e + 3))
    q = 10 * xa @ ((1 - eta) * sim.m0 + eta * sim.mz[0]) @ e
    assert mu == pytest.approx(np.logaddexp(0, q) + 1, rel=1e-5)


def test_lsr_variants_order():
    ids = np.arange(3000)
    cand = np.tile(np.arange(20), (len(ids), 1))
    vals = {}
    for lsr in ("optimal", "noisy", "uniform", "anti"):
        sim = TwoStageRetrievalSim(k=20, l=2, lsr=lsr)
        vals[lsr] = sim.evaluate_batch(sim.contexts(ids), cand, np.random.default_rng(0)).value.mean()
    assert vals["optimal"] > vals["noisy"] > vals["uniform"] > vals["anti"]
    sim = TwoStageRetrievalSim(k=20, l=2, lsr="noisy")
    det = sim.evaluate_batch(sim.contexts(ids), cand, np.random.default_rng(0), deterministic=True).value.mean()
    assert det == pytest.approx(vals["optimal"], rel=1e-6)  # deterministic evaluation: noisy acts greedily


def test_oracle_is_best_and_catalog_variant_has_structure():
    sim = TwoStageRetrievalSim(k=10)
    x = sim.contexts(np.arange(2000))
    rng = np.random.default_rng(0)
    oracle = sim.evaluate_batch(x, sim.oracle_candidates(x), rng).value
    rand = sim.evaluate_batch(x, RandomRetriever(seed=0).sample(len(x)), rng).value
    assert np.all(oracle >= rand - 1e-6) and oracle.mean() > rand.mean() + 1.5
    typed = TwoStageRetrievalSim(k=10, n_user_types=3)
    z = typed.user_types(np.arange(2000))
    assert set(np.unique(z)) == {0, 1, 2}
    top = typed.oracle_candidates(x, z)
    mu = typed.expected_reward(x, None, z)
    np.testing.assert_allclose(np.take_along_axis(mu, top[:, :1], 1)[:, 0], mu.max(1), rtol=1e-6)
    cat = TwoStageRetrievalSim(item_source="catalog")
    # items of the same category are closer than items of different categories
    from shopsim.catalog import load_catalog

    codes = load_catalog(size=1000, seed=0).category_ids
    sims = cat.items @ cat.items.T
    same = codes[:, None] == codes[None, :]
    assert sims[same].mean() > sims[~same].mean() + 0.3


def test_config_errors_say_what_to_change():
    with pytest.raises(ConfigError, match="k must be"):
        TwoStageRetrievalConfig(k=2000)
    with pytest.raises(ConfigError, match="choose one of"):
        gym.make(ENV, lsr="best")
    with pytest.raises(ConfigError, match="l "):
        TwoStageRetrievalConfig(k=3, l=4)


def test_agents_with_the_rollout_runner():
    from shopsim.rollout import collect

    vals = {}
    for name in ("expert", "random"):
        agent = agents.make(name, ENV)
        trajs = collect(ENV, agent, episodes=64, seed=0, split="dev", num_envs=4, progress=False)
        assert all(t.num_turns == 1 and t.terminated for t in trajs)
        vals[name] = np.mean([t.final_info["episode_metrics"]["value"] for t in trajs])
    assert isinstance(agents.make("expert", ENV), OracleRetriever)
    assert vals["expert"] > vals["random"] + 1.5
    pl = PLRetriever(seed=0)
    trajs = collect(ENV, pl, episodes=8, seed=0, num_envs=2, progress=False)
    assert all(t.turns[0].logprob is not None and t.turns[0].logprob < 0 for t in trajs)
    assert all("invalid_action" not in t.final_info for t in trajs)


def test_oracle_without_privileged_info_and_pickling():
    env = TwoStageRetrievalEnv()
    obs, info = env.reset(seed=0, options={"task_id": 5})
    agent = OracleRetriever()
    np.testing.assert_array_equal(agent.act_one(0, obs, {}), info["oracle"]["top_k"])
    clone = pickle.loads(pickle.dumps(env))
    np.testing.assert_array_equal(clone.sim.items, env.sim.items)


def test_sync_vector_env_and_rollout_vector_mode():
    from shopsim.rollout import collect

    venv = gym.vector.SyncVectorEnv([lambda: gym.make(ENV, k=5) for _ in range(3)])
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (3, 10)
    _, r, term, _, info = venv.step(np.tile(np.arange(5), (3, 1)))
    assert r.shape == (3,) and term.all() and "episode_metrics" in info
    venv.close()
    trajs = collect(ENV, RandomRetriever(env_kwargs={"k": 5}, seed=0), episodes=6, seed=0, num_envs=2,
                    env_kwargs={"k": 5}, vector="sync", progress=False)
    assert len(trajs) == 6 and all(t.turns[0].info["episode_metrics"]["invalid"] == 0.0 for t in trajs)
