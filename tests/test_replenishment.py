"""Replenishment-v0: checker, determinism, action rule, hand-computed costs, numpy == torch, gradients, policies."""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import agents
import shopsim  # noqa: F401  (registers the ids)
from shopsim.envs.replenishment import (
    InvalidActionError,
    ReplenishmentConfig,
    ReplenishmentEnv,
    load_split,
    make_scenario,
    step_numpy,
    step_torch,
)
from shopsim.errors import ConfigError

ENV_ID = "shopsim/Replenishment-v0"
# explained: the quantity Box is in units (0..q_max), deliberately not normalised to [-1, 1]
ALLOWED_WARNINGS = ("recommend using a symmetric and normalized space",)


def test_check_env_without_unexplained_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(gym.make(ENV_ID).unwrapped)
        check_env(gym.make(ENV_ID, lost_sales=True, demand="negbin", seasonality=0.3, capacity=100.0).unwrapped)
    bad = [str(w.message) for w in caught if not any(a in str(w.message) for a in ALLOWED_WARNINGS)]
    assert not bad, bad


def _random_actions(env, n, seed):
    rng = np.random.default_rng(seed)
    N = env.unwrapped.n_skus
    return [{"order": rng.integers(0, 2, N).astype(np.int8), "quantity": rng.uniform(0, 30, N).astype(np.float32)}
            for _ in range(n)]


def test_seeded_episode_is_deterministic_and_seed_matters():
    def run(seed):
        env = gym.make(ENV_ID)
        obs, info = env.reset(seed=seed, options={"task_id": 17})
        out = [obs]
        for a in _random_actions(env, 60, 0):
            obs, r, term, trunc, info = env.step(a)
            out.append((obs, r, term, trunc, info))
        return out

    a, b, c = run(3), run(3), run(4)
    assert repr(a) == repr(b)
    assert repr(a) != repr(c)


def test_task_id_fixes_the_scenario_and_seed_only_the_noise():
    env = gym.make(ENV_ID).unwrapped
    o1, _ = env.reset(seed=1, options={"task_id": 5})
    o2, _ = env.reset(seed=2, options={"task_id": 5})
    for k in ("holding", "backlog", "fixed", "demand_mean"):
        np.testing.assert_array_equal(o1[k], o2[k])
    o3, _ = env.reset(seed=1, options={"task_id": 6})
    assert not np.array_equal(o1["holding"], o3["holding"])
    sc = make_scenario(5, ReplenishmentConfig())
    assert (6 <= sc.mean).all() and (sc.mean <= 14).all() and (0.7 <= sc.holding).all() and (sc.backlog <= 11.7).all()


def test_split_draws_and_manifest():
    m = load_split()
    assert m["env_id"] == ENV_ID
    lo, hi = m["train"]["range"]
    assert not ({*m["dev"], *m["test"]} & set(range(lo, hi)))
    env = gym.make(ENV_ID).unwrapped
    for s in range(5):
        _, info = env.reset(seed=s, options={"split": "test"})
        assert info["task_id"] in m["test"]
    with pytest.raises(ValueError, match="unknown split"):
        env.reset(seed=0, options={"split": "validation"})


@pytest.mark.parametrize("bad, msg", [
    ({"order": np.ones(5, np.int8), "quantity": -np.ones(5)}, ">= 0"),
    ({"order": np.ones(5, np.int8), "quantity": np.array([1, 2, np.nan, 3, 4.0])}, "NaN"),
    ({"order": np.ones(4, np.int8), "quantity": np.ones(4)}, "shape"),
    ({"order": np.ones(5, np.int8), "quantity": np.ones((5, 1))}, "shape"),
    ({"order": np.full(5, 2), "quantity": np.ones(5)}, "0 and 1"),
    ({"order": np.ones(5, np.int8), "quantity": np.full(5, 1e6)}, "q_max"),
    (np.ones(10), "dict"),
])
def test_actions_outside_the_space_raise_a_clear_error(bad, msg):
    env = gym.make(ENV_ID).unwrapped
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match=msg):
        env.step(bad)
    assert issubclass(InvalidActionError, ValueError)


