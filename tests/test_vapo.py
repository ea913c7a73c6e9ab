"""VAPO pieces (arXiv 2504.05118, docs/algorithms/vapo.md): length-adaptive λ, decoupled GAE, the positive NLL
term, value pre-training."""

from dataclasses import replace

import pytest
import torch

from baselines.core.batch import MicroBatch
from baselines.core.gae import gae, gae_reference_loop
from baselines.vapo import length_adaptive_lambda


def test_length_adaptive_lambda():
    lam = length_adaptive_lambda(torch.tensor([10, 20, 40, 200]), 0.05)
    assert lam.tolist() == pytest.approx([0.0, 0.0, 0.5, 0.9])


def test_per_row_and_per_step_lambda_match_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(3, 40, generator=g, dtype=torch.float64)
    v = torch.randn(3, 40, generator=g, dtype=torch.float64)
    m = torch.rand(3, 40, generator=g) > 0.2
    lam_row = torch.tensor([0.0, 0.5, 0.9], dtype=torch.float64)
    a, _ = gae(r, v, m, gamma=0.99, lam=lam_row)
    for i in range(3):
        a_i, _ = gae_reference_loop(r[i : i + 1], v[i : i + 1], m[i : i + 1], gamma=0.99, lam=float(lam_row[i]))
        assert torch.allclose(a[i], a_i[0], atol=1e-10)
    # per-step λ: a loop with λ_t
    lam_step = torch.rand(3, 40, generator=g, dtype=torch.float64)
    a, _ = gae(r, v, m, gamma=0.99, lam=lam_step)
    ref = torch.zeros_like(r)
    for i in range(3):
        nv, run = 0.0, 0.0
        for t in reversed(range(40)):
            if not m[i, t]:
                continue
            run = r[i, t] + 0.99 * nv - v[i, t] + 0.99 * lam_step[i, t] * run
            nv = v[i, t]
            ref[i, t] = run
    assert torch.allclose(a, ref, atol=1e-10)


def _hand_batch(values_at=(0.2, 0.4, 0.6)):
    from baselines.core.batch import build_batch
    from shopsim.trajectory import Trajectory, Turn

    def traj(success: bool):
        t0 = Turn("o0", "a0", reward=0.0, prompt_ids=[1, 2], action_ids=[5, 6], action_logprobs=[-0.1, -0.2])
        t1 = Turn("o1", "a1", reward=float(success), terminated=True, info={"success": success},
                  prompt_ids=[1, 2, 5, 6, 3], action_ids=[7], action_logprobs=[-0.3])
        return Trajectory("x", task_id=0, turns=[t0, t1])

    b = build_batch([traj(True), traj(False)])
    values = torch.zeros(b.input_ids.shape)
    values[:, 2], values[:, 3], values[:, 5] = values_at
    return b, values


def test_vapo_advantages_hand_example():
    """Policy advantages use λ = 1 − 1/(α·l) over the trajectory's 3 generated tokens; critic targets use λ = 1."""
    from baselines.core.config import Ctx
    from baselines.vapo import VAPO

    b, values = _hand_batch()
    ctx = Ctx(old_logp=b.old_logp, behav_logp=b.old_logp, values=values, ref_logp=None)
    out = VAPO(alpha=2 / 3).compute_advantages(b, ctx)  # λ_policy = 1 − 1/2 = 0.5
    # success row: δ = (0.2, 0.2, 0.4) at tokens 2, 3, 5 -> A_5 = 0.4, A_3 = 0.2 + 0.5·0.4, A_2 = 0.2 + 0.5·0.4
    assert out.adv[0, [2, 3, 5]].tolist() == pytest.approx([0.4, 0.4, 0.4])
    assert out.returns[0, [2, 3, 5]].tolist() == pytest.approx([1.0, 1.0, 1.0])  # Monte-Carlo return
    # failed row: δ = (0.2, 0.2, −0.6)
    assert out.adv[1, [2, 3, 5]].tolist() == pytest.approx([0.2 + 0.5 * (0.2 - 0.3), 0.2 - 0.3, -0.6])
    assert out.returns[1, [2, 3, 5]].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)
    assert out.metrics["lambda_policy"] == pytest.approx(0.5)
    short = VAPO(alpha=0.05).compute_advantages(b, ctx)  # l = 3 -> λ clamps to 0: one-step TD errors
    assert short.adv[0, [2, 3, 5]].tolist() == pytest.approx([0.2, 0.2, 0.4])


