"""ProRL / REINFORCE / GRPO on ProactiveRec-v0: hand-computed advantages, frozen statistics, learning tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import baselines
from baselines.prorl import (
    ProRL,
    RecGRPO,
    RecReinforce,
    RunningStats,
    evaluate,
    evaluate_beam,
    position_advantages,
    position_profile,
)
from shopsim.envs.proactive_rec import PathScorer
from shopsim.errors import ConfigError

ENV_ID = "shopsim/ProactiveRec-v0"
WORLD = dict(catalog_size=100, simulator="analytic")  # no simulator training, 7 codes per level
TINY = dict(WORLD, group_size=8, prompts_per_iter=8, num_train_prompts=16, eval_every=1000, eval_tasks=16,
            valid_only=True, lr=3e-3)


def _tiny_agent(seed: int = 0):
    """A from-scratch 1-layer policy (no SFT: keeps the default test run fast)."""
    from agents.rec_model import build_model
    from agents.rec_policies import RecPolicyAgent

    agent = RecPolicyAgent(valid_only=True, **WORLD)
    agent.model = build_model(agent.vocab, d=32, layers=1, heads=2, seed=seed).eval()
    return agent


def test_position_advantages_hand_example():
    # one group of 3 rollouts; step rewards (γ = 1):
    #   A: items r = [1, 2], EOS at k=2      G = [3, 2, 0]
    #   B: items r = [4],    EOS at k=1      G = [4, 0]
    #   C: no item,          EOS at k=0      G = [0]
    r = np.array([[1.0, 2.0, 0, 0], [4.0, 0, 0, 0], [0, 0, 0, 0]])
    lengths = np.array([2, 1, 0])
    adv, active = position_advantages(r, lengths, np.zeros(3, dtype=int))
    # b_0 = mean(3, 4, 0) = 7/3 over all three; b_1 = mean(2, 0) over A, B; b_2 = mean(0) over A
    expected = np.array([[3 - 7 / 3, 2 - 1.0, 0.0, 0, 0],
                         [4 - 7 / 3, 0 - 1.0, 0, 0, 0],
                         [0 - 7 / 3, 0, 0, 0, 0]])
    np.testing.assert_allclose(adv, expected)
    assert active.tolist()[2] == [True, False, False, False, False]
    # groups are separate; γ < 1 discounts
    adv2, _ = position_advantages(np.array([[1.0, 1.0], [1.0, 1.0]]), np.array([2, 2]), np.array([0, 1]), gamma=0.5)
    np.testing.assert_allclose(adv2, 0.0)  # singleton groups: G − b = 0


def test_running_stats_welford_and_freeze():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 3)) * [1.0, 5.0, 0.2] + [0.0, 3.0, -1.0]
    st = RunningStats(3)
    for chunk in np.array_split(x, 7):
        st.update(chunk)
    np.testing.assert_allclose(st.mean, x.mean(0), atol=1e-12)
    np.testing.assert_allclose(st.std, x.std(0), atol=1e-12)
    st.frozen = True
    st.update(x + 100)
    np.testing.assert_allclose(st.mean, x.mean(0), atol=1e-12)


def test_centred_rewards_use_min_std_and_weights():
    algo = ProRL(min_std=0.1, w_ctr=1.0)
    algo.stats = RunningStats(3)
    algo.stats.mean = np.array([0.5, 10.0, 0.2])
    algo.stats.m2 = np.array([4.0, 0.0, 0.01]) * 4  # std = [2, 0, 0.1] with count 4
    algo.stats.count = np.array([4.0, 4.0, 4.0])
    algo.stats.frozen = True

    class S:  # a one-step path
        ioi = np.array([[2.5]])
        ior = np.array([[10.5]])
        ctr = np.array([[0.3]])
        valid = np.array([[True]])
        duplicate = np.array([[False]])
        step_mask = np.array([[True]])

    r = algo.centred_rewards(S, update=False)
    # (2.5−0.5)/2 + (10.5−10)/max(0, 0.1) + (0.3−0.2)/0.1 / L_max
    assert r[0, 0] == pytest.approx(1.0 + 5.0 + 0.1)


def test_fused_centering_option():
    """centering='fused' ([derived]): one running statistic of the env's raw fused step reward."""
    algo = ProRL(centering="fused", min_std=0.1)
    algo._n_items = 100
    algo.stats = algo._new_stats()

    class S:  # two users, two steps; the second user's 2nd step is past its EOS
        ioi = np.array([[1.0, 0.5], [2.0, 0.0]])
        ior = np.array([[50.0, -10.0], [20.0, 0.0]])
        ctr = np.array([[0.2, 0.4], [0.6, 0.0]])
        valid = np.array([[True, True], [True, False]])
        duplicate = np.array([[False, False], [False, False]])
        step_mask = valid

    fused = np.array([1.0 + 0.5 + 0.2, 0.5 - 0.1 + 0.4, 2.0 + 0.2 + 0.6])  # CTR + IoI + IoR/n_items
    r = algo.centred_rewards(S, update=True)
    mu, sd = fused.mean(), fused.std()
    np.testing.assert_allclose(r[S.step_mask], (fused - mu) / sd)
    assert r[1, 1] == 0.0 and algo.stats.mean.shape == (1,)
    # differs from the per-component reading on the same batch
    comp = ProRL(min_std=0.1)
    comp._n_items, comp.stats = 100, RunningStats(3)
    assert not np.allclose(comp.centred_rewards(S, update=True), r)
    with pytest.raises(ConfigError):
        ProRL(centering="nope")


