"""HPO and hybrid PPO: paper defaults, gradient routing, determinism, checkpoints, env equivalence, learning."""

from __future__ import annotations

import dataclasses
import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import agents
import baselines
from agents.inventory_nets import HybridPolicy, SumValue
from agents.inventory_policies import ConstantOrderAgent, SSPolicyAgent
from baselines.hpo import HPO, HPOConfig
from baselines.hybrid_ppo import HybridPPO, InventorySim, evaluate
from shopsim.envs.replenishment import load_split
from shopsim.errors import ConfigError

ENV_ID = "shopsim/Replenishment-v0"
TINY = dict(batch_scenarios=4, eval_scenarios=2, hidden=(16, 16), value_hidden=(16, 16))


def test_registry_and_card_defaults():
    assert baselines.resolve("hpo", env_id=ENV_ID) is HPO
    assert baselines.resolve("ppo", env_id=ENV_ID) is HybridPPO
    c = HPOConfig()
    assert (c.lr, c.clip, c.gamma, c.gae_lambda, c.update_epochs, c.minibatches) == (0.003, 0.16, 0.93, 0.96, 5, 4)
    assert (c.vf_coef, c.pathwise_coef, c.buffer_periods, c.max_grad_norm, c.target_kl) == (0.13, 10.0, 20, 5.0, 0.015)
    assert c.hidden == (512, 512) and c.value_hidden == (64, 64) and c.ent_coef == 0 and not c.disable_cross_term
    p = HybridPPO().config
    got = (p.lr, p.clip, p.gamma, p.gae_lambda, p.update_epochs, p.vf_coef, p.ent_coef)
    assert got == (3e-4, 0.2, 0.99, 0.95, 5, 0.5, 0)
    with pytest.raises(ConfigError, match="clip"):
        HPO(clip=1.5)
    with pytest.raises(ConfigError, match="valid options"):
        HPO(pathwise=1.0)


def _rollout_losses(disable_cross_term: bool):
    torch.manual_seed(0)
    algo = HPO(**TINY, disable_cross_term=disable_cross_term)
    sim = InventorySim(ENV_ID, {"horizon": 12, "warmup": 2})
    policy = HybridPolicy(sim.n_feat, (16, 16))
    with torch.no_grad():  # make the order head non-trivial so the discrete loss depends on the state
        policy.disc[-1].weight.normal_(0, 0.5)
    value = SumValue(sim.n_feat, (16, 16))
    b = sim.sample_train(3, np.random.default_rng(0))
    ro = sim.rollout(policy, b, mode="pathwise", gen=torch.Generator().manual_seed(0), graph=True)
    adv, ret, _ = algo.advantages(ro, value)
    T, B, W, N, F = ro["feats"].shape
    feats = ro["feats"].reshape(-1, N, F)
    pg, vl, _, _ = algo.ppo_loss(policy, value, feats.detach() if disable_cross_term else feats,
                                 ro["order"].reshape(-1, N), ro["u"].reshape(-1, N), ro["logp"].reshape(-1), adv, ret,
                                 with_gaussian=False, value_feats=feats.detach())
    return policy, value, ro, pg, vl


def _grad_norm(loss, params):
    gs = torch.autograd.grad(loss, list(params), retain_graph=True, allow_unused=True)
    return sum(float(g.abs().sum()) for g in gs if g is not None)


def test_gradient_routing_value_pathwise_and_cross_term():
    policy, value, ro, pg, vl = _rollout_losses(disable_cross_term=False)
    assert _grad_norm(vl, policy.cont.parameters()) == 0.0  # the value loss never reaches the continuous head
    assert _grad_norm(vl, value.parameters()) > 0
    assert _grad_norm(ro["cost"].mean(), policy.cont.parameters()) > 0  # pathwise gradient exists
    assert _grad_norm(pg, policy.cont.parameters()) > 0  # cross term: discrete loss -> states -> earlier quantities
    policy, value, ro, pg, vl = _rollout_losses(disable_cross_term=True)
    assert _grad_norm(pg, policy.cont.parameters()) == 0.0
    assert _grad_norm(pg, policy.disc.parameters()) > 0