def test_config_errors_say_what_to_change():
    with pytest.raises(ConfigError, match="lead_time"):
        ReplenishmentEnv(lead_time=0)
    with pytest.raises(ConfigError, match="demand"):
        ReplenishmentEnv(demand="gamma")
    with pytest.raises(ConfigError, match="has no option 'n_sku'.*did you mean 'n_skus'"):
        ReplenishmentEnv(n_sku=3)


@pytest.mark.parametrize(("options", "message"), [
    ({"seasonality": 1.0}, r"seasonality: expected a value in \[0, 1\), got 1.0"),
    ({"capacity": 0.0}, "capacity: expected a value > 0, got 0.0"),
    ({"fixed_cost": -1.0}, "fixed_cost: expected a value >= 0, got -1.0"),
    ({"dispersion": 0}, "dispersion: expected a value > 0, got 0"),
])
def test_bounds_are_declared_on_the_config_fields(options, message):
    """The ranges once checked by hand in __post_init__ are `bounded` fields: the config, the env's keyword options
    and `check_env_options` (before any env is built) refuse a value out of range with the same words."""
    from shopsim.envs import check_env_options

    with pytest.raises(ConfigError, match=f"^Replenishment config: {message}$"):
        ReplenishmentConfig(**options)
    with pytest.raises(ConfigError, match=f"Replenishment-v0 option {message}$"):
        ReplenishmentEnv(**options)
    with pytest.raises(ConfigError, match=f"^env_kwargs: shopsim/Replenishment-v0 option {message}$"):
        check_env_options(ENV_ID, options)
    with pytest.raises(ConfigError, match="warmup < horizon"):  # a rule across fields stays in __post_init__
        ReplenishmentConfig(horizon=10, warmup=10)
    assert ReplenishmentConfig(n_skus=np.int64(3), capacity=100).capacity == 100.0  # numpy ints and ints still do


# 3 periods by hand: on hand 5, pipeline [3, 0] (L = 2), h = 1, b = 10, K = 64
#   t0: order 10, d = 4: available 5 + 3 = 8, stock 4 -> 4·1 + 64 = 68; pipeline [0, 10]
#   t1: no order, d = 6: available 4 + 0 = 4, short 2 -> 2·10 = 20;      pipeline [10, 0]
#   t2: no order, d = 3: available −2 + 10 = 8, stock 5 -> 5            (backlog: total 93)
#   lost sales: t1 loses 2 (20) and stock floors at 0; t2: 0 + 10 − 3 = 7 -> 7           (total 95)
@pytest.mark.parametrize("lost, expected, final", [(False, [68.0, 20.0, 5.0], 5.0), (True, [68.0, 20.0, 7.0], 7.0)])
@pytest.mark.parametrize("impl", ["numpy", "torch"])
def test_hand_computed_three_periods(lost, expected, final, impl):
    orders, qs, ds = [1.0, 0.0, 0.0], [10.0, 7.0, 0.0], [4.0, 6.0, 3.0]
    if impl == "numpy":
        arr, step = (lambda x: np.array(x, dtype=np.float64)), step_numpy
    else:
        arr, step = (lambda x: torch.tensor(x, dtype=torch.float64)), step_torch
    on, pipe = arr([5.0]), arr([[3.0, 0.0]])
    costs = []
    for o, q, d in zip(orders, qs, ds, strict=False):
        out = step(on, pipe, arr([o]), arr([q]), arr([d]), arr([1.0]), arr([10.0]), arr([64.0]), lost_sales=lost)
        on, pipe = out.on_hand, out.pipeline
        costs.append(float(out.total))
    assert costs == expected
    assert float(on[0]) == final