def test_position_profile_means_per_position_over_real_items():
    algo = ProRL(min_std=0.1)
    algo.stats = RunningStats(3)
    algo.stats.mean, algo.stats.m2, algo.stats.count = np.zeros(3), np.full(3, 4.0), np.full(3, 4.0)  # std 1
    algo.stats.frozen = True

    class S:  # user 0: two real items; user 1: a duplicate at k=1, then past EOS
        ioi = np.array([[1.0, 3.0, 0.0], [2.0, 9.0, 0.0]])
        ior = np.zeros((2, 3))
        ctr = np.zeros((2, 3))
        valid = np.array([[True, True, False], [True, True, False]])
        duplicate = np.array([[False, False, False], [False, True, False]])
        step_mask = valid

    prof = position_profile(algo, S)
    assert [p["position"] for p in prof] == [1, 2] and [p["n"] for p in prof] == [2, 1]
    assert prof[0]["IoI"] == pytest.approx(1.5) and prof[1]["IoI"] == pytest.approx(3.0)  # duplicate left out
    assert prof[0]["r_centred"] == pytest.approx(1.5) and prof[1]["r_centred"] == pytest.approx(3.0)


def test_item_logprob_option_sum_vs_mean():
    """item_logprob='sum' (ablation) weights an item by its full log-prob; ProRL's 'mean' by a quarter of it."""
    tok = torch.zeros(1, 41)  # [B, 10 items x 4 codes + EOS]: one item, then EOS
    tok[0, :5] = torch.log(torch.tensor([0.5, 0.5, 0.25, 0.25, 0.9]))
    lengths = torch.tensor([1])
    adv, eos = torch.ones(1, 10), torch.zeros(1)
    mean_loss, _ = ProRL(beta=0.0).objective(tok, None, lengths, adv, eos)
    sum_loss, _ = ProRL(beta=0.0, item_logprob="sum").objective(tok, None, lengths, adv, eos)
    assert sum_loss.item() == pytest.approx(4 * mean_loss.item())
    assert sum_loss.item() == pytest.approx(-float(tok[0, :4].sum()))
    with pytest.raises(ConfigError):
        ProRL(item_logprob="max")


def test_beam_search_sorted_consistent_and_no_worse_than_greedy():
    from agents.rec_model import EOS, beam_search, generate, token_logprobs

    agent = _tiny_agent(seed=1)
    world = agent.world
    hist, tgt = world.tasks(np.arange(500_000, 500_004))
    prompts = agent.vocab.prompts(world.sids.codes[tgt], world.sids.codes[hist])
    gen, score = beam_search(agent.model, agent.vocab, prompts, beams=4, length_penalty=0.0)
    assert gen.shape == (4, 4, 41) and torch.isfinite(score).all()
    assert (score[:, :-1] >= score[:, 1:]).all()  # best first
    with torch.no_grad():  # the score is the summed constrained log-prob of the returned sequence
        lp = token_logprobs(agent.model, agent.vocab, prompts.repeat_interleave(4, 0), gen.reshape(16, 41))
    np.testing.assert_allclose(lp.sum(1).view(4, 4).numpy(), score.numpy(), atol=1e-4)
    assert ((gen.reshape(16, 41)[:, 0::4] == EOS).sum(1) == 1).all()  # exactly one EOS, at an item boundary
    _, glp = generate(agent.model, agent.vocab, prompts, greedy=True)
    assert (score[:, 0] >= glp.sum(1) - 1e-4).all()  # the greedy path is one of the hypotheses beam search keeps
    m = evaluate_beam(agent, PathScorer(world), np.arange(500_000, 500_004), beams=4, ks=(1, 4))
    assert m["IoI@4"] >= m["IoI@1"] and m["CTR@4"] >= m["CTR@1"] and 0 <= m["length@1"] <= 10


