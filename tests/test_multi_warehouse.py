"""multi_warehouse: PettingZoo checkers, multi-step seeded determinism, proportional allocation, rewards."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import data_equivalence
from pettingzoo.test import api_test, parallel_api_test
from pettingzoo.utils import parallel_to_aec

from shopsim.envs import env_record, is_pettingzoo, make
from shopsim.envs import multi_warehouse as mw
from shopsim.envs.replenishment import InvalidActionError

# explained: the hybrid action and the observation are Dict spaces by design; PettingZoo's checker suggests Box
ALLOWED = ("probably should be gymnasium.spaces.box", "Observation is not a NumPy array")


def _check_warnings(caught):
    bad = [str(w.message) for w in caught if not any(a in str(w.message) for a in ALLOWED)]
    assert not bad, bad


def test_registered_and_made_by_id():
    assert is_pettingzoo(mw.ENV_ID) and env_record(mw.ENV_ID).entry_point == mw.__name__
    env = make(mw.ENV_ID, n_warehouses=2)
    assert env.possible_agents == ["warehouse_0", "warehouse_1"]


def test_parallel_api_test():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel_api_test(mw.parallel_env(), num_cycles=300)
    _check_warnings(caught)


def test_aec_api_tests():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        api_test(parallel_to_aec(mw.parallel_env(n_warehouses=2, n_skus=3)), num_cycles=120)
        api_test(mw.env(), num_cycles=50)
    _check_warnings(caught)


def _run(seed, steps=40, **kw):
    env = mw.parallel_env(**kw)
    obs, infos = env.reset(seed=seed, options={"task_id": 4})
    rng = np.random.default_rng(123)
    out = [(obs, infos)]
    for _ in range(steps):
        acts = {a: {"order": rng.integers(0, 2, 5).astype(np.int8),
                    "quantity": rng.uniform(0, 40, 5).astype(np.float32)} for a in env.agents}
        out.append(env.step(acts))
    return out


def test_multi_step_seeded_determinism():
    a, b, c = _run(7), _run(7), _run(8)
    assert data_equivalence(a, b)
    assert not data_equivalence(a, c)


def test_episode_end_and_types():
    env = mw.parallel_env(n_warehouses=2, horizon=5, warmup=1)
    env.max_cycles = 1000  # parallel_api_test overwrites it; the horizon, not max_cycles, ends the episode
    env.reset(seed=0)
    steps = 0
    while env.agents:
        acts = {a: env.action_space(a).sample() for a in env.agents}
        obs, rew, term, trunc, info = env.step(acts)
        steps += 1
        assert all(type(v) is bool for v in (*term.values(), *trunc.values()))
        assert all(type(v) is float for v in rew.values())
    assert steps == 5 and all(term.values())
    assert set(info) == {"warehouse_0", "warehouse_1"}
    assert info["warehouse_0"]["episode_metrics"]["team_cost"] == pytest.approx(
        sum(info[a]["episode_metrics"]["cost"] for a in info))
    assert env.observation_space("warehouse_0") is env.observation_space("warehouse_0")


def test_proportional_allocation_by_hand():
    order = np.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    qty = np.array([[30.0, 10.0], [30.0, 99.0], [60.0, 10.0]])
    cap = np.array([60.0, 40.0])
    shipped, fill = mw.allocate(order, qty, cap)
    # SKU 0: requests 120 > 60 -> everyone gets half; SKU 1: 20 requested (99 not ordered) <= 40 -> full
    np.testing.assert_allclose(fill, [0.5, 1.0])
    np.testing.assert_allclose(shipped[:, 0], [15.0, 15.0, 30.0])
    np.testing.assert_allclose((order * shipped)[:, 1], [10.0, 0.0, 10.0])
    ts, tf = mw.allocate_torch(torch.tensor(order), torch.tensor(qty), torch.tensor(cap))
    np.testing.assert_allclose(ts.numpy(), shipped)
    np.testing.assert_allclose(tf.numpy(), fill)


def test_supplier_limit_binds_and_team_reward():
    env = mw.parallel_env(n_warehouses=3, supplier_capacity=0.5, team_reward=True)
    env.reset(seed=0, options={"task_id": 2})
    big = {a: {"order": np.ones(5, np.int8), "quantity": np.full(5, 100.0, np.float32)} for a in env.agents}
    obs, rew, *_ , info = env.step(big)
    assert info["warehouse_0"]["supply_fill_min"] < 1.0
    assert (obs["warehouse_0"]["supply_fill"] < 1.0).all()
    assert len(set(rew.values())) == 1  # team reward: everyone gets the mean cost
    assert rew["warehouse_0"] == pytest.approx(-np.mean([info[a]["cost"] for a in info]))


def test_invalid_or_missing_actions_raise():
    env = mw.parallel_env(n_warehouses=2)
    env.reset(seed=0)
    good = {"order": np.ones(5, np.int8), "quantity": np.ones(5, np.float32)}
    with pytest.raises(InvalidActionError, match="missing"):
        env.step({"warehouse_0": good})
    with pytest.raises(InvalidActionError, match=">= 0"):
        env.step({"warehouse_0": good, "warehouse_1": {**good, "quantity": -np.ones(5)}})


def test_reference_policies_run_per_warehouse():
    import agents

    team = {}
    for name in ("s_S", "constant"):
        env = mw.parallel_env()
        obs, infos = env.reset(seed=0, options={"task_id": 2_000_000})
        agent = agents.make(name, mw.ENV_ID)
        agent.reset(3, 0)
        for w, a in enumerate(env.agents):
            agent.begin_episode(w, obs[a], infos[a])
        while env.agents:
            ds = agent.act([obs[a] for a in env.agents], [infos[a] for a in env.agents], list(range(3)))
            obs, _, _, _, infos = env.step({a: d.action for a, d in zip(env.agents, ds, strict=False)})
        team[name] = infos["warehouse_0"]["episode_metrics"]["team_cost"]
    assert team["s_S"] < team["constant"]