def test_env_rewards_and_reported_cost_match_the_dynamics():
    env = gym.make(ENV_ID, n_skus=3, warmup=2, horizon=6).unwrapped
    env.reset(seed=0, options={"task_id": 1})
    rewards, info = [], {}
    for a in _random_actions(env, 6, 1):
        _, r, term, trunc, info = env.step(a)
        assert isinstance(r, float) and type(term) is bool and type(trunc) is bool
        rewards.append(r)
    assert term and not trunc
    m = info["episode_metrics"]
    assert m["cost"] == pytest.approx(-sum(rewards[2:]))
    assert m["total_cost"] == pytest.approx(-sum(rewards))
    assert m["cost"] == pytest.approx(m["holding_cost"] + m["backlog_cost"] + m["fixed_cost"] + m["overflow_cost"])
    assert 0.0 <= m["fill_rate"] <= 1.0 and info["score"] == -m["cost"]


@pytest.mark.parametrize("lost, cap", [(False, None), (True, 150.0)])
def test_numpy_and_torch_steps_agree_over_a_batch(lost, cap):
    rng = np.random.default_rng(0)
    B, N, L = 7, 5, 2
    on, pipe = rng.uniform(-20, 40, (B, N)), rng.uniform(0, 20, (B, N, L))
    if lost:
        on = np.abs(on)
    h, b, k = rng.uniform(0.7, 1.3, (B, N)), rng.uniform(6, 12, (B, N)), np.full((B, N), 64.0)
    ton, tpipe = torch.tensor(on), torch.tensor(pipe)
    t = lambda x: torch.tensor(x)  # noqa: E731
    for _ in range(20):
        order = rng.integers(0, 2, (B, N)).astype(np.float64)
        q = rng.uniform(0, 30, (B, N)) * (rng.random((B, N)) > 0.1)
        d = rng.poisson(10, (B, N)).astype(np.float64)
        a = step_numpy(on, pipe, order, q, d, h, b, k, lost_sales=lost, capacity=cap, overflow_cost=5.0)
        c = step_torch(ton, tpipe, t(order), t(q), t(d), t(h), t(b), t(k), lost_sales=lost, capacity=cap,
                       overflow_cost=5.0)
        for x, y in zip(a, c, strict=False):
            np.testing.assert_allclose(x, y.numpy(), rtol=1e-12, atol=1e-12)
        on, pipe, ton, tpipe = a.on_hand, a.pipeline, c.on_hand, c.pipeline


@pytest.mark.parametrize("lost", [False, True])
def test_step_torch_gradients_match_finite_differences(lost):
    rng = np.random.default_rng(1)
    T, B, N, L = 6, 3, 4, 2
    orders = torch.tensor(rng.integers(0, 2, (T, B, N)), dtype=torch.float64)
    demand = torch.tensor(rng.poisson(10, (T, B, N)), dtype=torch.float64)
    h, b, k = (torch.tensor(rng.uniform(lo, hi, (B, N))) for lo, hi in ((0.7, 1.3), (6, 12), (64, 64)))
    on0 = torch.tensor(rng.uniform(0, 30, (B, N)), dtype=torch.float64)
    pipe0 = torch.tensor(rng.uniform(0, 15, (B, N, L)), dtype=torch.float64)

    def total_cost(q):  # q: (T, B, N), strictly positive so the fixed-cost indicator never flips
        on, pipe, tot = on0, pipe0, 0.0
        for t in range(T):
            out = step_torch(on, pipe, orders[t], q[t], demand[t], h, b, k, lost_sales=lost, capacity=120.0,
                             overflow_cost=2.0)
            on, pipe, tot = out.on_hand, out.pipeline, tot + out.total.sum()
        return tot

    q = torch.tensor(rng.uniform(1, 25, (T, B, N)), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(total_cost, (q,), eps=1e-6, atol=1e-5)
    g, = torch.autograd.grad(total_cost(q), q)
    assert g.abs().sum() > 0  # quantities ordered early do change later costs
    assert torch.all(g[-L:][orders[-L:] == 0] == 0)  # quantities without an order have no effect


def test_scales_to_many_skus_and_pickles():
    env = gym.make(ENV_ID, n_skus=1000).unwrapped
    obs, _ = env.reset(seed=0)
    assert obs["on_hand"].shape == (1000,) and obs["pipeline"].shape == (1000, 2)
    obs, r, *_ = env.step({"order": np.ones(1000, np.int8), "quantity": np.full(1000, 10.0, np.float32)})
    assert env.observation_space.contains(obs) and np.isfinite(r)
    clone = pickle.loads(pickle.dumps(env))
    a = {"order": np.zeros(1000, np.int8), "quantity": np.zeros(1000, np.float32)}
    assert clone.step(a)[1] == env.step(a)[1]


def test_vector_env_and_catalog_option():
    venv = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(2)])
    obs, _ = venv.reset(seed=[0, 1])
    assert obs["on_hand"].shape == (2, 5)
    venv.close()
    env = gym.make(ENV_ID, use_catalog=True, catalog_size=1000).unwrapped
    _, info = env.reset(seed=0, options={"task_id": 3})
    sc = info["scenario"]
    assert len(sc["skus"]) == 5 and len(set(sc["skus"])) == 5 and all(p > 0 for p in sc["prices"])
    _, info2 = env.reset(seed=9, options={"task_id": 3})
    assert info2["scenario"]["skus"] == sc["skus"]


