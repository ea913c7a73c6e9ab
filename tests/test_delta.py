"""DelTA (baselines/delta.py): the token coefficients on hand examples, the own-side-only ablation, the λ_min rule
for A = 0 tokens, the token vectors taken at the predicting position, Ã = A·λ in the advantages, and two training
iterations on the real Shopping-v0 env with a tiny random LM."""

import copy
import math

import pytest
import torch

import baselines
from baselines.delta import DelTA, DelTAConfig, delta_weights
from shopsim.errors import ConfigError

ENV = "shopsim/Shopping-v0"


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# P: a = (2, 0) with A = 1, b = (0, 0) with A = 3;  N: c = (0, 2), d = (0, 0) with A = −1;  e = (5, 5) with A = 0
V = torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, 2.0], [0.0, 0.0], [5.0, 5.0]])
A = torch.tensor([1.0, 3.0, -1.0, -1.0, 0.0])


def test_weights_hand_example_without_refinement():
    # μ+ = (1·(2,0) + 3·(0,0)) / 4 = (0.5, 0);  μ− = ((0,2) + (0,0)) / 2 = (0, 1)
    # a: d+ = 2.25, d− = 5    → m = 5 − 2.25 = 2.75     (P: m = d− − d+)
    # b: d+ = 0.25, d− = 1    → m = 0.75
    # c: d+ = 4.25, d− = 1    → m = 4.25 − 1 = 3.25     (N: m = d+ − d−)
    # d: d+ = 0.25, d− = 1    → m = −0.75
    # γ+ = std(2.75, 0.75) = 2/√2 = √2 ;  γ− = std(3.25, −0.75) = 4/√2 = 2√2   (sample std)
    raw = [0.8 + 0.4 * _sig(2.75 / math.sqrt(2)), 0.8 + 0.4 * _sig(0.75 / math.sqrt(2)),
           0.8 + 0.4 * _sig(3.25 / (2 * math.sqrt(2))), 0.8 + 0.4 * _sig(-0.75 / (2 * math.sqrt(2))), 0.8]
    lam_raw, st = delta_weights(V, A, refine_passes=0, normalize=False)
    assert lam_raw.tolist() == pytest.approx(raw, abs=1e-6)
    assert st["delta_gamma_pos"] == pytest.approx(math.sqrt(2))
    assert st["delta_gamma_neg"] == pytest.approx(2 * math.sqrt(2))
    lam, st = delta_weights(V, A, refine_passes=0)
    assert lam.tolist() == pytest.approx([x * 5 / sum(raw) for x in raw], abs=1e-6)
    assert float(lam.mean()) == pytest.approx(1.0, abs=1e-6)  # global normalisation to mean 1
    # a token nearer its own centroid than the opposite one gets more than the token on the opposite's side
    assert lam[0] > 1 > lam[3]
    assert st["delta_lambda_pos_max"] == pytest.approx(float(lam[0]))
    assert st["delta_lambda_neg_min"] == pytest.approx(float(lam[3]))
    assert st["delta_lambda_above1"] == pytest.approx(0.75)  # a, b, c above 1; d below


def test_weights_hand_example_with_one_refinement_pass():
    # pass 0 as above; s = σ(m/γ); μ±* = Σ s·|A|·v / Σ s·|A| per side; margins and γ± from μ±*
    s = [_sig(2.75 / math.sqrt(2)), _sig(0.75 / math.sqrt(2)), _sig(3.25 / (2 * math.sqrt(2))),
         _sig(-0.75 / (2 * math.sqrt(2)))]
    wp = [s[0] * 1, s[1] * 3]
    mu_p = (wp[0] * 2 / sum(wp), 0.0)
    wn = [s[2], s[3]]
    mu_n = (0.0, wn[0] * 2 / sum(wn))

    def d(x, mu):
        return (x[0] - mu[0]) ** 2 + (x[1] - mu[1]) ** 2

    pts = [(2, 0), (0, 0), (0, 2), (0, 0)]
    m = [d(pts[0], mu_n) - d(pts[0], mu_p), d(pts[1], mu_n) - d(pts[1], mu_p),
         d(pts[2], mu_p) - d(pts[2], mu_n), d(pts[3], mu_p) - d(pts[3], mu_n)]
    g_p = abs(m[0] - m[1]) / math.sqrt(2)
    g_n = abs(m[2] - m[3]) / math.sqrt(2)
    raw = [0.8 + 0.4 * _sig(m[0] / g_p), 0.8 + 0.4 * _sig(m[1] / g_p), 0.8 + 0.4 * _sig(m[2] / g_n),
           0.8 + 0.4 * _sig(m[3] / g_n), 0.8]
    lam, st = delta_weights(V, A, refine_passes=1)
    assert lam.tolist() == pytest.approx([x * 5 / sum(raw) for x in raw], abs=1e-6)
    assert st["delta_gamma_pos"] == pytest.approx(g_p)
    # the refined centroids move: the result differs from K = 0
    assert not torch.allclose(lam, delta_weights(V, A, refine_passes=0)[0], atol=1e-4)


