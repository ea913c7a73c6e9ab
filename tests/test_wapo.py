"""WAPO (docs/algorithms/wapo.md) on hand examples: which trajectories and tokens are trained, the one-sided clip
against the behaviour log-probs, the per-group normaliser, the peak/valley token bins, and two iterations on the
real Shopping-v0 env."""

import math
from types import SimpleNamespace

import pytest
import torch

import baselines
from baselines.core.batch import MicroBatch, build_batch
from baselines.core.losses import collision_from_logits
from baselines.core.trainer import forward_policy
from baselines.wapo import TokenBinLogging, WAPOConfig, token_bins, wapo_advantages, wapo_token_loss, wapo_weights
from shopsim.errors import ConfigError
from shopsim.trajectory import Trajectory, Turn

ENV = "shopsim/Shopping-v0"


def _traj(group, rewards, lens, start=10):
    """A window-mode trajectory of group `group`: turn k has reward rewards[k] and lens[k] action ids."""
    turns = []
    for k, (r, n) in enumerate(zip(rewards, lens, strict=True)):
        ids = [start + k * 7 + j for j in range(n)]
        turns.append(Turn(f"o{k}", f"a{k}", reward=r, prompt_ids=[1, 2 + k], action_ids=ids,
                          action_logprobs=[-1.0 - 0.1 * j for j in range(n)]))
    return Trajectory("x", task_id=group, group_id=group, turns=turns)


def _hand_batch():
    """g0: returns 1 (2 turns, 2+2 tokens), 0 (3 tokens), 0.5 (1 token): mean 0.5, A = +0.5, −0.5, 0; G = 3,
    max_seq_len = 4.  g1: six returns of 0.3, a tie (whose float mean is not exactly 0.3): no winner.
    g2: returns 1 (1 token), 0 (2 tokens): A = ±0.5; G = 2, max_seq_len = 2."""
    trajs = [_traj(0, [0.0, 1.0], [2, 2]), _traj(0, [0.0], [3]), _traj(0, [0.5], [1])]
    trajs += [_traj(1, [0.3], [2]) for _ in range(6)]
    trajs += [_traj(2, [1.0], [1]), _traj(2, [0.0], [2])]
    return build_batch(trajs, pad_id=0)


WINNERS = {0, 9}  # trajectory indices with A > 0


def _algo(**over):
    return baselines.make("wapo", env_id=ENV, **over)


def test_advantages_mean_centred_winners_and_exact_ties():
    b = _hand_batch()
    A, win = wapo_advantages(b.returns, b.group_ids)
    assert A.tolist() == pytest.approx([0.5, -0.5, 0.0] + [0.0] * 6 + [0.5, -0.5])  # no std division
    assert A[3:9].eq(0).all()  # the tie is exactly 0, not the rounding error of its mean
    assert set(torch.nonzero(win).squeeze(1).tolist()) == WINNERS
    advs = _algo().compute_advantages(b, None)
    assert advs.metrics["no_winner_groups"] == pytest.approx(1 / 3)
    assert advs.metrics["winner_share"] == pytest.approx(2 / 11)
    # the token mask keeps every generated token of the winners (both turns of trajectory 0) and nothing else
    kept_traj = set(b.row_traj[advs.token_mask.any(1)].tolist())
    assert kept_traj == WINNERS
    assert int(advs.token_mask.sum()) == 4 + 1
    assert bool((advs.token_mask <= b.gen_mask).all())


def test_only_winner_tokens_get_gradient():
    b = _hand_batch()
    algo = _algo()
    advs = algo.compute_advantages(b, None)
    gen = b.gen_mask.float()
    mask = advs.token_mask.float() * gen
    adv = advs.adv * gen
    # the losers still carry their negative advantage (for the bins); only the mask drops them
    assert float(adv.min()) == pytest.approx(-0.5)
    rows = torch.arange(b.num_rows)
    w = algo.policy_weights(b, rows, mask)
    logp = (b.old_logp + 0.1).requires_grad_(True)
    loss_tok, _ = algo.policy_loss_tok(MicroBatch.of_rows(b), logp, adv, mask)
    (loss_tok * w).sum().backward()
    grad = logp.grad
    win_tok = torch.isin(b.row_traj, torch.tensor(sorted(WINNERS)))[:, None] & b.gen_mask
    assert bool((grad[win_tok] < 0).all())  # descending the loss raises the winners' log-probs
    assert bool((grad[~win_tok] == 0).all())  # losers, the A = 0 trajectory and the tie get nothing
    # d/dlogp of −ρ·A·w = −ρ·A·w with ρ = e^0.1, A = 0.5
    assert grad[win_tok].tolist() == pytest.approx((-math.exp(0.1) * 0.5 * w[win_tok]).tolist())