def _episode_cost(agent, task, seed=0, **kw):
    env = gym.make(ENV_ID, **kw).unwrapped
    obs, info = env.reset(seed=seed, options={"task_id": task})
    agent.reset(1, seed)
    agent.begin_episode(0, obs, info)
    done = False
    while not done:
        obs, _, done, _, info = env.step(agent.act([obs], [info], [0])[0].action)
    return info["episode_metrics"]["cost"]


def test_reference_policies_rank_as_expected():
    tasks = load_split()["test"][:4]
    cost = {name: np.mean([_episode_cost(agents.make(name, ENV_ID), t) for t in tasks])
            for name in ("s_S", "base_stock", "constant", "random")}
    assert cost["s_S"] < cost["base_stock"] < cost["random"]
    assert cost["s_S"] < cost["constant"]
    ss = agents.make("s_S", ENV_ID)
    env = gym.make(ENV_ID).unwrapped
    obs, info = env.reset(seed=0, options={"task_id": tasks[0]})
    ss.begin_episode(0, obs, info)
    s, S = ss.levels(0)
    assert (s < S).all() and (S > 0).all()


def test_perfect_information_bound_matches_brute_force():
    import itertools

    from agents.inventory_policies import perfect_information_cost
    from shopsim.envs.replenishment import Scenario

    cfg = ReplenishmentConfig(n_skus=1, lead_time=1, horizon=4, warmup=1, fixed_cost=10.0)
    scen = Scenario(np.array([5.0]), np.array([1.0]), np.array([4.0]), np.array([10.0]), np.zeros(1))
    rng = np.random.default_rng(0)
    for _ in range(2):
        dem = rng.integers(0, 8, (4, 1)).astype(float)
        on, pipe = np.array([float(rng.integers(0, 6))]), np.array([[float(rng.integers(0, 6))]])
        best = np.inf
        for qs in itertools.product(range(0, 22), repeat=3):  # orders at t = 0, 1, 2 (t = 3 never arrives)
            o, p, c = on, pipe, 0.0
            for t in range(4):
                q = np.array([float(qs[t]) if t < 3 else 0.0])
                out = step_numpy(o, p, (q > 0).astype(float), q, dem[t], scen.holding, scen.backlog, scen.fixed)
                o, p = out.on_hand, out.pipeline
                c += float(out.total) if t >= 1 else 0.0
            best = min(best, c)
        assert float(perfect_information_cost(scen, cfg, dem, on, pipe)[0]) == pytest.approx(best)


def test_perfect_information_bound_is_below_s_S_on_the_same_episode():
    from agents.inventory_policies import perfect_information_episode_cost

    cfg = ReplenishmentConfig()
    for t in load_split()["test"][:3]:
        pi = perfect_information_episode_cost(t, 0, cfg)
        ss = _episode_cost(agents.make("s_S", ENV_ID), t, seed=0)
        assert 0 < pi < ss