@pytest.mark.parametrize("cls", [HPO, HybridPPO])
def test_tiny_training_changes_parameters_is_deterministic_and_checkpoints(cls, tmp_path):
    algo = cls(**TINY)
    kw = dict(iterations=2, seed=3, progress=False, env_kwargs={"horizon": 30, "warmup": 5})
    r1 = algo.train(ENV_ID, out_dir=tmp_path / "a", **kw)
    r2 = cls(**TINY).train(ENV_ID, out_dir=tmp_path / "b", **kw)
    assert [h["train_cost"] for h in r1.history] == [h["train_cost"] for h in r2.history]
    assert "dev_cost" in r1.history[-1] and (tmp_path / "a" / "metrics.csv").is_file()
    torch.manual_seed(3)
    fresh = HybridPolicy(r1.agent.policy.n_feat, (16, 16))
    trained = r1.agent.policy.state_dict().values()
    changed = [not torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained, strict=True)]
    assert all(changed) if cls is HPO else any(changed)
    loaded = agents.load_checkpoint(r1.checkpoint)
    for a, b in zip(loaded.policy.state_dict().values(), r1.agent.policy.state_dict().values(), strict=False):
        assert torch.equal(a, b)


def test_batched_evaluation_equals_env_episodes(tmp_path):
    r = HPO(**TINY).train(ENV_ID, iterations=1, seed=0, out_dir=tmp_path, progress=False)
    tasks, seeds = load_split()["test"][:3], (0, 5)
    sim_cost = evaluate(r.agent.policy, InventorySim(ENV_ID), task_ids=tasks, seeds=seeds, mode="pathwise")
    env = gym.make(ENV_ID).unwrapped
    costs = []
    for t in tasks:
        for s in seeds:
            obs, info = env.reset(seed=s, options={"task_id": t})
            done = False
            while not done:
                obs, _, done, _, info = env.step(r.agent.act([obs], [info], [0])[0].action)
            costs.append(info["episode_metrics"]["cost"])
    assert sim_cost == pytest.approx(np.mean(costs), rel=1e-4)


def test_trains_on_multi_warehouse_with_shared_parameters(tmp_path):
    from shopsim.envs import multi_warehouse as mw

    kw = {"n_warehouses": 2, "n_skus": 3, "horizon": 20, "warmup": 2}
    r = HPO(**TINY).train(mw.ENV_ID, iterations=2, seed=0, out_dir=tmp_path, progress=False, env_kwargs=kw)
    assert np.isfinite(r.history[-1]["dev_cost"])
    env = mw.parallel_env(**kw)
    obs, infos = env.reset(seed=0)
    while env.agents:  # one policy acts for every warehouse
        ds = r.agent.act([obs[a] for a in env.agents], [infos[a] for a in env.agents], list(range(len(env.agents))))
        obs, _, _, _, infos = env.step({a: d.action for a, d in zip(env.agents, ds, strict=False)})
    assert all(np.isfinite(i["episode_metrics"]["cost"]) for i in infos.values())


def _constant_cost(tasks):
    env = gym.make(ENV_ID).unwrapped
    agent, costs = ConstantOrderAgent(env_id=ENV_ID), []
    for t in tasks:
        obs, info = env.reset(seed=0, options={"task_id": t})
        done = False
        while not done:
            obs, _, done, _, info = env.step(agent.act_one(0, obs, info))
        costs.append(info["episode_metrics"]["cost"])
    return float(np.mean(costs))


def test_hpo_learns_to_beat_constant_order_on_held_out_scenarios(tmp_path):
    """Small version: 16 updates of 16 scenarios (25,600 simulated periods), a [32, 32] policy, 16 test tasks."""
    r = HPO(batch_scenarios=16, eval_scenarios=0, hidden=(32, 32)).train(ENV_ID, iterations=16, seed=0,
                                                                          out_dir=tmp_path, progress=False)
    tasks = load_split()["test"][:16]
    hpo = evaluate(r.agent.policy, InventorySim(ENV_ID), task_ids=tasks, mode="pathwise")
    assert hpo < 0.8 * _constant_cost(tasks)


@pytest.mark.slow
def test_hpo_learns_close_to_tuned_s_S(tmp_path):
    """Bigger version: 60 updates of 64 scenarios; HPO beats constant by far and gets within 25% of tuned (s, S)."""
    r = HPO(batch_scenarios=64, eval_scenarios=0, hidden=(64, 64)).train(ENV_ID, iterations=60, seed=0,
                                                                          out_dir=tmp_path, progress=False)
    tasks = load_split()["test"][:32]
    hpo = evaluate(r.agent.policy, InventorySim(ENV_ID), task_ids=tasks, mode="pathwise")
    env = gym.make(ENV_ID).unwrapped
    ss, costs = SSPolicyAgent(env_id=ENV_ID), []
    for t in tasks:
        obs, info = env.reset(seed=0, options={"task_id": t})
        ss.begin_episode(0, obs, info)
        done = False
        while not done:
            obs, _, done, _, info = env.step(ss.act_one(0, obs, info))
        costs.append(info["episode_metrics"]["cost"])
    assert hpo < 0.5 * _constant_cost(tasks)
    assert hpo < 1.25 * np.mean(costs)