def test_one_sided_clip_and_no_lower_clip():
    behav = torch.tensor([[-2.0, -2.0, -2.0]])
    logp = (behav + torch.log(torch.tensor([[12.0, 0.1, 1.5]]))).requires_grad_(True)
    A = torch.full((1, 3), 0.5)
    loss = wapo_token_loss(logp, behav, A, clip_eps=9.0)
    assert loss.tolist()[0] == pytest.approx([-10 * 0.5, -0.1 * 0.5, -1.5 * 0.5], rel=1e-5)
    loss.sum().backward()
    # above the cap of 10 the gradient vanishes; below 1 nothing is clipped (gradient −ρ·A)
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.1 * 0.5, -1.5 * 0.5], rel=1e-5)
    # without importance sampling: −log π·A
    assert wapo_token_loss(logp, behav, A, importance_sampling=False).tolist()[0] == pytest.approx(
        (-logp.detach() * 0.5).tolist()[0])


def test_ratio_uses_behaviour_logprobs_not_pi_old():
    algo = _algo()
    behav = torch.tensor([[-1.0, -2.0]])
    old = torch.tensor([[-3.0, -0.5]])  # a recomputed π_old that differs: must not be used
    logp = torch.tensor([[-1.5, -1.0]])
    A = torch.full((1, 2), 0.4)
    mb = MicroBatch(batch=None, rows=torch.arange(1), step_rows=torch.arange(1), step_mask=torch.ones(1, 2),
                    adv=A, old_logp=old, behav_logp=behav, w_tok=torch.full((1, 2), 0.5))
    loss, st = algo.policy_loss_tok(mb, logp, A, torch.ones(1, 2))
    expect = [-math.exp(-0.5) * 0.4, -math.exp(1.0) * 0.4]
    assert loss.tolist()[0] == pytest.approx(expect, rel=1e-5)
    assert float(st["ratio"]) == pytest.approx((math.exp(-0.5) + math.exp(1.0)) / 2, rel=1e-5)


def test_normaliser_hand_example():
    b = _hand_batch()
    rows = torch.arange(b.num_rows)
    win_rows = {t: (b.row_traj == t) for t in WINNERS}

    def weights(**over):
        algo = _algo(**over)
        mask = algo.compute_advantages(b, None).token_mask.float()
        return algo.policy_weights(b, rows, mask)

    # 2 groups have a winner; g0: G = 3, max_seq_len = 4 (the 2-turn winner's 2 + 2 tokens); g2: G = 2, L = 2
    w = weights()
    assert torch.unique(w[win_rows[0]][b.gen_mask[win_rows[0]]]).tolist() == pytest.approx([1 / (2 * 3 * 4)])
    assert torch.unique(w[win_rows[9]][b.gen_mask[win_rows[9]]]).tolist() == pytest.approx([1 / (2 * 2 * 2)])
    assert float(w.sum()) == pytest.approx(4 / 24 + 1 / 8)
    # normalize_by_kept_tokens: 1/(#groups · #winner tokens of the group) -> each group's tokens sum to 1/2
    wk = weights(normalize_by_kept_tokens=True)
    assert float(wk[win_rows[0]].sum()) == pytest.approx(0.5) and float(wk[win_rows[9]].sum()) == pytest.approx(0.5)
    assert float(wk[win_rows[0]].max()) == pytest.approx(1 / (2 * 4))
    # a constant max_seq_len (the paper's padded length)
    wc = weights(max_seq_len=10)
    assert float(wc[win_rows[0]].max()) == pytest.approx(1 / (2 * 3 * 10))
    assert float(wc[win_rows[9]].max()) == pytest.approx(1 / (2 * 2 * 10))
    # the normaliser counts only groups that have a winner in the step
    only_g0 = torch.zeros(3, 4)
    only_g0[0, :2] = 1
    w0 = wapo_weights(only_g0, torch.tensor([0, 1, 2]), torch.tensor([3.0, 6.0, 2.0]), torch.tensor([4.0, 2.0, 2.0]))
    assert w0[0, :2].tolist() == pytest.approx([1 / 12, 1 / 12]) and float(w0[1:].abs().sum()) == 0.0
    assert float(wapo_weights(torch.zeros(2, 3), torch.tensor([0, 1]), torch.ones(2), torch.ones(2)).sum()) == 0.0


