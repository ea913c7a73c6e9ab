"""CA-PG family (baselines/capg.py) and the PL retriever math it uses (docs/algorithms/capg.md).

Documented approximation error of the released CA-PG inclusion probability (measured here by exact enumeration,
n = 7 items, K = 3, scores ~ N(0, σ²), 5 draws per σ): max |P̂ − P| ≈ 0.045 (σ = 0.5), 0.087 (σ = 1), 0.078 (σ = 2),
0.067 (σ = 4); Σ_a P̂(a) ≈ 3.2-3.3 instead of K = 3 (it over-counts). It is exact for K = 1 and for equal scores.
With a mixture of experts (M = 2, K = 3, same draws) the error is larger: max |P̂ − P| ≈ 0.19.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import baselines
from agents import load_checkpoint
from agents.retrieval_policies import (
    PLRetriever,
    RandomRetriever,
    TwoTowerScorer,
    gumbel_top_k,
    pl_log_prob,
    slot_owners,
)
from baselines.capg import CAPGConfig, capg_log_inclusion, estimator_term, evaluate_policy, gradient_variance
from shopsim.envs.two_stage_retrieval import TwoStageRetrievalSim, load_splits
from shopsim.errors import ConfigError

ENV = "shopsim/TwoStageRetrieval-v0"


def brute_pl_prob(s_by_slot: np.ndarray, seq) -> float:
    """P(ordered seq) with per-slot logits s_by_slot[k] (plain Python, float64)."""
    p, remaining = 1.0, set(range(s_by_slot.shape[1]))
    for k, a in enumerate(seq):
        z = sum(math.exp(s_by_slot[k][b]) for b in remaining)
        p *= math.exp(s_by_slot[k][a]) / z
        remaining.remove(a)
    return p


def exact_inclusion(s: np.ndarray, k: int) -> np.ndarray:
    n = len(s)
    out = np.zeros(n)
    slots = np.broadcast_to(s, (k, n))
    for seq in itertools.permutations(range(n), k):
        p = brute_pl_prob(slots, seq)
        out[list(seq)] += p
    return out


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("numerics", ["stable", "released"])
def test_pl_log_likelihood_matches_brute_force(m, numerics):
    n, k = 6, 3
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(1, m, n, generator=g, dtype=torch.float64) * 1.5
    owners = slot_owners(k, m)
    seqs = list(itertools.permutations(range(n), k))
    ids = torch.tensor(seqs)
    lp = pl_log_prob(scores.expand(len(seqs), m, n), ids, owners, numerics)
    s_by_slot = scores[0].numpy()[owners]
    brute = np.array([brute_pl_prob(s_by_slot, q) for q in seqs])
    tol = 1e-9 if numerics == "stable" else 1e-6  # released: the 1e-10 guard inside log1p shifts it slightly
    np.testing.assert_allclose(lp.exp().numpy(), brute, rtol=tol, atol=1e-12)
    assert lp.exp().sum().item() == pytest.approx(1.0, abs=tol)


def test_gumbel_top_k_samples_the_pl_distribution():
    n, k, draws = 5, 2, 40_000
    scores = torch.tensor([[[1.0, 0.5, 0.0, -0.5, 2.0]]]).expand(draws, 1, n)
    rng = np.random.default_rng(0)
    ids = gumbel_top_k(scores, slot_owners(k, 1), torch.as_tensor(rng.gumbel(size=(draws, 1, n)), dtype=torch.float32))
    seqs = list(itertools.permutations(range(n), k))
    counts = {q: 0 for q in seqs}
    for row in ids.tolist():
        counts[tuple(row)] += 1
    s = scores[0].numpy()
    for q in seqs:
        p = brute_pl_prob(np.broadcast_to(s[0], (k, n)), q)
        # 5-sigma binomial band: fails if the sampler draws from any other distribution
        assert abs(counts[q] / draws - p) < 5 * math.sqrt(p * (1 - p) / draws) + 1e-3


def test_moe_sampling_respects_owners_and_masks():
    owners = slot_owners(7, 3)
    assert owners.tolist() == [0, 0, 0, 1, 1, 2, 2]  # K_m = ⌊7/3⌋, first K mod M experts one more
    scores = torch.randn(50, 3, 20, generator=torch.Generator().manual_seed(1))
    ids = gumbel_top_k(scores, owners, None)
    assert all(len(set(r)) == 7 for r in ids.tolist())
    # slot 0 is expert 0's argmax; expert 1's first pick is its best item not taken by expert 0
    assert torch.equal(ids[:, 0], scores[:, 0].argmax(1))
    with pytest.raises(ConfigError):
        slot_owners(3, 4)


def test_capg_inclusion_vs_exact_enumeration():
    rng = np.random.default_rng(0)
    n, k = 7, 3
    owners = slot_owners(k, 1)
    y = torch.arange(n)[None, :]
    worst = 0.0
    for scale in (0.5, 1.0, 2.0, 4.0):
        for _ in range(3):
            s = rng.normal(size=n) * scale
            exact = exact_inclusion(s, k)
            st = torch.tensor(s)[None, None, :]
            approx = capg_log_inclusion(st, y, owners, "stable").exp()[0].numpy()
            released = capg_log_inclusion(st.float(), y, owners, "released").exp()[0].numpy()
            np.testing.assert_allclose(released, approx, atol=1e-3)  # float32 log1p(−exp(B − A)) cancels a little
            worst = max(worst, np.abs(approx - exact).max())
            # it preserves the ranking of items by inclusion probability
            assert np.array_equal(np.argsort(-approx)[:k], np.argsort(-exact)[:k])
    assert 0.0 < worst < 0.1  # documented in the module docstring (≈ 0.087 at worst)
    # exact cases: K = 1 (softmax) and equal scores (K / n)
    s = torch.tensor(rng.normal(size=n))[None, None, :]
    np.testing.assert_allclose(capg_log_inclusion(s, y, slot_owners(1, 1)).exp()[0].numpy(),
                               torch.softmax(s[0, 0], 0).numpy(), rtol=1e-6)
    eq = capg_log_inclusion(torch.zeros(1, 1, n, dtype=torch.float64), y, owners, "stable").exp()
    np.testing.assert_allclose(eq.numpy(), k / n, rtol=1e-9)


def test_capg_inclusion_moe_vs_exact_enumeration():
    rng = np.random.default_rng(0)
    n, k, m = 7, 3, 2
    owners = slot_owners(k, m)
    worst = 0.0
    for scale in (0.5, 1.0, 2.0, 4.0):
        for _ in range(3):
            s = rng.normal(size=(m, n)) * scale
            exact = np.zeros(n)
            for seq in itertools.permutations(range(n), k):
                exact[list(seq)] += brute_pl_prob(s[owners], seq)
            approx = capg_log_inclusion(torch.tensor(s)[None], torch.arange(n)[None], owners, "stable").exp()
            worst = max(worst, np.abs(approx[0].numpy() - exact).max())
    assert 0.05 < worst < 0.25  # documented above (≈ 0.19)
    # the general (MoE) path with identical experts equals the M = 1 fast path
    s1 = torch.tensor(rng.normal(size=(1, 1, 40)))
    y = torch.tensor([[int(s1.argmax()), 5, 17, 39]])  # the argmax is inside the top-K, the others may not be
    np.testing.assert_allclose(capg_log_inclusion(s1.expand(1, 2, 40), y, slot_owners(6, 2), "stable").numpy(),
                               capg_log_inclusion(s1, y, slot_owners(6, 1), "stable").numpy(), rtol=1e-9)


@pytest.mark.parametrize("name", ["vpg", "vpg_swr", "capg", "capg_swr"])
def test_moe_estimators_give_finite_nonzero_gradients(name):
    algo = baselines.make(name, env_id=ENV, num_experts=3, env_kwargs=SMALL)
    agent = algo.make_agent(0, ENV)
    assert agent.num_experts == 3
    loss, _ = algo.loss(agent, TwoStageRetrievalSim(**SMALL), np.arange(16), np.random.default_rng(0))
    grads = torch.autograd.grad(loss, list(agent.scorer.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)
    # every expert's item table gets a gradient (each owns slots)
    assert all(grads[1][e].abs().sum() > 0 for e in range(3))


def _tiny_problem():
    """n = 5 items, K = 2, L = 1 optimal LSR, deterministic reward μ(a): J(θ) = Σ_S π(S) max_{a∈S} μ(a)."""
    mu = torch.tensor([1.0, 3.0, 2.0, 5.0, 4.0], dtype=torch.float64)
    theta = torch.tensor([0.3, -0.2, 0.5, -0.4, 0.1], dtype=torch.float64, requires_grad=True)
    return mu, theta


def test_score_function_gradient_is_unbiased():
    mu, theta = _tiny_problem()
    n, k = 5, 2
    owners = slot_owners(k, 1)
    seqs = torch.tensor(list(itertools.permutations(range(n), k)))
    logp = pl_log_prob(theta[None, None, :].expand(len(seqs), 1, n), seqs, owners)
    exact = torch.autograd.grad((logp.exp() * mu[seqs].max(1).values).sum(), theta)[0]

    draws = 200_000
    rng = np.random.default_rng(0)
    scores = theta[None, None, :].expand(draws, 1, n)
    cand = gumbel_top_k(scores.detach(), owners, torch.as_tensor(rng.gumbel(size=(draws, 1, n))))
    shown = mu[cand].argmax(1, keepdim=True)
    r = mu[cand].gather(1, shown)
    w = estimator_term("vpg", scores, cand, cand.gather(1, shown), owners, numerics="stable")
    mc = torch.autograd.grad((w * r).mean(), theta)[0]
    np.testing.assert_allclose(mc.numpy(), exact.numpy(), atol=0.02)
    assert exact.abs().max() > 0.1  # the check is not trivially passed by a zero gradient
    # CA-PG is biased (approximate inclusion, no residual) but points the same way as the true gradient
    w_ca = estimator_term("capg", scores, cand, cand.gather(1, shown), owners, numerics="stable")
    ca = torch.autograd.grad((w_ca * r).mean(), theta)[0]
    cos = torch.dot(ca, exact) / (ca.norm() * exact.norm())
    assert cos > 0.9


def test_estimator_terms_relations():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 1, 30, generator=g, dtype=torch.float64)
    owners = slot_owners(5, 1)
    cand = gumbel_top_k(scores, owners, None)
    shown = cand[:, :2]
    top1 = estimator_term("top1", scores, cand, shown, owners)
    np.testing.assert_allclose(top1.numpy(), torch.log_softmax(scores[:, 0], -1).gather(1, shown).numpy())
    swr = estimator_term("capg_swr", scores, cand, shown, owners)
    np.testing.assert_allclose(swr.numpy(), 5 * top1.numpy())  # released MoE term with M = 1: K · log p
    vswr = estimator_term("vpg_swr", scores, cand, shown, owners)
    np.testing.assert_allclose(vswr[:, 0].numpy(), torch.log_softmax(scores[:, 0], -1).gather(1, cand).sum(1))
    assert estimator_term("vpg", scores, cand, shown, owners).shape == (4, 1)
    assert estimator_term("capg", scores, cand, shown, owners).shape == (4, 2)
    lit = estimator_term("capg_swr", scores, cand, shown, owners, swr_inclusion="literal")
    p = torch.softmax(scores[:, 0], -1).gather(1, shown)
    np.testing.assert_allclose(lit.exp().numpy(), (1 - (1 - p) ** 5).numpy(), rtol=1e-6)


def test_released_numerics_overflow_where_stable_does_not():
    # float32: the first pick holds all but e^-30 of the mass, so B rounds to A in the released normaliser
    scores = torch.tensor([[[30.0, 0.0, 0.0, -5.0]]], requires_grad=True)
    ids = torch.tensor([[0, 1]])
    owners = slot_owners(2, 1)
    rel = pl_log_prob(scores, ids, owners, "released")
    assert not torch.isfinite(rel).all() or not torch.isfinite(torch.autograd.grad(rel.sum(), scores)[0]).all()
    st = pl_log_prob(scores, ids, owners, "stable")
    assert torch.isfinite(st).all() and torch.isfinite(torch.autograd.grad(st.sum(), scores)[0]).all()
    assert st.item() == pytest.approx(-math.log(2 + math.exp(-5)), abs=1e-4)
    y = torch.tensor([[1]])  # ca-pg: B_1(y) = {item 0} holds all but e^-30 of the mass too
    ca = capg_log_inclusion(scores, y, owners, "stable")  # P̂ = 1 − (1 − p_1)(1 − p_2) ≈ 1/(2 + e^-5)
    assert ca.item() == pytest.approx(-math.log(2 + math.exp(-5)), abs=1e-4)
    assert torch.isfinite(torch.autograd.grad(ca.sum(), scores)[0]).all()
    assert not torch.isfinite(capg_log_inclusion(scores, y, owners, "released")).all() or not torch.isfinite(
        torch.autograd.grad(capg_log_inclusion(scores, y, owners, "released").sum(), scores)[0]).all()
    # remaining mass e^-100 of the total: the float64 shortcut cancels, the exact fallback gives log(1/3) for slot 2
    peaked = torch.tensor([[[100.0, 0.0, 0.0, 0.0]]])
    assert pl_log_prob(peaked, ids, owners, "stable").item() == pytest.approx(-math.log(3), abs=1e-5)


def test_config_validation_and_defaults():
    with pytest.raises(ConfigError, match="numerics"):
        CAPGConfig(numerics="fast")
    with pytest.raises(ConfigError, match="k must be"):
        CAPGConfig(env_kwargs={"k": 0})
    with pytest.raises(ConfigError, match="unknown option"):
        baselines.make("capg", env_id=ENV, learning_rate=0.1)
    lrs = {n: baselines.make(n, env_id=ENV).lr for n in ("vpg", "vpg_swr", "capg", "top1", "capg_swr")}
    assert lrs == {"vpg": 0.1, "vpg_swr": 0.1, "capg": 0.01, "top1": 0.01, "capg_swr": 0.01}
    assert baselines.make("capg_swr", env_id=ENV).num_experts == 5
    with pytest.raises(ConfigError, match="top1"):
        baselines.make("top1", env_id=ENV, num_experts=2).make_agent(0, ENV)


SMALL = {"n_items": 100, "k": 5}


def _random_value(env_kwargs, n=2000) -> float:
    sim = TwoStageRetrievalSim(**env_kwargs)
    ids = np.asarray(load_splits()["dev"][:n])
    x = sim.contexts(ids)
    cand = RandomRetriever(env_kwargs=env_kwargs, seed=0).sample(len(x))
    return float(sim.evaluate_batch(x, cand, np.random.default_rng(0), deterministic=True).value.mean())


@pytest.mark.parametrize("name", ["vpg", "vpg_swr", "capg", "top1", "capg_swr"])
def test_short_training_beats_random_on_held_out_users(name, tmp_path):
    algo = baselines.make(name, env_id=ENV, batch_size=64, eval_every=20, eval_contexts=2000, env_kwargs=SMALL)
    res = algo.train(ENV, iterations=20, seed=0, out_dir=tmp_path, progress=False)
    assert res.history[-1]["overflow"] == 0
    assert res.history[-1]["value"] > _random_value(SMALL) + 0.5  # dev users (never trained on)
    assert (tmp_path / "metrics.csv").is_file()
    agent = load_checkpoint(res.checkpoint)
    assert type(agent).__name__ == ("MoERetriever" if name == "capg_swr" else "PLRetriever")
    x = np.random.default_rng(1).uniform(-1, 1, (8, 10)).astype(np.float32)
    np.testing.assert_array_equal(agent.sample(x, greedy=True)[0], res.agent.sample(x, greedy=True)[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vpg", "vpg_swr", "capg", "top1", "capg_swr"])
def test_longer_training_on_the_card_preset(name, tmp_path):
    """Card preset (catalog 1000, K = 10, L = 1): 3,000 steps move every estimator well above random."""
    env_kwargs = {"k": 10}
    algo = baselines.make(name, env_id=ENV, eval_every=300, eval_contexts=5000, env_kwargs=env_kwargs)
    res = algo.train(ENV, iterations=300, seed=0, out_dir=tmp_path, progress=False)
    assert res.history[-1]["value"] > _random_value(env_kwargs, 5000) + 0.8 or res.history[-1]["overflow"] == 1


def test_training_is_deterministic_and_changes_parameters(tmp_path):
    kw = {"env_id": ENV, "batch_size": 32, "eval_every": 2, "eval_contexts": 500, "env_kwargs": SMALL}
    a = baselines.make("capg", **kw).train(ENV, iterations=3, seed=7, out_dir=tmp_path / "a", progress=False)
    b = baselines.make("capg", **kw).train(ENV, iterations=3, seed=7, out_dir=tmp_path / "b", progress=False)
    strip = [{k: v for k, v in h.items() if k != "train_seconds"} for h in a.history]
    assert strip == [{k: v for k, v in h.items() if k != "train_seconds"} for h in b.history]
    init = TwoTowerScorer(100, 10, 10, 1, seed=7)
    for p0, p1 in zip(init.parameters(), a.agent.scorer.parameters(), strict=False):
        assert not torch.equal(p0, p1)
    c = baselines.make("capg", **kw).train(ENV, iterations=1, seed=7, out_dir=tmp_path / "c",
                                           init=a.checkpoint, progress=False)
    assert c.history[0]["loss"] != a.history[0]["loss"]  # started from the checkpoint, not from scratch


def test_overflow_stops_the_run_and_is_logged(tmp_path, caplog):
    algo = baselines.make("vpg", env_id=ENV, lr=1e4, optimizer="sgd", batch_size=32, eval_contexts=200,
                          env_kwargs=SMALL)
    res = algo.train(ENV, iterations=30, seed=0, out_dir=tmp_path, progress=False)
    assert res.history[-1]["overflow"] == 1 and len(res.history) < 30
    assert "gradient overflow" in caplog.text


def test_gradient_variance_capg_below_vpg():
    sim = TwoStageRetrievalSim(n_items=200, k=10)
    agent = PLRetriever(env_kwargs={"n_items": 200, "k": 10}, seed=0)
    out = {n: gradient_variance(baselines.make(n, env_id=ENV), agent, sim, batches=12, batch_size=64)
           for n in ("vpg", "capg")}
    assert out["capg"]["trace_cov"] < 0.2 * out["vpg"]["trace_cov"]
    assert out["capg"]["relative"] < out["vpg"]["relative"]


def test_pl_retriever_decisions_carry_logprobs():
    agent = PLRetriever(env_kwargs=SMALL, seed=0)
    agent.reset(2, seed=3)
    obs = [np.full(10, 0.3, np.float32), np.linspace(-1, 1, 10).astype(np.float32)]
    ds = agent.act(obs, [{}, {}], [0, 1])
    for d, o in zip(ds, obs, strict=False):
        assert d.action.dtype == np.int64 and len(set(d.action.tolist())) == 5
        s = agent.scorer(torch.as_tensor(o[None])).detach()
        assert d.logprob == pytest.approx(float(pl_log_prob(s, torch.as_tensor(d.action[None]), agent.owners)), 1e-5)
    assert evaluate_policy(agent, TwoStageRetrievalSim(**SMALL), np.arange(100)) > 1.0


def test_id_user_tower_learns_on_its_pool_and_refuses_other_users(tmp_path):
    """The released code's model: one embedding per user of a fixed pool (released code: n_user 1000)."""
    algo = baselines.make("top1", env_id=ENV, user_tower="id", n_users=50, batch_size=64, eval_every=20,
                          eval_contexts=1000, env_kwargs=SMALL)
    res = algo.train(ENV, iterations=20, seed=0, out_dir=tmp_path, progress=False)
    sim = TwoStageRetrievalSim(**SMALL)
    pool = np.arange(50)
    rand = sim.evaluate_batch(sim.contexts(pool), RandomRetriever(env_kwargs=SMALL, seed=0).sample(50),
                              np.random.default_rng(0), deterministic=True).value.mean()
    assert evaluate_policy(res.agent, sim, pool) > rand + 0.5
    agent = load_checkpoint(res.checkpoint)
    assert agent.scorer.n_users == 50
    d = agent.act([sim.contexts([7])[0]], [{"task_id": 7}], [0])[0]
    np.testing.assert_array_equal(d.action, res.agent.sample(sim.contexts([7]), greedy=True, user_ids=[7])[0][0])
    with pytest.raises(ConfigError, match="user_tower='linear'"):
        agent.act([sim.contexts([1_000_001])[0]], [{"task_id": 1_000_001}], [0])
    with pytest.raises(ConfigError, match="user_tower"):
        CAPGConfig(user_tower="mlp")
