"""BASIS (baselines/basis.py): the reference value V̂_β, weights and active set, the leave-one-out temperature
calibration and baseline on a hand batch, the zero fallback, the loss on a hand example, and two iterations on the
real Shopping-v0 env with a tiny random LM (the offline table is built once and survives a resume)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import baselines
from baselines.basis import (
    BASIS,
    TABLE_FILE,
    BASISConfig,
    active_mask,
    basis_baselines,
    inverse_variance_weights,
    reference_values,
    task_key,
)
from baselines.core.batch import MicroBatch, build_batch
from shopsim.errors import ConfigError
from shopsim.trajectory import Trajectory, Turn

ENV = "shopsim/Shopping-v0"


def _v(rewards, beta):
    """V̂_β by the textbook formula, term by term (the hand computation)."""
    return beta * math.log(sum(math.exp(r / beta) for r in rewards) / len(rewards))


def test_reference_value_hand_example_and_limits():
    r = torch.tensor([[0.0, 1.0], [0.2, 0.4]], dtype=torch.float64)
    betas = torch.tensor([1.0, 1000.0, 0.01], dtype=torch.float64)
    v = reference_values(r, betas)
    # β = 1: log((1 + e)/2)
    assert v[0, 0].item() == pytest.approx(math.log((1 + math.e) / 2), abs=1e-12)
    assert v[1, 0].item() == pytest.approx(_v([0.2, 0.4], 1.0), abs=1e-12)
    # β → large: the mean; β → small: the max (1 + 0.01·log(1/2) exactly, no overflow at exp(100))
    assert v[0, 1].item() == pytest.approx(0.5, abs=1e-3) and v[1, 1].item() == pytest.approx(0.3, abs=1e-4)
    assert v[0, 2].item() == pytest.approx(1 + 0.01 * math.log(0.5), abs=1e-12)
    assert v[1, 2].item() == pytest.approx(0.4 + 0.01 * math.log(0.5), abs=1e-9)
    # masked entries are left out of the mean (a row with 1 reward of 2 is that reward at every β)
    vm = reference_values(r, betas, mask=torch.tensor([[True, False], [False, False]]))
    assert torch.allclose(vm[0], torch.zeros(3, dtype=torch.float64)) and torch.all(vm[1] == 0)


def test_weights_and_active_set():
    v = torch.tensor([0.005, 0.5, 0.9, 0.995], dtype=torch.float64)
    w = inverse_variance_weights(v, 0.01)
    assert w.tolist() == pytest.approx([100.0, 4.0, 1 / 0.09, 100.0])
    assert active_mask(v, 0.02, 0.98).tolist() == [False, True, True, False]
    assert active_mask(v, 0.02, None).tolist() == [False, True, True, True]


# the hand batch: 4 tasks with N_ref = 4 binary reference rewards, grid β ∈ {0.1, 10}
R_REF = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.float64)
MASK = torch.ones_like(R_REF, dtype=torch.bool)
GRID = dict(beta_min=0.1, beta_max=10.0, beta_grid=2)
# V̂ at β = 0.1 and β = 10 (all inside [0.02, 0.98] except task 4, which is 0 at every β)
V01 = [_v(row.tolist(), 0.1) for row in R_REF[:3]]
V10 = [_v(row.tolist(), 10.0) for row in R_REF[:3]]


def test_hand_values_of_the_batch():
    assert V01 == pytest.approx([0.86138, 0.930684, 0.971232], abs=1e-5)
    assert V10 == pytest.approx([0.259533, 0.512497, 0.759220], abs=1e-5)


def test_leave_one_out_calibration_and_baseline_uniform_weights():
    cfg = BASISConfig(**GRID, weighting="uniform")
    r = torch.tensor([0.0, 1.0, 1.0, 1.0])
    res = basis_baselines(r, R_REF, MASK, cfg)
    # i=1 (calibrated on tasks 2, 3): β=0.1 → (1−.9307)²+(1−.9712)² = .0056 < β=10 → .2957: b_1 = V̂_0.1(x1)
    # i=2 (tasks 1, 3): β=0.1 → .862²+.029² = .7428 > β=10 → .2595²+.2408² = .1253: b_2 = V̂_10(x2)
    # i=3 (tasks 1, 2): β=0.1 → .7420+.0048 = .7468 > β=10 → .0674+.2377 = .3051: b_3 = V̂_10(x3)
    # i=4: V̂ = 0 is outside the active set: zero fallback
    assert res.b.tolist() == pytest.approx([V01[0], V10[1], V10[2], 0.0], abs=1e-9)
    assert res.beta[:3].tolist() == pytest.approx([0.1, 10.0, 10.0])
    assert res.active.tolist() == [True, True, True, False]
    A = r.double() - res.b
    assert A.tolist() == pytest.approx([-V01[0], 1 - V10[1], 1 - V10[2], 1.0], abs=1e-9)
    # b_1 does not depend on r_1: flipping r_1 changes the other baselines' calibration, never b_1
    r2 = torch.tensor([1.0, 1.0, 1.0, 1.0])
    res2 = basis_baselines(r2, R_REF, MASK, cfg)
    assert res2.b[0].item() == pytest.approx(res.b[0].item(), abs=1e-12)
    # i=2 with r_1 = 1: β=0.1 → (1−.8614)²+.0008 = .0200 < β=10 → .5483+.0580: b_2 moves to V̂_0.1(x2)
    assert res2.b[1].item() == pytest.approx(V01[1], abs=1e-9)


def test_without_leave_one_out_the_baseline_reads_its_own_reward():
    """The control of the test above: fitting β on the whole batch makes b_1 depend on r_1."""
    cfg = BASISConfig(**GRID, weighting="uniform", leave_one_out=False)
    b0 = basis_baselines(torch.tensor([0.0, 1.0, 1.0, 1.0]), R_REF, MASK, cfg).b[0].item()
    b1 = basis_baselines(torch.tensor([1.0, 1.0, 1.0, 1.0]), R_REF, MASK, cfg).b[0].item()
    # r_1 = 0: β=0.1 → .7420+.0048+.0008 = .7476 > β=10 → .0674+.2377+.0580 = .3631 (b = V̂_10); r_1 = 1: β=0.1
    assert b0 == pytest.approx(V10[0], abs=1e-9) and b1 == pytest.approx(V01[0], abs=1e-9)


def test_inverse_variance_weights_change_the_calibration():
    """With w = 1/max(V̂(1−V̂), 0.01), sample i=3's objective at β=0.1 becomes
    .7420/max(.8614·.1386, .01) + .0048/max(.9307·.0693, .01) = 6.215 + .0745 = 6.29 and at β=10
    .0674/(.2595·.7405) + .2377/(.5125·.4875) = .3507 + .9515 = 1.302: still β=10; for i=1 the weighted objective
    .0048/.0645 + .00083/.02795 = .0745 + .0296 = .104 (β=0.1) vs .2377/.2498 + .0580/.1828 = 1.269: β=0.1."""
    cfg = BASISConfig(**GRID)
    r = torch.tensor([0.0, 1.0, 1.0, 1.0])
    res = basis_baselines(r, R_REF, MASK, cfg)
    assert res.beta[[0, 2]].tolist() == pytest.approx([0.1, 10.0])
    # explicit check of both objectives for every sample against the library's choice
    for i in range(3):
        obj = {}
        for beta in (0.1, 10.0):
            tot = 0.0
            for j in range(3):
                if j != i:
                    v = _v(R_REF[j].tolist(), beta)
                    tot += (float(r[j]) - v) ** 2 / max(v * (1 - v), 0.01)
            obj[beta] = tot
        assert res.beta[i].item() == pytest.approx(min(obj, key=obj.get))


def test_zero_fallback_per_beta_missing_task_and_no_calibration():
    # per-β membership: at β = 0.05 task 3's V̂ = 1 + .05·log(.75 + .25·e^-20) = 0.9856 > v_hi → zero fallback,
    # task 1's V̂ = .05·log(.75 + .25·e^20) = 0.9307 and task 2's 0.9653 stay active
    one_beta = dict(beta_min=0.05, beta_max=0.05, beta_grid=1)
    assert _v(R_REF[2].tolist(), 0.05) == pytest.approx(0.98562, abs=1e-5)
    res = basis_baselines(torch.tensor([0.0, 0.0, 1.0, 0.0]), R_REF, MASK, BASISConfig(**one_beta))
    assert res.b[2].item() == 0.0 and not res.active[2]
    assert res.b[:2].tolist() == pytest.approx([0.930685, 0.965343], abs=1e-6)
    # the calibration sums over the samples active *at that β*: with β ∈ {0.05, 10} and r = (0, 1, 0, 0), task 1's
    # objective is (1 − .9653)² = .0012 at β = .05 (task 3 is inactive there) and (1 − .5125)² + .7592² = .8141 at
    # β = 10, so b_1 = V̂_.05(x1); counting task 3 at β = .05 too (+ .9856²) would move it to β = 10
    two = dict(beta_min=0.05, beta_max=10.0, beta_grid=2, weighting="uniform")
    res2 = basis_baselines(torch.tensor([0.0, 1.0, 0.0, 0.0]), R_REF, MASK, BASISConfig(**two))
    assert res2.beta[0].item() == pytest.approx(0.05) and res2.b[0].item() == pytest.approx(0.930685, abs=1e-6)
    # a β at which no other sample is active is never chosen (its empty sum is no evidence): tasks 1 and 3 alone
    res3 = basis_baselines(torch.tensor([1.0, 1.0]), R_REF[[0, 2]], MASK[[0, 2]], BASISConfig(**two))
    assert res3.beta[0].item() == pytest.approx(10.0) and res3.b[0].item() == pytest.approx(V10[0], abs=1e-9)
    # ...unless the upper edge is off (the fallback then applies near 0 only)
    res_hi = basis_baselines(torch.tensor([0.0, 0.0, 1.0, 0.0]), R_REF, MASK,
                             BASISConfig(**one_beta, fallback_high=False))
    assert res_hi.b[2].item() == pytest.approx(0.98562, abs=1e-5)
    # a task missing from the table: zero baseline (A = r), or the mean of the other rewards with missing="batch_mean"
    mask = MASK.clone()
    mask[1] = False
    r = torch.tensor([0.0, 1.0, 1.0, 0.0])
    assert basis_baselines(r, R_REF, mask, BASISConfig(**GRID)).b[1].item() == 0.0
    loo = basis_baselines(r, R_REF, mask, BASISConfig(**GRID, missing="batch_mean"))
    assert loo.b[1].item() == pytest.approx(1 / 3)
    # a single active task has nothing to calibrate on: V̂ at beta_max, or 0 with no_calibration="zero"
    one = basis_baselines(torch.tensor([1.0]), R_REF[:1], MASK[:1], BASISConfig(**GRID))
    assert one.b[0].item() == pytest.approx(V10[0]) and not one.calibrated[0]
    zero = basis_baselines(torch.tensor([1.0]), R_REF[:1], MASK[:1], BASISConfig(**GRID, no_calibration="zero"))
    assert zero.b[0].item() == 0.0


def test_kernel_alternative_is_a_leave_one_out_weighted_average():
    cfg = BASISConfig(baseline="kernel", kernel_bandwidth=0.25)
    r = torch.tensor([0.0, 1.0, 1.0, 1.0])
    res = basis_baselines(r, R_REF, MASK, cfg)
    m = [0.25, 0.5, 0.75, 0.0]
    k = [[math.exp(-((a - b) ** 2) / (2 * 0.25**2)) for b in m] for a in m]
    want0 = (k[0][1] * 1 + k[0][2] * 1 + k[0][3] * 1) / (k[0][1] + k[0][2] + k[0][3])
    want1 = (k[1][0] * 0 + k[1][2] + k[1][3]) / (k[1][0] + k[1][2] + k[1][3])
    assert res.b[:2].tolist() == pytest.approx([want0, want1])
    assert res.b[3].item() == 0.0  # offline mean 0: outside the active set


def test_config_rejects_inverted_ranges():
    with pytest.raises(ConfigError, match="beta_min"):
        BASISConfig(beta_min=5.0, beta_max=1.0)
    with pytest.raises(ConfigError, match="v_lo"):
        BASISConfig(v_lo=0.9, v_hi=0.1)


def _traj(task, seed, success, n_tok):
    turn = Turn(observation="o", action="a", reward=float(success), terminated=True,
                info={"success": bool(success), "score": float(success)},
                prompt_ids=[1, 2], action_ids=list(range(3, 3 + n_tok)), action_logprobs=[-1.0] * n_tok)
    return Trajectory(env_id=ENV, task_id=task, seed=seed, group_id=task, turns=[turn])


def test_advantages_and_loss_on_a_hand_batch():
    """compute_advantages maps each trajectory to its task's table row by (task id, seed), broadcasts
    A_i = r_i − b_i to its tokens, and the clipped token-mean loss matches a hand computation."""
    algo = BASIS(**GRID, weighting="uniform")
    pool = [[10 + i, 100 + i] for i in range(4)]
    algo.set_table(pool, {task_key(10 + i, 100 + i): {"success": R_REF[i].tolist(), "score": R_REF[i].tolist()}
                          for i in range(4)})
    trajs = [_traj(10 + i, 100 + i, s, n) for i, (s, n) in enumerate([(0, 2), (1, 1), (1, 1), (1, 1)])]
    trajs.append(_traj(99, 1, 1, 1))  # not in the table: zero baseline
    batch = build_batch(trajs)
    from baselines.core.config import Ctx

    adv = algo.compute_advantages(batch, Ctx(old_logp=batch.old_logp, behav_logp=batch.old_logp))
    # five tasks now: i=1's calibration uses tasks 2, 3 (task 4 inactive, task 5 missing) as in the 4-task batch
    per_tok = adv.adv[batch.gen_mask]
    A1 = -V01[0]
    assert per_tok.tolist() == pytest.approx([A1, A1, 1 - V10[1], 1 - V10[2], 1.0, 1.0], abs=1e-6)
    assert adv.metrics["basis_table_hit_share"] == pytest.approx(0.8)
    assert adv.metrics["basis_active_share"] == pytest.approx(0.6)
    # loss: ratios e^{±0.5}; token-mean of −min(ρA, clip(ρ, .8, 1.2)A)
    a = adv.adv[batch.gen_mask]
    old = batch.old_logp[batch.gen_mask]
    logp = old + torch.tensor([0.5, -0.5, 0.5, -0.5, 0.5, 0.0])
    full_logp = torch.zeros_like(batch.old_logp)
    full_logp[batch.gen_mask] = logp
    mb = MicroBatch.of_rows(batch)
    tok, _ = algo.policy_loss_tok(mb, full_logp, adv.adv, batch.gen_mask.float())
    got = (tok * batch.gen_mask).sum() / batch.gen_mask.sum()
    # A < 0: ρ = e^.5 → min(1.6487·A, 1.2·A) = 1.6487·A; ρ = e^-.5 → min(.6065·A, .8·A) = .8·A
    # A > 0: ρ = e^.5 → 1.2·A; ρ = e^-.5 → .6065·A; ρ = 1 → A
    hand = -(1.6487213 * A1 + 0.8 * A1 + 1.2 * (1 - V10[1]) + 0.6065307 * (1 - V10[2]) + 1.2 * 1.0 + 1.0) / 6
    assert got.item() == pytest.approx(hand, abs=1e-5)
    # the REINFORCE option: −A·log π, no ratio
    algo.config.policy_loss = "reinforce"
    tok, _ = algo.policy_loss_tok(mb, full_logp, adv.adv, batch.gen_mask.float())
    assert tok[batch.gen_mask].tolist() == pytest.approx((-a * logp).tolist(), abs=1e-6)


def test_rewards_outside_unit_interval_are_refused():
    algo = BASIS(**GRID, reward="score")
    algo.set_table([[1, 1]], {task_key(1, 1): {"success": [0.0], "score": [0.0]}})
    t = _traj(1, 1, 1, 1)
    t.turns[0].info["score"] = 2.0
    batch = build_batch([t])
    from baselines.core.config import Ctx

    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        algo.compute_advantages(batch, Ctx(old_logp=batch.old_logp, behav_logp=batch.old_logp))


def _agent():
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    return LMAgent(env_id=ENV, model=build_model(tok, size="tiny", seed=0), tokenizer=tok, context_mode="window",
                   max_new_tokens=6)


SMALL = dict(tasks_per_iter=2, task_pool=2, n_ref=2, eval_episodes=2, num_envs=2, max_new_tokens=6, lr=1e-4,
             env_kwargs={"max_turns": 2}, task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=1)


def test_trains_two_iterations_on_shopping_and_resumes_without_recollecting(tmp_path, monkeypatch):
    algo = baselines.make("basis", env_id=ENV, **SMALL)
    res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path, agent=_agent(), progress=False)
    assert len(res.history) == 2
    last = res.history[-1]
    assert torch.isfinite(torch.tensor(last["loss"])) and "dev_success" in last
    assert last["rollouts"] == 2 and last["gen_tokens"] > 0  # one rollout per task
    assert last["basis_table_hit_share"] == 1.0  # every online task is in the offline table
    assert 0.0 <= last["basis_active_share"] <= 1.0 and last["basis_baseline_mse"] >= 0.0
    assert "batch_mean_baseline_mse" in last and "offline_mean_baseline_mse" in last
    table = json.loads((tmp_path / TABLE_FILE).read_text())
    assert len(table["pool"]) == 2 and table["rollouts"] == 4
    assert sorted(table["rewards"]) == sorted(task_key(t, s) for t, s in table["pool"])
    assert all(len(e["success"]) == 2 for e in table["rewards"].values())
    pre = json.loads((tmp_path / "pretrain.json").read_text())
    assert pre["offline_rollouts"] == pre["pretrain_rollouts"] == 4
    import agents

    assert agents.load_checkpoint(tmp_path / "checkpoint").model is not None
    # resuming: the table comes back from the saved state; the offline stage must not run again
    (tmp_path / TABLE_FILE).unlink()
    monkeypatch.setattr(BASIS, "before_training", lambda *a, **k: pytest.fail("the offline table was recollected"))
    again = baselines.make("basis", env_id=ENV, **SMALL)
    res2 = again.train(ENV, iterations=3, seed=0, out_dir=tmp_path, agent=_agent(), progress=False)
    assert res2.resumed_from == 2 and len(res2.history) == 3
    assert again.table["rewards"] == table["rewards"] and res2.history[-1]["basis_table_hit_share"] == 1.0