def test_peak_valley_bins_against_collision_probability():
    # rows: p = (0.5, 0.3, 0.2) Σp² = 0.38; (0.4, 0.35, 5 × 0.05) Σp² = 0.295; uniform over 4, Σp² = 0.25
    dists = [[0.5, 0.3, 0.2, 0, 0, 0, 0], [0.4, 0.35] + [0.05] * 5, [0.25] * 4 + [0, 0, 0]]
    logits = torch.log(torch.tensor(dists).clamp_min(1e-12))
    coll = collision_from_logits(logits)
    assert coll.tolist() == pytest.approx([0.38, 0.295, 0.25], abs=1e-6)
    # tokens (row, sampled id, A): 0.5 peak, 0.3 valley, 0.35 peak (not the argmax), 0.05 valley, 0.25 peak (tie)
    picks = [(0, 0, 1.0), (0, 1, 1.0), (1, 1, -1.0), (1, 2, -1.0), (0, 1, -1.0), (2, 3, 0.0), (0, 0, 1.0)]
    p = torch.tensor([[dists[r][i] for r, i, _ in picks]])
    c = torch.tensor([[float(coll[r]) for r, _, _ in picks]])
    adv = torch.tensor([[a for _, _, a in picks]])
    mask = torch.ones(1, len(picks))
    mask[0, -1] = 0  # not generated: counted nowhere
    got = token_bins(torch.log(p), c, adv, mask)
    assert got == {"pos_peak": 1.0, "pos_valley": 1.0, "neg_peak": 1.0, "neg_valley": 2.0, "zero_adv_tokens": 1.0}


def test_forward_policy_collision_matches_full_softmax():
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    torch.manual_seed(0)
    model = build_model(load_tokenizer(), size="tiny", seed=0).eval()
    ids = torch.randint(5, 200, (2, 9))
    attn = torch.ones_like(ids)
    attn[1, 6:] = 0
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[0, 3:7] = True
    pos[1, 2:5] = True
    with torch.no_grad():
        p = torch.softmax(model(input_ids=ids, attention_mask=attn,
                                position_ids=(attn.cumsum(-1) - 1).clamp_min(0)).logits.float() / 0.7, -1)
        expect = torch.zeros(2, 9)
        expect[:, 1:] = p[:, :-1].square().sum(-1)
        lp, ent, _, coll = forward_policy(model, ids, attn, temperature=0.7, need_collision=True, positions=pos)
        assert coll[pos].tolist() == pytest.approx(expect[pos].tolist(), rel=1e-4)
        assert bool((coll[~pos] == 0).all()) and ent is None
        _, _, _, coll_full = forward_policy(model, ids, attn, temperature=0.7, need_collision=True)
        assert coll_full[attn.bool()].tolist() == pytest.approx(expect[attn.bool()].tolist(), rel=1e-4)
        assert len(forward_policy(model, ids, attn)) == 3  # unchanged for callers that do not ask


def test_update_uses_wapo_weights_and_logs_bins_over_all_tokens():
    """The shared trainer's update routes WAPO's normaliser through `policy_weights` (loss at ρ = 1 equals
    −Σ w·A by hand) and logs the bins over every generated token, losers included."""
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer()
    model = build_model(tok, size="tiny", seed=0)
    algo = _algo(minibatches=1, lr=1e-4)
    algo.setup(SimpleNamespace(model=model, tokenizer=tok))
    b = _hand_batch()
    with torch.no_grad():  # behaviour log-probs = the current policy's, so ρ = 1 at the first step
        lp, _, _ = forward_policy(model, b.input_ids, b.attention_mask, positions=b.gen_mask)
    b.old_logp = lp * b.gen_mask
    m = algo.update(b, generator=torch.Generator().manual_seed(0))
    assert m["loss_policy"] == pytest.approx(-(4 * 0.5 / 24 + 1 * 0.5 / 8), rel=1e-4)
    n = float(b.gen_mask.sum())  # 4+3+1 + 6·2 + 1+2 = 23 tokens
    assert m["pos_peak"] + m["pos_valley"] == pytest.approx(5 / n)  # the winners' tokens
    assert m["neg_peak"] + m["neg_valley"] == pytest.approx((3 + 2) / n)  # the losers' tokens, not trained
    assert m["zero_adv_tokens"] == pytest.approx((1 + 12) / n)
    assert m["entropy_gen"] > 0 and m["no_winner_groups"] == pytest.approx(1 / 3)
    # peak/valley by hand from the full distribution at each generated token
    with torch.no_grad():
        pos = (b.attention_mask.cumsum(-1) - 1).clamp_min(0)
        probs = torch.softmax(model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                                    position_ids=pos).logits.float(), -1)[:, :-1]
        p_tok = probs.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
        peak = torch.zeros_like(b.gen_mask)
        peak[:, 1:] = p_tok >= probs.square().sum(-1)
    loser = torch.isin(b.row_traj, torch.tensor([1, 10]))[:, None] & b.gen_mask
    assert m["neg_peak"] == pytest.approx(float((peak & loser).sum()) / n)


