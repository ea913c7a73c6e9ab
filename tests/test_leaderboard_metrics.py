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


def test_wilson_interval_by_hand_and_within_unit_interval():
    from shopsim.leaderboard.metrics import Z_975, wilson_interval

    # 0 of 10: [0, (z²/n) / (1 + z²/n)]; 5 of 10: the textbook [0.2366, 0.7634]
    z2n = Z_975**2 / 10
    assert wilson_interval(0, 10) == pytest.approx([0.0, z2n / (1 + z2n)])
    assert wilson_interval(5, 10) == pytest.approx([0.2366, 0.7634], abs=1e-4)
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(1 - z2n / (1 + z2n))
    for c in range(0, 5):  # never outside [0, 1], unlike mean ± t·sd
        lo, hi = wilson_interval(c, 4)
        assert 0.0 <= lo <= c / 4 <= hi <= 1.0
    with pytest.raises(ConfigError, match="successes"):
        wilson_interval(5, 4)


def test_bootstrap_interval_by_hand_and_deterministic():
    import numpy as np

    from shopsim.leaderboard.metrics import bootstrap_gap_interval, bootstrap_interval

    assert bootstrap_interval([3.0, 3.0, 3.0]) == [3.0, 3.0]  # zero width: every task gave the same value
    assert bootstrap_interval([3.0]) is None
    # two tasks 0 and 1: resampled means are 0, .5, 1 with probabilities 1/4, 1/2, 1/4 -> 2.5%/97.5% quantiles 0, 1
    assert bootstrap_interval([0.0, 1.0]) == [0.0, 1.0]
    x = np.random.default_rng(1).normal(10.0, 2.0, size=400)
    ci = bootstrap_interval(x)
    assert ci == bootstrap_interval(x)  # seeded: same values, same bytes
    half = 1.96 * x.std(ddof=1) / np.sqrt(len(x))  # the normal-theory half-width it should approach
    assert (ci[1] - ci[0]) / 2 == pytest.approx(half, rel=0.15)
    assert ci[0] < x.mean() < ci[1]
    # paired gap: an entry costing exactly 1.1x the reference on every task has gap 10% whatever is resampled
    ref = np.random.default_rng(2).uniform(50, 150, size=50)
    assert bootstrap_gap_interval(1.1 * ref, ref) == pytest.approx([10.0, 10.0])


def test_summarize_intervals_per_metric_kind():
    from shopsim.leaderboard.metrics import summarize, wilson_interval

    # 2 tasks x 2 tries: successes 1,1 on task 0 and 0,1 on task 1; cost 10/20 on task 0, 30/30 on task 1
    recs = [{"task_id": 0, "success": 1.0, "cost": 10.0}, {"task_id": 0, "success": 1.0, "cost": 20.0},
            {"task_id": 1, "success": 0.0, "cost": 30.0}, {"task_id": 1, "success": 1.0, "cost": 30.0}]
    seeds = [{"cost": 20.0, "success_rate": 1.0}, {"cost": 25.0, "success_rate": 0.5}]
    m = summarize(recs, per_seed=seeds, seeds_over="train_seeds")
    assert m["success_rate"]["mean"] == 0.75 and m["success_rate"]["interval"] == "wilson"
    assert m["success_rate"]["ci95"] == pytest.approx(wilson_interval(3, 4))
    assert m["cost"]["mean"] == 22.5 and m["cost"]["interval"] == "bootstrap" and m["cost"]["tasks"] == 2
    assert m["cost"]["ci95"] == [15.0, 30.0]  # task means 15 and 30: see the two-task case above
    assert m["pass^2"]["mean"] == pytest.approx((1.0 + 0.0) / 2)  # C(2,2)/C(2,2) and C(1,2)/C(2,2)
    # run-to-run variation: per-seed values and their sample std (ddof = 1), not the population std
    assert m["cost"]["per_seed"] == [20.0, 25.0] and m["cost"]["std"] == pytest.approx(3.5355339, rel=1e-6)
    assert m["success_rate"]["std"] == pytest.approx(0.3535534, rel=1e-6)
    assert m["cost"]["seeds_over"] == "train_seeds" and m["episodes"]["mean"] == 4.0
    ref = [dict(r, cost=r["cost"] / 1.25) for r in recs]  # the entry costs 25% more on every episode
    g = summarize(recs, reference=ref)["gap_to_s_S_pct"]
    assert g["mean"] == pytest.approx(25.0) and g["ci95"] == pytest.approx([25.0, 25.0])
    assert "std" not in summarize(recs)["cost"]  # no per-seed values given: no seed spread claimed


def test_two_level_bootstrap_carries_run_to_run_variation():
    from shopsim.leaderboard.metrics import bootstrap_runs_tasks, summarize

    assert bootstrap_runs_tasks([[2.0, 2.0], [2.0, 2.0]]) == [2.0, 2.0]
    # run 0 scores 0 and run 1 scores 1 on every task: resampled run means are 0, .5, 1 (1/4, 1/2, 1/4)
    assert bootstrap_runs_tasks([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]) == [0.0, 1.0]
    # pooled records of two runs that disagree: the interval is as wide as the runs' spread, unlike a bootstrap
    # over tasks alone, which would call the pooled mean exact
    recs = [{"task_id": t, "run": run, "cost": 10.0 + 10.0 * run} for run in (0, 1) for t in range(20)]
    m = summarize(recs, per_seed=[{"cost": 10.0}, {"cost": 20.0}], seeds_over="train_seeds")["cost"]
    assert m["mean"] == 15.0 and m["ci95"] == [10.0, 20.0] and m["interval"] == "bootstrap_runs_tasks"
    assert m["std"] == pytest.approx(7.0710678) and "run" not in summarize(recs)
    ref = [{"task_id": t, "cost": 10.0} for t in range(20)]
    g = summarize(recs, per_seed=[{}, {}], reference=ref)["gap_to_s_S_pct"]
    assert g["mean"] == pytest.approx(50.0) and g["ci95"] == pytest.approx([0.0, 100.0])


def test_default_protocol_size_and_hash():
    from dataclasses import replace

    from shopsim.envs import env_record
    from shopsim.leaderboard.protocols import load_protocol

    p = load_protocol("shopsim/Replenishment-v0")
    whole = load_protocol("shopsim/Replenishment-v0", sized=False)
    size = env_record("shopsim/Replenishment-v0").protocol_size
    assert len(p.task_ids) == size.tasks and p.tries == size.tries and p.seeds == size.seeds
    assert p.task_ids == whole.task_ids[:size.tasks]  # the first tasks of the split
    assert p.episodes_per_seed * len(p.seeds) * 40 < whole.episodes_per_seed * len(whole.seeds)
    # the hash names the episodes: equal for equal protocols, different when tasks, tries or env options differ
    assert p.hash == load_protocol("shopsim/Replenishment-v0").hash and len(p.hash) == 16
    assert len({p.hash, whole.hash, p.limited(tries=2).hash, replace(p, env_kwargs={"n_skus": 3}).hash}) == 4
    shop = load_protocol("shopsim/Shopping-v0")
    assert shop.tries == 4 and len(shop.task_ids) == 100  # 25 tasks x 4 tries = 100 episodes per family