def test_lambda_w_and_range_enter_the_margin():
    # λ_w = 2 doubles the opposite distance: a's margin becomes 2·5 − 2.25
    lam_raw, _ = delta_weights(V, A, refine_passes=0, normalize=False, lambda_w=2.0, lambda_min=0.5, lambda_max=2.0)
    m = [2 * 5 - 2.25, 2 * 1 - 0.25]
    g = abs(m[0] - m[1]) / math.sqrt(2)
    assert float(lam_raw[0]) == pytest.approx(0.5 + 1.5 * _sig(m[0] / g), abs=1e-6)
    assert float(lam_raw[4]) == pytest.approx(0.5)


def test_zero_advantage_tokens_get_lambda_min():
    torch.manual_seed(0)
    v = torch.randn(12, 4)
    A = torch.tensor([1.0] * 4 + [-0.5] * 4 + [0.0] * 4)
    v[8:] = v[:4]  # A = 0 tokens identical to positive tokens still get λ_min: no side, no margin
    raw, st = delta_weights(v, A, normalize=False)
    assert raw[8:].tolist() == pytest.approx([0.8] * 4)
    assert (raw[:8] > 0.8).all() and (raw[:8] < 1.2).all()
    lam, _ = delta_weights(v, A)
    assert lam[8:].tolist() == pytest.approx((0.8 * 12 / raw.sum()).repeat(4).tolist(), abs=1e-6)
    assert st["delta_tokens_zero"] == 4


def test_own_side_only_reduces_to_the_plain_baseline():
    torch.manual_seed(1)
    v = torch.randn(30, 6)
    A = torch.tensor([1.3] * 10 + [-0.7] * 12 + [0.4] * 8)  # three sequences, no A = 0 token
    lam, st = delta_weights(v, A, contrast="own")
    assert torch.allclose(lam, torch.ones(30))  # Ã = A·λ = A exactly
    assert st["delta_lambda_pos_std"] == 0 and st["delta_lambda_neg_std"] == 0
    # the opposite-side comparison is what makes the weights differ
    lam_opp, _ = delta_weights(v, A, contrast="opposite")
    assert float(lam_opp.std()) > 0.01
    # with A = 0 tokens (λ_min) every A ≠ 0 token still gets one and the same λ: Ã is a constant multiple of A
    A0 = torch.cat([A, torch.zeros(5)])
    lam0, _ = delta_weights(torch.cat([v, torch.randn(5, 6)]), A0, contrast="own")
    assert torch.allclose(lam0[:30], lam0[0].expand(30))
    assert float(lam0[0]) == pytest.approx(35 / (30 + 5 * 0.8), abs=1e-6)


def test_one_sided_batch_falls_back_to_the_plain_update():
    lam, st = delta_weights(torch.randn(4, 3), torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert torch.equal(lam, torch.ones(4)) and st["delta_fallback"] == 1.0


def test_config_defaults_and_validation():
    c = DelTAConfig()
    assert (c.refine_passes, c.lambda_min, c.lambda_max, c.lambda_w, c.gamma_time, c.delta_eps) == \
        (1, 0.8, 1.2, 1.0, 1.0, 1e-8)
    assert (c.group_size, c.lr, c.weight_decay, c.clip_low, c.clip_high, c.dual_clip, c.loss_agg, c.kl_coef,
            c.dynamic_sampling) == (16, 1e-6, 0.1, 0.2, 0.28, 10.0, "token-mean", 0.0, False)
    with pytest.raises(ConfigError, match="lambda_min"):
        DelTAConfig(lambda_min=1.5, lambda_max=1.2)
    with pytest.raises(ConfigError):
        DelTAConfig(contrast="both")


# ----------------------------------------------------------------------------- on real rollouts


def _agent(mode="window"):
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    return LMAgent(env_id=ENV, model=build_model(tok, size="tiny", seed=0), tokenizer=tok, context_mode=mode,
                   max_new_tokens=6)


@pytest.fixture(scope="module")
def rollout_batch():
    from baselines.core.batch import build_batch
    from shopsim.rollout import collect

    agent = _agent("concat")
    trajs = collect(ENV, agent, episodes=2, seeds=[0, 1], split="train", group_size=3, num_envs=2,
                    env_kwargs={"max_turns": 2}, agent_seed=0)
    return agent, build_batch(trajs, pad_id=int(agent.tokenizer.pad_token_id or 0))


def test_token_vectors_are_the_predicting_hidden_states(rollout_batch):
    """h for the token at p is the hidden state at p − 1: the LM head applied to it gives the recorded log-prob."""
    from baselines.core.losses import token_logprobs

    agent, batch = rollout_batch
    algo = DelTA(token_vector="hidden")
    algo.setup(agent)
    ctx = algo.prepare(batch)
    idx, h = algo.token_vectors(batch, ctx)
    assert idx.numel() == batch.num_generated_tokens
    labels = batch.input_ids.reshape(-1)[idx]
    with torch.no_grad():
        lp = token_logprobs(agent.model.get_output_embeddings()(h), labels)
    assert torch.allclose(lp, batch.old_logp.reshape(-1)[idx], atol=1e-4)
    # and it is not the state at p itself
    with torch.no_grad():
        hid = agent.model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                     position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp_min(0)).last_hidden_state
    same_pos = hid.reshape(-1, hid.shape[-1])[idx]
    assert torch.allclose(hid.reshape(-1, hid.shape[-1])[idx - 1], h, atol=1e-4)
    assert not torch.allclose(same_pos, h, atol=1e-3)
    # the default vector scales h by (1 − p)
    algo_g = DelTA()
    algo_g.setup(agent)
    _, v = algo_g.token_vectors(batch, ctx)
    p = batch.old_logp.reshape(-1)[idx].exp()
    assert torch.allclose(v, (1 - p)[:, None] * h, atol=1e-5)


