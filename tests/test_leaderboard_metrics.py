"""pass^k / pass@k against hand examples, seed summaries, t-intervals and the (s, S) gap."""

import math

import pytest

from shopsim.errors import ConfigError
from shopsim.leaderboard.metrics import (
    add_gap,
    aggregate,
    episode_record,
    pass_at_k,
    pass_hat_k,
    seed_summary,
    stat,
    t_critical,
)
from shopsim.trajectory import Trajectory, Turn


def test_pass_hat_k_one_task_by_hand():
    # 2 successes of 4 tries: pass^1 = 2/4; pass^2 = C(2,2)/C(4,2) = 1/6; pass^3 = pass^4 = 0
    counts = [(2, 4)]
    assert pass_hat_k(counts, 1) == pytest.approx(0.5)
    assert pass_hat_k(counts, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(counts, 3) == 0.0
    assert pass_hat_k(counts, 4) == 0.0


def test_pass_hat_k_averages_over_tasks():
    # task A 4/4, task B 1/4: pass^1 = (1 + .25)/2; pass^2 = (1 + 0)/2; pass^4 = (1 + 0)/2
    counts = [(4, 4), (1, 4)]
    assert pass_hat_k(counts, 1) == pytest.approx(0.625)
    assert pass_hat_k(counts, 2) == pytest.approx(0.5)
    assert pass_hat_k(counts, 4) == pytest.approx(0.5)
    # n = 5, c = 3, k = 2: C(3,2)/C(5,2) = 3/10
    assert pass_hat_k([(3, 5)], 2) == pytest.approx(0.3)


@pytest.mark.parametrize("n,k,p", [(4, 1, 0.3), (4, 3, 0.7), (8, 4, 0.55), (5, 5, 0.9)])
def test_pass_hat_k_is_unbiased_for_p_to_the_k(n, k, p):
    # E_c~Bin(n,p)[C(c,k)/C(n,k)] = p^k exactly: the estimator is unbiased (tau-bench's reason for it)
    expect = sum(math.comb(n, c) * p**c * (1 - p) ** (n - c) * pass_hat_k([(c, n)], k) for c in range(n + 1))
    assert expect == pytest.approx(p**k, rel=1e-12)


def test_pass_at_k_by_hand_and_errors():
    # 1 success of 4, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k([(1, 4)], 2) == pytest.approx(0.5)
    assert pass_at_k([(0, 4)], 4) == 0.0
    with pytest.raises(ConfigError, match="at least 4 tries"):
        pass_hat_k([(1, 3)], 4)
    with pytest.raises(ConfigError, match="successes"):
        pass_hat_k([(5, 4)], 1)
    with pytest.raises(ConfigError, match="at least one task"):
        pass_hat_k([], 1)


def test_t_interval_by_hand():
    s = stat([1.0, 2.0, 3.0])  # mean 2, sd 1, half-width t_{.975,2} / sqrt(3) = 4.303 / 1.732
    assert s["mean"] == 2.0 and s["std"] == pytest.approx(1.0) and s["n"] == 3
    assert s["ci95"] == pytest.approx([2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)])
    assert stat([5.0])["ci95"] is None
    assert t_critical(1) == 12.706 and t_critical(100) == 1.96


def _traj(task, success, rewards, invalid=(), metrics=None, tokens=0):
    turns = []
    for i, r in enumerate(rewards):
        info = {"invalid_action": "bad"} if i in invalid else {}
        turns.append(Turn(observation="o", action="a", reward=r, info=info,
                          action_ids=[1] * tokens if tokens else None))
    turns[-1].terminated = True
    turns[-1].info.update(success=success, score=0.5 if not success else 1.0,
                          episode_metrics=metrics or {"cost": 3.0, "label": "not a number"})
    return Trajectory(env_id="x/Y-v0", task_id=task, turns=turns)


def test_episode_record_and_seed_summary():
    r = episode_record(_traj(7, True, [0.0, 1.0], invalid=(0,), tokens=3))
    assert r["success"] == 1.0 and r["return"] == 1.0 and r["turns"] == 2.0 and r["tokens"] == 6.0
    assert r["invalid_rate"] == 0.5 and r["cost"] == 3.0 and "label" not in r and r["score"] == 1.0
    recs = [episode_record(_traj(t, s, [1.0 * s])) for t, s in
            [(0, True), (0, True), (0, False), (0, True), (1, False), (1, False), (1, False), (1, True)]]
    s = seed_summary(recs, tries=4)
    assert s["success_rate"] == pytest.approx(4 / 8)
    assert s["pass^1"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert s["pass^2"] == pytest.approx((3 / 6 + 0) / 2)
    assert s["pass^4"] == 0.0 and s["episodes"] == 8.0


def test_seed_summary_splits_success_by_family():
    fams = ["find_and_buy", "bundle", "find_and_buy", "bundle", "find_and_buy"]
    oks = [True, False, True, True, False]
    recs = []
    for t, (fam, ok) in enumerate(zip(fams, oks, strict=True)):
        tr = _traj(t, ok, [1.0 * ok])
        tr.meta = {"family": fam}
        recs.append(episode_record(tr))
    assert recs[1]["family"] == "bundle"
    s = seed_summary(recs, tries=1)
    assert s["success/find_and_buy"] == pytest.approx(2 / 3) and s["success/bundle"] == pytest.approx(1 / 2)
    assert s["success_rate"] == pytest.approx(3 / 5) and "family" not in s
    plain = seed_summary([episode_record(_traj(0, True, [1.0]))], tries=1)  # no family recorded: no split
    assert not any(k.startswith("success/") for k in plain)


def test_gap_and_aggregate():
    entry = [{"cost": 110.0}, {"cost": 90.0}]
    ref = [{"cost": 100.0}, {"cost": 100.0}]
    add_gap(entry, ref)
    assert [e["gap_to_s_S_pct"] for e in entry] == pytest.approx([10.0, -10.0])
    agg = aggregate(entry)
    assert agg["gap_to_s_S_pct"]["mean"] == pytest.approx(0.0)
    assert agg["cost"]["per_seed"] == [110.0, 90.0]
    with pytest.raises(ConfigError, match="same eval seeds"):
        add_gap(entry, ref[:1])