def test_vapo_positive_nll_term_hand_example():
    """μ · token-mean NLL over the generated tokens of successful trajectories, normalised over the whole step."""
    from baselines.vapo import VAPO

    b, _ = _hand_batch()
    logp = torch.full(b.input_ids.shape, -2.0)
    logp[0, 5] = -5.0
    gen = b.gen_mask
    rows = torch.arange(b.num_rows)
    mb = MicroBatch.of_rows(b, rows)
    loss, m = VAPO(nll_coef=0.1).extra_loss(mb, logp, gen)
    assert m["nll_pos"] == pytest.approx((2 + 2 + 5) / 3)  # the failed trajectory's tokens do not count
    assert float(loss) == pytest.approx(0.1 * 3.0)
    # a micro-batch holding only the failed row adds nothing, and the normaliser stays the step's
    loss1, _ = VAPO(nll_coef=0.1).extra_loss(replace(mb, rows=rows[1:]), logp[1:], gen[1:])
    assert float(loss1) == 0.0
    assert VAPO(nll_coef=0.0).extra_loss(mb, logp, gen) == (None, {})


def test_value_pretraining_trains_only_the_critic_and_reports_held_out_ev():
    import numpy as np

    import baselines
    from tests.fixtures.toy_lm import ToyLMAgent, env_fns

    agent = ToyLMAgent()
    algo = baselines.make("vapo", env_id="shopsim/Shopping-v0", group_size=2, tasks_per_iter=2, num_envs=2,
                          critic_lr=1e-2, value_pretrain_steps=20, value_pretrain_batches=1)
    algo.setup(agent)
    algo._env_kwargs, algo._env_fns = None, env_fns(2)
    policy = {k: v.clone() for k, v in agent.model.state_dict().items()}
    critic = {k: v.clone() for k, v in algo.critic.state_dict().items()}
    m = algo.pretrain_critic("toy", agent, np.random.default_rng(0), 20, 1)
    assert all(torch.equal(policy[k], v) for k, v in agent.model.state_dict().items())
    assert any(not torch.equal(critic[k], v) for k, v in algo.critic.state_dict().items())
    assert m["pretrain_value_loss_last"] < m["pretrain_value_loss_first"]
    assert m["pretrain_explained_variance"] > -1
    assert m["pretrain_heldout_ev_after"] == m["pretrain_heldout_ev_after"]  # computed (not NaN)
    assert m["pretrain_heldout_ev_after"] != m["pretrain_heldout_ev_before"]
    assert m["pretrain_rollouts"] == (1 + 1) * 2 * 2  # one training batch and one held out, G x tasks each


def test_value_pretraining_micro_batched_equals_one_batch():
    """Pre-training accumulates length-bucketed micro-batches to the whole batch's token-mean: the same losses,
    explained variances and critic as one forward over the padded batch."""
    import numpy as np

    import baselines
    from tests.fixtures.toy_lm import ToyLMAgent, env_fns

    def pretrain(micro_batch_tokens: int):
        torch.manual_seed(0)
        agent = ToyLMAgent()
        algo = baselines.make("vapo", env_id="shopsim/Shopping-v0", group_size=2, tasks_per_iter=3, num_envs=2,
                              critic_lr=1e-2, micro_batch_tokens=micro_batch_tokens)
        algo.setup(agent)
        algo._env_kwargs, algo._env_fns = None, env_fns(2)
        mbs = []
        split = algo.micro_batches
        algo.micro_batches = lambda b, rows: mbs.append(split(b, rows)) or mbs[-1]
        m = algo.pretrain_critic("toy", agent, np.random.default_rng(0), 4, 1)
        return m, algo.critic.state_dict(), mbs

    one, critic_one, mbs_one = pretrain(0)
    many, critic_many, mbs_many = pretrain(48)
    assert all(len(m) == 1 for m in mbs_one) and max(len(m) for m in mbs_many) > 1  # the case is exercised
    assert many == pytest.approx(one, rel=1e-5, abs=1e-6)
    # float summation order only (Adam divides by √v, so a tiny gradient's rounding shows at ~1e-6)
    assert all(torch.allclose(critic_one[k], critic_many[k], atol=2e-5) for k in critic_one)
