"""MPO's derived design (docs/algorithms/mpo.md): mean preservation, reduction to GAE, λ_intra = 1, turn ratios."""

import math

import pytest
import torch

import baselines
from baselines.core.gae import gae
from baselines.mpo import MPOConfig, between_turn_variance_share, mpo_advantages, turn_ratio
from shopsim.errors import ConfigError


def _layout():
    # 2 trajectories; traj 0: turns of 3, 2, 4 tokens; traj 1: turns of 1, 3 tokens (+ padding)
    turns = [[0, 0, 0, 1, 1, 2, 2, 2, 2], [0, 1, 1, 1, -1, -1, -1, -1, -1]]
    tt = torch.tensor(turns)
    mask = tt >= 0
    g = torch.Generator().manual_seed(0)
    values = torch.randn(2, 9, generator=g, dtype=torch.float64) * mask
    rewards = torch.tensor([[0.0, 0.5, 1.0], [0.0, -1.0, 0.0]], dtype=torch.float64)
    return values, mask, tt, rewards


@pytest.mark.parametrize("beta", [1.0, 0.3, 2.5])
def test_mean_preservation_exact(beta):
    values, mask, tt, rewards = _layout()
    out = mpo_advantages(values, mask, tt, rewards, lam_turn=0.8, lam_intra=0.95, beta=beta)
    for i in range(2):
        for k in range(3):
            sel = mask[i] & (tt[i] == k)
            if sel.any():
                assert out["adv"][i][sel].mean().item() == pytest.approx(out["turn_adv"][i, k].item(), abs=1e-12)
    # the correction itself is not zero (otherwise the test would be vacuous)
    assert (out["adv"][mask] - torch.gather(out["turn_adv"], 1, tt.clamp_min(0))[mask]).abs().max() > 1e-3


def test_turn_level_matches_hand_gae():
    values, mask, tt, rewards = _layout()
    out = mpo_advantages(values, mask, tt, rewards, lam_turn=0.8, gamma=1.0)
    # traj 0 turn values = value at first token of each turn
    V = torch.stack([values[0, 0], values[0, 3], values[0, 5]])
    d = [rewards[0, 0] + V[1] - V[0], rewards[0, 1] + V[2] - V[1], rewards[0, 2] - V[2]]
    A2 = d[2]
    A1 = d[1] + 0.8 * A2
    A0 = d[0] + 0.8 * A1
    assert out["turn_adv"][0].tolist() == pytest.approx([A0.item(), A1.item(), A2.item()], abs=1e-12)


def test_one_token_turns_equal_token_gae():
    g = torch.Generator().manual_seed(3)
    N, K = 3, 5
    values = torch.randn(N, K, generator=g, dtype=torch.float64)
    rewards = torch.randn(N, K, generator=g, dtype=torch.float64)
    tt = torch.arange(K).expand(N, K)
    mask = torch.ones(N, K, dtype=torch.bool)
    out = mpo_advantages(values, mask, tt, rewards, lam_turn=0.8, lam_intra=0.95, beta=1.0)
    ref, _ = gae(rewards, values, mask, gamma=1.0, lam=0.8)
    assert torch.allclose(out["adv"], ref, atol=1e-12)


def test_lam_intra_one_first_token_equals_turn_td():
    values, mask, tt, rewards = _layout()
    out = mpo_advantages(values, mask, tt, rewards, lam_intra=1.0, lam_turn=0.8)
    V = out["turn_values"]
    # δ_0 of traj 0: r_0 + V_1 − V_0
    assert out["intra"][0, 0].item() == pytest.approx((rewards[0, 0] + V[0, 1] - V[0, 0]).item(), abs=1e-12)
    # last turn of traj 1 ends the episode: δ = r − V
    assert out["intra"][1, 1].item() == pytest.approx((rewards[1, 1] - V[1, 1]).item(), abs=1e-12)


def test_within_turn_hand_values():
    # one trajectory, one turn of 3 tokens: δ = [V1−V0, V2−V1, r−V2]
    v = torch.tensor([[0.1, 0.4, 0.2]], dtype=torch.float64)
    tt = torch.zeros(1, 3, dtype=torch.long)
    out = mpo_advantages(v, torch.ones(1, 3, dtype=torch.bool), tt, torch.tensor([[1.0]], dtype=torch.float64),
                         lam_intra=0.5, lam_turn=0.8)
    d = [0.3, -0.2, 0.8]
    a = [d[0] + 0.5 * d[1] + 0.25 * d[2], d[1] + 0.5 * d[2], d[2]]
    assert out["intra"][0].tolist() == pytest.approx(a, abs=1e-12)
    # critic targets: R^turn at the turn start, a + V elsewhere
    assert out["returns"][0, 0].item() == pytest.approx(1.0)  # turn GAE with one terminal turn: r − V + V
    assert out["returns"][0, 2].item() == pytest.approx(a[2] + 0.2)


def test_turn_ratio_value_and_gradient():
    torch.manual_seed(0)
    theta = torch.randn(1, 6, dtype=torch.float64, requires_grad=True)
    old = torch.randn(1, 6, dtype=torch.float64)
    turn = torch.tensor([[0, 0, 0, 1, 1, 1]])
    mask = torch.tensor([[True, True, True, True, True, False]])
    logp = theta * 1.0  # d logp_t / d theta_t = 1: each token's score gradient is e_t
    rho = turn_ratio(logp, old, turn, mask)
    ell = (theta - old).detach()
    r0 = math.exp(ell[0, :3].sum().item())
    r1 = math.exp(ell[0, 3:5].sum().item())
    assert rho[0, :3].tolist() == pytest.approx([r0] * 3)
    assert rho[0, 3:5].tolist() == pytest.approx([r1] * 2)
    for t in range(5):
        (g,) = torch.autograd.grad(rho[0, t], theta, retain_graph=True)
        expected = torch.zeros(6, dtype=torch.float64)
        expected[t] = r0 if t < 3 else r1  # ρ_turn times the token's own score gradient, nothing else
        assert torch.allclose(g[0], expected, atol=1e-12)