def test_advantages_are_the_dapo_advantages_times_lambda(rollout_batch):
    from baselines.dapo import DAPO

    agent, batch = rollout_batch
    batch = copy.copy(batch)  # the fixture's batch stays as recorded
    # distinct rewards so that both sides exist in each group
    batch.turn_rewards = torch.zeros_like(batch.turn_rewards)
    batch.turn_rewards[:, 0] = torch.tensor([1.0, 0.0, 0.2, 0.0, 1.0, 0.3])  # no A = 0
    batch.returns = batch.turn_rewards.sum(1)
    algo = DelTA(overlong_penalty=False)
    algo.setup(agent)
    ctx = algo.prepare(batch)
    out = algo.compute_advantages(batch, ctx)
    plain = DAPO.compute_advantages(algo, batch, ctx).adv * batch.gen_mask
    lam = algo.last_token_weights
    assert out.metrics["delta_fallback"] == 0.0
    assert torch.allclose(out.adv, plain * lam)
    gen = batch.gen_mask
    assert float(lam[gen].mean()) == pytest.approx(1.0, abs=1e-5)
    assert float(lam[gen].std()) > 1e-4  # the coefficients vary: Ã ≠ A
    assert not torch.allclose(out.adv, plain, atol=1e-5)
    own = DelTA(overlong_penalty=False, contrast="own")
    own.setup(agent)
    assert torch.allclose(own.compute_advantages(batch, ctx).adv, plain, atol=1e-6)


def test_two_training_iterations_on_shopping(tmp_path):
    small = dict(group_size=2, tasks_per_iter=2, eval_episodes=2, num_envs=2, max_new_tokens=6, lr=1e-4,
                 env_kwargs={"max_turns": 2}, task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=0)
    assert isinstance(baselines.make("delta", env_id=ENV, **small), DelTA)

    class AlternatingReward(DelTA):
        """A tiny random LM fails every episode the same way (every group has zero variance, so DelTA would
        fall back to the plain update): add +1 to every second trajectory so both sides exist in each group."""

        def shaped_reward(self, batch):
            R = super().shaped_reward(batch)
            return R + (torch.arange(R.numel()) % 2).float()

    algo = AlternatingReward(**small)
    res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path, agent=_agent(), progress=False)
    assert len(res.history) == 2
    for row in res.history:
        assert math.isfinite(row["loss"])
        assert row["delta_tokens_pos"] + row["delta_tokens_neg"] + row["delta_tokens_zero"] == row["gen_tokens"]
        if row["delta_fallback"] == 0:
            assert 0.8 * 0.5 < row["delta_lambda_pos_min"] <= row["delta_lambda_pos_max"] < 1.2 * 2
            assert 0 <= row["delta_lambda_above1"] <= 1 and row["delta_gamma_pos"] >= 0
    assert all(row["delta_fallback"] == 0 for row in res.history)
    assert all(row["delta_lambda_pos_std"] > 0 for row in res.history)
    assert "dev_success" in res.history[-1]
    import agents

    assert agents.load_checkpoint(tmp_path / "checkpoint").model is not None