def test_bin_logging_leaves_the_grpo_update_unchanged():
    """`TokenBinLogging` on GRPO (the check's grpo+bins arm): same loss and gradient, bins over every token."""
    import copy

    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer
    from baselines.grpo import GRPO

    class GRPOBins(TokenBinLogging, GRPO):
        pass

    tok = load_tokenizer()
    model = build_model(tok, size="tiny", seed=0)
    b = _hand_batch()
    with torch.no_grad():
        lp, _, _ = forward_policy(model, b.input_ids, b.attention_mask, positions=b.gen_mask)
    b.old_logp = lp * b.gen_mask
    out = []
    for cls in (GRPO, GRPOBins):
        algo = cls(minibatches=1, lr=1e-4)
        algo.setup(SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok))
        out.append(algo.update(b, generator=torch.Generator().manual_seed(0)))
    plain, logged = out
    # GRPO's advantages sum to zero in every group, so at ρ = 1 both losses are float noise around 0
    assert logged["loss_policy"] == pytest.approx(plain["loss_policy"], rel=1e-5, abs=1e-7)
    assert logged["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
    assert "pos_peak" not in plain
    n = float(b.gen_mask.sum())
    assert logged["neg_peak"] + logged["neg_valley"] == pytest.approx(5 / n)
    # GRPO's own signs, read from its advantages
    adv = GRPO().compute_advantages(b, None).adv * b.gen_mask
    assert logged["pos_peak"] + logged["pos_valley"] == pytest.approx(float((adv > 0).sum()) / n)
    assert logged["zero_adv_tokens"] == pytest.approx(float(((adv == 0) & b.gen_mask).sum()) / n)


def test_config_validation():
    with pytest.raises(ConfigError, match="group_size"):
        WAPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="kl_coef"):
        WAPOConfig(kl_coef=0.1)
    with pytest.raises(ConfigError, match="clip_eps"):
        WAPOConfig(clip_eps=-1.0)
    c = WAPOConfig()
    assert (c.group_size, c.lr, c.clip_eps, c.max_grad_norm, c.use_importance_sampling,
            c.normalize_by_kept_tokens, c.kl_coef, c.entropy_coef) == (8, 1e-5, 9.0, 1.0, True, False, 0.0, 0.0)


def test_two_iterations_on_shopping(tmp_path):
    """The CI pattern: two iterations from a tiny random LM (whose rollouts all fail: no winners, zero loss)."""
    import agents
    from tests.test_lm_algorithms_shopping import SMALL, _agent

    algo = baselines.make("wapo", env_id=ENV, **{**SMALL, "tasks_per_iter": 2, "minibatches": 2})
    res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path, agent=_agent("window"), progress=False)
    assert len(res.history) == 2
    for row in res.history:
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
        shares = [row[k] for k in ("pos_peak", "pos_valley", "neg_peak", "neg_valley", "zero_adv_tokens")]
        assert all(0.0 <= s <= 1.0 for s in shares) and sum(shares) == pytest.approx(1.0)
        assert 0.0 <= row["no_winner_groups"] <= 1.0 and row["entropy_gen"] > 0
    assert "dev_success" in res.history[-1]
    assert agents.load_checkpoint(tmp_path / "checkpoint").model is not None


def test_two_iterations_from_the_shipped_checkpoint(tmp_path):
    """From the shipped SFT checkpoint some rollouts succeed: winners exist, and the trained tokens are exactly the
    positive-advantage ones (one optimizer step per iteration, so the step's bins cover the whole batch)."""
    from agents.lm.agent import default_checkpoint_dir
    from agents.registry import manifest_env_kwargs

    init = default_checkpoint_dir()
    env_kwargs = {**manifest_env_kwargs(init), "max_turns": 6}
    algo = baselines.make("wapo", env_id=ENV, group_size=4, tasks_per_iter=2, minibatches=1, eval_episodes=0,
                          lr=1e-4, env_kwargs=env_kwargs, task_families=("find_and_buy",), checkpoint_every=0)
    res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path, init=init, progress=False)
    rows = res.history
    assert any(r["no_winner_groups"] < 1 for r in rows)
    for r in rows:
        shares = [r[k] for k in ("pos_peak", "pos_valley", "neg_peak", "neg_valley", "zero_adv_tokens")]
        assert sum(shares) == pytest.approx(1.0)
        assert r["kept_token_share"] == pytest.approx(r["pos_peak"] + r["pos_valley"], abs=1e-6)
        if r["no_winner_groups"] < 1:  # −min(ρ, 10)·A < 0 on every trained token
            assert r["loss_policy"] < 0 and r["neg_peak"] + r["neg_valley"] > 0
        assert math.isfinite(r["grad_norm"]) and r["entropy_gen"] > 0