def test_config_validation_and_registry():
    with pytest.raises(ConfigError):
        ProRL(group_size=1)
    with pytest.raises(ConfigError):
        ProRL(credit="nope")
    with pytest.raises(ConfigError):
        RecReinforce(baseline="ema")
    with pytest.raises(ConfigError):
        baselines.make("prorl", env_id=ENV_ID, bogus=1)
    assert isinstance(baselines.make("prorl", env_id=ENV_ID), ProRL)
    assert isinstance(baselines.make("grpo", env_id=ENV_ID), RecGRPO)
    assert isinstance(baselines.make("reinforce", env_id=ENV_ID), RecReinforce)
    assert ProRL().config.beta == 0.01 and ProRL().config.group_size == 16 and ProRL().config.min_std == 0.1


def test_stats_frozen_after_first_epoch(tmp_path):
    algo = ProRL(**TINY)  # 16 train prompts / 8 per iteration = 2 iterations per epoch
    res = algo.train(ENV_ID, iterations=5, seed=0, out_dir=tmp_path, progress=False, agent=_tiny_agent())
    h = res.history
    assert [r["stats_frozen"] for r in h] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert h[0]["mu_IoI"] != h[1]["mu_IoI"]  # updated during epoch 1
    assert h[1]["mu_IoI"] == h[2]["mu_IoI"] == h[4]["mu_IoI"]  # frozen afterwards
    assert h[1]["sigma_CTR"] == h[4]["sigma_CTR"]
    assert (tmp_path / "metrics.csv").is_file() and (res.checkpoint / "shopsim_agent.json").is_file()


def test_training_is_deterministic(tmp_path):
    runs = [cls(**TINY).train(ENV_ID, iterations=2, seed=3, out_dir=tmp_path / f"{cls.name}{i}", progress=False,
                              agent=_tiny_agent())
            for cls in (RecGRPO, RecReinforce) for i in range(2)]
    assert [r["loss"] for r in runs[0].history] == [r["loss"] for r in runs[1].history]
    assert [r["loss"] for r in runs[2].history] == [r["loss"] for r in runs[3].history]


def _per_item(scores):
    m = scores.step_mask
    return {k: float((getattr(scores, k) * m).sum() / max(1, m.sum())) for k in ("ioi", "ior", "ctr")}


def _learning_check(tmp_path, iterations, cfg, agent, eval_ids):
    """Train ProRL; compare per-recommendation IoI / IoR (what centred step rewards optimise) of the trained
    policy's sampled paths with the uniform-random recommender on held-out users."""
    from agents import load_checkpoint
    from agents.rec_policies import policy_paths, random_paths

    before = [p.detach().clone() for p in agent.model.parameters()]
    res = ProRL(**cfg).train(ENV_ID, iterations=iterations, seed=0, out_dir=tmp_path, progress=False, agent=agent)
    changed = sum(not torch.equal(a, b) for a, b in zip(before, res.agent.model.parameters(), strict=False))
    assert changed == len(before)  # every parameter moved: no silent no-op update
    world = res.agent.world
    scorer = PathScorer(world)
    hist, tgt = world.tasks(eval_ids)
    _, _, _, items, _ = policy_paths(res.agent, hist, tgt, greedy=False, generator=torch.Generator().manual_seed(1))
    trained = _per_item(scorer.score(hist, tgt, items))
    rnd = _per_item(scorer.score(hist, tgt, random_paths(world, len(eval_ids), np.random.default_rng(0))))
    reloaded = load_checkpoint(res.checkpoint)
    assert evaluate(reloaded, scorer, eval_ids[:16]) == evaluate(res.agent, scorer, eval_ids[:16])
    return trained, rnd, res


def test_prorl_beats_random_on_held_out_users_fast(tmp_path):
    from shopsim.envs.proactive_rec.env import load_split

    trained, rnd, _ = _learning_check(tmp_path, 15, TINY, _tiny_agent(), np.array(load_split()["dev"][:128]))
    assert trained["ioi"] > 1.3 * rnd["ioi"] and trained["ior"] > rnd["ior"]