def test_turn_ratio_clamp_and_geometric():
    logp = torch.tensor([[30.0, 0.0]])
    rho = turn_ratio(logp, torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool))
    assert rho[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)
    rho = turn_ratio(torch.tensor([[0.2, 0.4]]), torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long),
                     torch.ones(1, 2, dtype=torch.bool), geometric=True)
    assert rho[0].tolist() == pytest.approx([math.exp(0.3)] * 2, rel=1e-6)


def test_between_turn_share():
    v = torch.tensor([[1.0, 1.0, 3.0, 3.0]])
    tt = torch.tensor([[0, 0, 1, 1]])
    assert between_turn_variance_share(v, torch.ones(1, 4, dtype=torch.bool), tt) == pytest.approx(1.0)
    v = torch.tensor([[0.0, 2.0, 0.0, 2.0]])
    assert between_turn_variance_share(v, torch.ones(1, 4, dtype=torch.bool), tt) == pytest.approx(0.0)


def test_config_validates():
    with pytest.raises(ConfigError, match="projection"):
        MPOConfig(projection="nope")
    with pytest.raises(ConfigError, match="lam_turn"):
        MPOConfig(lam_turn=1.5)


def test_turn_ratio_gradient_through_a_model():
    from baselines.core.trainer import forward_policy
    from tests.fixtures.toy_lm import tiny_gpt2

    model = tiny_gpt2(1).double()
    ids = torch.tensor([[11, 3, 4, 5, 2, 6, 7]])
    attn = torch.ones_like(ids)
    gen = torch.tensor([[False, True, True, False, True, True, True]])
    turn = torch.tensor([[-1, 0, 0, -1, 1, 1, 1]])
    with torch.no_grad():
        old = forward_policy(model, ids, attn)[0] - 0.05  # a different "old" policy so ratios are not 1
    logp = forward_policy(model, ids, attn)[0]
    rho = turn_ratio(logp, old, turn, gen)
    params = [p for p in model.parameters()]
    t = 5  # a token of turn 1
    r1 = math.exp(float((logp - old)[0, 4:7].sum().detach()))
    assert rho[0, t].item() == pytest.approx(r1, rel=1e-9)
    g_rho = torch.autograd.grad(rho[0, t], params, retain_graph=True)
    g_lp = torch.autograd.grad(logp[0, t], params, retain_graph=True)
    for a, b in zip(g_rho, g_lp, strict=False):
        assert torch.allclose(a, r1 * b, atol=1e-10)


def test_group_mean_weights_hand_example():
    from baselines.core.losses import group_mean_weights

    mask = torch.tensor([[0, 1, 1, 1, 1.0]])
    groups = torch.tensor([[-1, 0, 1, 1, 1]])
    loss = torch.tensor([[9.0, 4.0, 1.0, 2.0, 3.0]])
    # ½·[mean over group 0 (4) + mean over group 1 (2)] = 3; a single token-mean would give 2.5
    assert float((group_mean_weights(mask, groups) * loss).sum()) == pytest.approx(3.0)
    only_one = torch.tensor([[-1, 0, 0, 0, 0]])  # one group present: its plain mean
    assert float((group_mean_weights(mask, only_one) * loss).sum()) == pytest.approx(2.5)


def test_critic_loss_weighs_turn_starts_and_the_rest_equally():
    """MPO's critic loss is ½·[mean over turn-start tokens + mean over the other generated tokens]."""
    from baselines.core.batch import build_batch
    from baselines.core.losses import value_loss
    from baselines.mpo import critic_groups
    from shopsim.rollout import collect
    from tests.fixtures.toy_lm import ToyLMAgent, env_fns

    agent = ToyLMAgent()
    algo = baselines.make("mpo", env_id="shopsim/Shopping-v0", group_size=2, minibatches=1, update_epochs=1,
                          normalize_advantage=False)
    algo.setup(agent)
    trajs = collect("toy", agent, seeds=[1, 2], group_size=2, env_fns=env_fns(2), progress=False, num_envs=2)
    b = build_batch(trajs)
    groups = critic_groups(b)
    starts = b.turn_starts()
    assert (groups.view(-1)[starts[starts >= 0]] == 0).all()
    assert int((groups == 0).sum()) == int(b.turn_mask.sum()) and (groups >= 0).eq(b.gen_mask).all()
    assert int((groups == 1).sum()) > 0
    ctx = algo.prepare(b)
    advs = algo.compute_advantages(b, ctx)
    vl, _ = value_loss(ctx.values, ctx.values, advs.returns, algo.config.value_clip)  # before the step v = v_old
    want = 0.5 * (vl[groups == 0].mean() + vl[groups == 1].mean())
    assert abs(float(want) - float(vl[b.gen_mask].mean())) > 1e-6  # the hand example tells the two apart
    gen = b.gen_mask.float()
    m = algo._minibatch_step(b, torch.arange(b.num_rows), ctx, advs, advs.adv * gen, gen)
    assert m["loss_value"] == pytest.approx(float(want), rel=1e-5)