def test_gaussian_logp_matches_the_formula():
    """log π(o, u) = Σ_n [o log σ(z) + (1 − o) log(1 − σ(z))] + o·[−(u − x)²/(2σ²) − log σ − ½ log 2π]."""
    torch.manual_seed(0)
    policy = HybridPolicy(7, (8, 8), std=0.4).double()
    feats = torch.randn(5, 3, 7, dtype=torch.float64)
    order = (torch.rand(5, 3) > 0.4).double()
    u = torch.randn(5, 3, dtype=torch.float64)
    lp, ent = HybridPPO().logp(policy, feats, order, u, with_gaussian=True)
    z, x = policy(feats)
    p = torch.sigmoid(z)
    gauss = -((u - x) ** 2) / (2 * 0.4**2) - math.log(0.4) - 0.5 * math.log(2 * math.pi)
    want = (order * torch.log(p) + (1 - order) * torch.log(1 - p) + order * gauss).sum(-1)
    assert torch.allclose(lp, want, atol=1e-10)
    assert torch.allclose(ent, (-(p * torch.log(p) + (1 - p) * torch.log(1 - p))).sum(-1), atol=1e-10)
    lp_disc, _ = HybridPPO().logp(policy, feats, order, u, with_gaussian=False)
    assert torch.allclose(lp - lp_disc, (order * gauss).sum(-1), atol=1e-10)


def test_gaussian_rollout_records_the_logp_of_its_samples():
    """The behaviour log-prob stored by a Gaussian rollout equals the formula at the sampled (order, u)."""
    torch.manual_seed(1)
    sim = InventorySim(ENV_ID, {"horizon": 6, "warmup": 1})
    policy = HybridPolicy(sim.n_feat, (16, 16), std=0.5)
    ro = sim.rollout(policy, sim.sample_train(2, np.random.default_rng(0)), mode="gaussian",
                     gen=torch.Generator().manual_seed(0))
    T, B, W, N, F = ro["feats"].shape
    with torch.no_grad():
        lp, _ = HybridPPO().logp(policy, ro["feats"].reshape(-1, N, F), ro["order"].reshape(-1, N),
                                 ro["u"].reshape(-1, N), with_gaussian=True)
    assert torch.allclose(lp, ro["logp"].reshape(-1), atol=1e-5)
    assert ro["order"].sum() > 0 and (ro["u"] != 0).any()


def test_gaussian_hybrid_ppo_learns_to_beat_constant_order(tmp_path):
    """24 updates of 16 scenarios: the Gaussian hybrid PPO beats its own start (by 10x) and the constant-order
    rule on held-out scenarios."""
    kw = dict(batch_scenarios=16, eval_scenarios=0, hidden=(32, 32), value_hidden=(32, 32), lr=3e-3)
    sim = InventorySim(ENV_ID)
    tasks = load_split()["test"][:16]
    start, _ = HybridPPO(**kw).build(sim, 0)
    before = evaluate(start, sim, task_ids=tasks, mode="gaussian")
    r = HybridPPO(**kw).train(ENV_ID, iterations=24, seed=0, out_dir=tmp_path, progress=False)
    after = evaluate(r.agent.policy, sim, task_ids=tasks, mode="gaussian")
    assert after < 0.1 * before
    assert after < 0.7 * _constant_cost(tasks)


def test_config_env_kwargs_reach_the_simulator_and_bad_ones_are_rejected(tmp_path):
    c = HPOConfig(env_kwargs={"n_skus": 12})
    assert dataclasses.asdict(c)["env_kwargs"] == {"n_skus": 12}
    r = HPO(**TINY, env_kwargs={"n_skus": 12, "horizon": 10, "warmup": 2}).train(
        ENV_ID, iterations=1, seed=0, out_dir=tmp_path, progress=False)
    manifest = json.loads((r.checkpoint / "shopsim_agent.json").read_text())
    assert manifest["env_kwargs"] == {"n_skus": 12, "horizon": 10, "warmup": 2}
    env = gym.make(ENV_ID, **manifest["env_kwargs"]).unwrapped
    obs, _ = env.reset(seed=0)
    assert env.config.n_skus == 12 and env.config.horizon == 10
    assert r.agent.policy.n_feat == InventorySim(ENV_ID, manifest["env_kwargs"]).n_feat
    with pytest.raises((ConfigError, TypeError)):
        HPO(**TINY, env_kwargs={"n_skuz": 12}).train(ENV_ID, iterations=1, seed=0, out_dir=tmp_path / "x",
                                                     progress=False)