@pytest.mark.slow
def test_prorl_beats_random_on_held_out_users_slow(tmp_path):
    from agents.rec_policies import RecPolicyAgent
    from shopsim.envs.proactive_rec.env import load_split

    cfg = dict(TINY, catalog_size=500, num_train_prompts=256, prompts_per_iter=8, group_size=16, lr=1e-3)
    agent = RecPolicyAgent(valid_only=True, catalog_size=500, simulator="analytic")
    trained, rnd, res = _learning_check(tmp_path, 60, cfg, agent, np.array(load_split()["test"][:256]))
    # IoI / IoR only: with w_ctr/L_max the CTR term is nearly ignored and ProRL's CTR ends *below* random here
    # (0.098 vs 0.148 when last run); see benchmarks/repro_prorl.py for the same effect from an SFT start.
    assert trained["ioi"] > 1.3 * rnd["ioi"] and trained["ior"] > rnd["ior"]


def test_position_profile_skips_positions_with_only_duplicates():
    algo = ProRL(min_std=0.1)
    algo.stats = RunningStats(3)
    algo.stats.mean, algo.stats.m2, algo.stats.count = np.zeros(3), np.full(3, 1.0), np.full(3, 1.0)
    algo.stats.frozen = True

    class S:  # one path of 3 items, the middle one a duplicate
        ioi = np.array([[1.0, 5.0, 2.0]])
        ior = np.zeros((1, 3))
        ctr = np.zeros((1, 3))
        valid = np.array([[True, True, True]])
        duplicate = np.array([[False, True, False]])
        step_mask = valid

    assert [(p["position"], p["IoI"]) for p in position_profile(algo, S)] == [(1, 1.0), (3, 2.0)]


@pytest.mark.parametrize("valid_only", [True, False])
def test_no_repeat_decoding_never_duplicates_and_log_probs_agree(valid_only):
    from agents.rec_model import beam_search, build_model, token_logprobs
    from agents.rec_policies import RecPolicyAgent, policy_paths

    world = _tiny_agent().world  # 100 items: 10 history + up to 10 path items collide often when unconstrained
    hist, tgt = world.tasks(np.arange(500_000, 500_032))
    scorer = PathScorer(world)
    dup = {}
    for no_repeat in (False, True):
        agent = RecPolicyAgent(valid_only=valid_only, no_repeat=no_repeat, **WORLD)
        agent.model = build_model(agent.vocab, d=32, layers=1, heads=2, seed=3).eval()
        prompts, gen, lp, items, lengths = policy_paths(agent, np.repeat(hist, 4, 0), np.repeat(tgt, 4),
                                                        greedy=False,
                                                        generator=torch.Generator().manual_seed(0))
        sc = scorer.score(np.repeat(hist, 4, 0), np.repeat(tgt, 4), items)
        dup[no_repeat] = int((sc.duplicate & sc.step_mask).sum())
        if no_repeat:  # behaviour and teacher-forced log-probs are taken under the same (path-dependent) mask
            with torch.no_grad():
                tf = token_logprobs(agent.model, agent.vocab, prompts, gen)
            np.testing.assert_allclose(tf.numpy(), lp.numpy(), atol=1e-4)
            assert torch.isfinite(tf).all()
            bg, bs = beam_search(agent.model, agent.vocab, prompts[:4], beams=3)
            codes, blen = agent.vocab.decode(bg.reshape(12, -1).numpy())
            bitems = world.sids.lookup(codes)
            bitems = np.where(np.arange(10)[None] < blen[:, None], np.where(bitems < 0, -2, bitems), -1)
            bsc = scorer.score(np.repeat(hist[:1], 12, 0), np.repeat(tgt[:1], 12), bitems)  # 4 copies of task 0
            assert not (bsc.duplicate & bsc.step_mask).any()
    assert dup[False] > 0, "the unconstrained sampler should produce duplicates on a 100-item catalog"
    assert dup[True] == 0


def test_no_repeat_needs_the_prompts_and_is_saved(tmp_path):
    from agents.rec_policies import RecPolicyAgent

    agent = RecPolicyAgent(valid_only=True, no_repeat=True, **WORLD)
    with pytest.raises(ValueError, match="prompts"):
        agent.vocab.step_mask(0, torch.zeros(2, 41, dtype=torch.long))
    agent.save(tmp_path / "ck")
    back = RecPolicyAgent.from_checkpoint(tmp_path / "ck")
    assert back.no_repeat and back.vocab.no_repeat and back.valid_only


class _FrontLoaded:
    """Three users' sampled paths from a reference policy whose step rewards fall along the path: the first item
    earns IoI 2, every later item 0.5 (IoR and CTR flat); users 0 and 1 stop after 3 items, user 2 after 2."""

    ioi = np.array([[2.0, 0.5, 0.5, 0.0], [2.0, 0.5, 0.5, 0.0], [2.0, 0.5, 0.0, 0.0]])
    ior = np.zeros((3, 4))
    ctr = np.zeros((3, 4))
    step_mask = np.array([[True, True, True, False], [True, True, True, False], [True, True, False, False]])
    valid = step_mask
    duplicate = np.zeros((3, 4), dtype=bool)


def test_component_centering_charges_later_items_the_mean_item_and_position_centering_does_not():
    """Front-loaded step rewards (as the SFT start's on ProactiveRec-v0): ProRL's per-item mean μ_IoI = 8.5/8 sits
    above every item after the first, so each one is charged (0.5 − μ)/σ < 0 and the user that stops early gets a
    positive advantage for stopping, from the reference policy's own paths; per-position statistics centre each
    position on its own mean, so no item is charged for being late and stopping earns no credit."""
    s = _FrontLoaded
    lengths, gids = np.array([3, 3, 2]), np.zeros(3, dtype=int)
    comp = ProRL(min_std=0.1)
    comp.stats = comp._new_stats()
    r = comp.centred_rewards(s, update=True)
    assert comp.stats.mean[0] == pytest.approx(8.5 / 8)
    assert (r[:, 1:][s.step_mask[:, 1:]] < 0).all()  # every later item is charged
    pos = ProRL(min_std=0.1, centering="position")
    pos.stats = pos._new_stats()
    rp = pos.centred_rewards(s, update=True)
    np.testing.assert_allclose(rp, 0.0, atol=1e-12)  # each position's items are at that position's mean
    adv_c, _ = position_advantages(r, lengths, gids)
    adv_p, _ = position_advantages(rp, lengths, gids)
    assert adv_c[2, 2] > 0.1  # component: user 2's EOS at k = 2 is credited over the others' third item
    assert adv_p[2, 2] == pytest.approx(0.0, abs=1e-12)


def test_position_stats_per_position_with_pooled_fallback_and_freeze():
    st = ProRL(centering="position")._new_stats()
    vals = np.array([[1.0, 10.0, 0.1], [3.0, 30.0, 0.3], [5.0, 50.0, 0.5]])
    st.update(vals, np.array([0, 0, 1]))
    mean, std = st.per_position()
    np.testing.assert_allclose(st.mean[0], vals.mean(0))  # pooled row
    np.testing.assert_allclose(mean[0], vals[:2].mean(0))  # position 1: its own two items
    np.testing.assert_allclose(std[0], vals[:2].std(0))
    np.testing.assert_allclose(mean[1], vals.mean(0))  # position 2: one item (< min_count 2) -> pooled
    np.testing.assert_allclose(mean[5], vals.mean(0))  # never seen -> pooled
    st.frozen = True
    st.update(vals + 100, np.array([0, 0, 1]))
    np.testing.assert_allclose(st.per_position()[0][0], vals[:2].mean(0))


def test_centering_none_is_the_raw_fused_reward():
    algo = ProRL(centering="none")
    algo._n_items = 100
    algo.stats = algo._new_stats()
    s = _FrontLoaded
    np.testing.assert_allclose(algo.centred_rewards(s, update=True), np.where(s.step_mask, s.ioi, 0.0))


def test_grad_var_logs_the_per_prompt_variance_and_steps_with_the_same_gradient(tmp_path):
    """grad_var=True: same parameters after a step as the single backward pass (up to float rounding), plus the
    per-iteration variance columns."""
    runs = {}
    for gv in (False, True):
        algo = ProRL(**{**TINY, "prompts_per_iter": 4, "grad_var": gv})
        runs[gv] = algo.train(ENV_ID, iterations=2, seed=0, out_dir=tmp_path / str(gv), progress=False,
                              agent=_tiny_agent())
    for a, b in zip(runs[False].agent.model.parameters(), runs[True].agent.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    h = runs[True].history
    assert all(r["grad_var"] > 0 and r["grad_var_rel"] > 0 for r in h)
    assert "grad_var" not in runs[False].history[0]
    assert [r["loss"] for r in h] == pytest.approx([r["loss"] for r in runs[False].history], rel=1e-5)
