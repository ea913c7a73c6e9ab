"""BiPACE (baselines/bipace.py): hand-computed clustering, ε calibration, the action-counterfactual baseline and the
joint advantage; the hidden-state recording it relies on; two training iterations on the real Shopping-v0 env."""

import math

import pytest
import torch

import baselines
from baselines.bipace import (
    BiPACE,
    action_key,
    bipace_advantages,
    calibrate_epsilon,
    cluster_group,
    counterfactual_advantages,
)
from shopsim.errors import ConfigError

ENV = "shopsim/Shopping-v0"


def _deg(*angles):
    """Unit 2-D vectors at the given angles (degrees), padded with a zero third dimension."""
    r = torch.tensor([math.radians(a) for a in angles], dtype=torch.float64)
    return torch.stack([torch.cos(r), torch.sin(r), torch.zeros_like(r)], 1)


def _d(a):
    return 1 - math.cos(math.radians(a))


# ------------------------------------------------------------------------------------------------ clustering
def test_clustering_recovers_known_groups_of_noisy_states():
    # three latent states, each seen with small perturbations (no two rows are bit-identical, so exact-hash
    # grouping would leave every row alone); order: trajectory then step
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 16, generator=g, dtype=torch.float64) * 4
    truth = [0, 1, 2, 0, 1, 2, 1, 0, 2, 1]
    z = torch.stack([centres[t] + 0.01 * torch.randn(16, generator=g, dtype=torch.float64) for t in truth])
    z = z * torch.linspace(0.5, 3, len(truth), dtype=torch.float64)[:, None]  # scale must not matter (cosine)
    labels = cluster_group(z, eps=0.01)
    assert labels == truth
    exact = {tuple(r.tolist()) for r in z}
    assert len(exact) == len(truth)  # exact hashing: 10 singletons, where the clustering finds 3 groups


def test_clustering_first_member_vs_centroid_by_hand():
    # 0°, 8°, 13° with ε = 1 − cos 10°: the 13° row is 13° from the first member (new cluster) but 9° from the
    # centroid of {0°, 8°} (at 4°), so only the centroid reference takes it in
    z = _deg(0, 8, 13, 40)
    eps = _d(10)
    assert cluster_group(z, eps, "first") == [0, 0, 1, 2]
    assert cluster_group(z, eps, "centroid") == [0, 0, 0, 1]
    # greedy: a row joins the FIRST cluster within ε, not the nearest (−6° is 6° from 0° and 4° from −10°)
    z2 = _deg(0, -10, -6)
    assert cluster_group(z2, _d(8), "first") == [0, 1, 0]


def test_calibrate_epsilon_percentile_by_hand():
    # group 0: 0°, 60°, 90° -> distances 1−cos60 = 0.5, 1−cos90 = 1, 1−cos30 = 0.1340; group 1: 0°, 180° -> 2;
    # group 2 has one row (no pair). Sorted [0.1340, 0.5, 1, 2]; 10th percentile (linear): 0.1340 + 0.3·(0.5 − 0.1340)
    z = _deg(0, 60, 90, 0, 180, 45)
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    d30 = _d(30)
    assert calibrate_epsilon(z, groups, 10) == pytest.approx(d30 + 0.3 * (0.5 - d30))
    assert calibrate_epsilon(z, groups, 50) == pytest.approx(0.75)
    # (rows 0 and 3 are both at 0°: counting that cross-group pair, distance 0, would change both percentiles)
    assert calibrate_epsilon(_deg(0), torch.tensor([0]), 10) is None
    # duplicates: 'all' counts them (ε drops to 0), 'distinct' skips them
    zd = _deg(0, 0, 0, 50)
    gd = torch.zeros(4, dtype=torch.long)
    assert calibrate_epsilon(zd, gd, 10) == pytest.approx(0.0, abs=1e-12)
    assert calibrate_epsilon(zd, gd, 10, distinct=True) == pytest.approx(_d(50))


# ------------------------------------------------------------------------------------------------ PACE
def test_counterfactual_baseline_all_three_branches():
    # cluster 0: actions a, a, b, c with returns 1, 0, 2, 4 -> V = 1.75, Q(a) = 0.5
    #   a rows (2 same-action peers): PACE   A = Q(a) − V = −1.25
    #   b (1 peer): RLOO 2 − (1 + 0 + 4)/3 = 1/3;  c: RLOO 4 − (1 + 0 + 2)/3 = 3
    # cluster 1: one row -> 0
    R = torch.tensor([1.0, 0.0, 2.0, 4.0, 5.0])
    clus = torch.tensor([0, 0, 0, 0, 1])
    keys = ["a", "a", "b", "c", "a"]
    A, cnt = counterfactual_advantages(R, clus, keys)
    assert A.tolist() == pytest.approx([-1.25, -1.25, 1 / 3, 3.0, 0.0])
    assert cnt["branch"].tolist() == [1, 1, 2, 2, 0]
    assert cnt["peers"].tolist() == [2, 2, 1, 1, 1]
    # state-only ablation: R − V (singleton still 0)
    A_s, _ = counterfactual_advantages(R, clus, keys, baseline="state")
    assert A_s.tolist() == pytest.approx([-0.75, -1.75, 0.25, 2.25, 0.0])
    # min_peers = 3: the a rows fall back to RLOO too: 1 − (0+2+4)/3 = −1, 0 − (1+2+4)/3 = −7/3
    A3, cnt3 = counterfactual_advantages(R, clus, keys, min_peers=3)
    assert A3.tolist()[:2] == pytest.approx([-1.0, -7 / 3])
    assert cnt3["branch"].tolist()[:2] == [2, 2]


def test_action_key_uses_the_env_parser():
    k1, ok1 = action_key("search[Waterproof  Boots]")
    k2, ok2 = action_key("SEARCH[ waterproof boots ]")
    k3, _ = action_key('{"name": "search", "arguments": {"query": "waterproof boots"}}')
    assert ok1 and ok2 and k1 == k2 == k3
    assert action_key("search[red boots]")[0] != k1
    assert action_key("search[red boots]", "tool")[0] == action_key("search[blue hat]", "tool")[0]
    assert action_key("Search[red  boots]", "text") == (("text", "search[red boots]"), True)
    bad, ok = action_key("dance wildly")
    assert not ok and bad == action_key("Dance  wildly")[0]


def test_joint_advantage_by_hand():
    # one prompt group (2 trajectories × 2 turns) + a second group of one trajectory (1 turn)
    # hidden: traj0 turn0 and traj1 turn0 are the same state (5° apart), the turn-1 states are far from each other
    hid = torch.zeros(3, 2, 3, dtype=torch.float64)
    hid[0, 0], hid[1, 0] = _deg(0)[0], _deg(5)[0]
    hid[0, 1], hid[1, 1] = _deg(90)[0], _deg(180)[0]
    hid[2, 0] = _deg(0)[0]  # same direction as traj0 turn0 but another prompt group: never clustered with it
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    Rk = torch.tensor([[2.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
    R = torch.tensor([2.0, 0.0, 3.0])
    gid = torch.tensor([0, 0, 1])
    acts = [["search[boots]", "click[#1]"], ["click[#2]", "click[#1]"], ["search[boots]"]]
    A, m = bipace_advantages(R, Rk, mask, gid, hid, acts, eps=_d(10), w=0.5)
    # episode: A^E = R − group mean: [1, −1, 0];  step: cluster {t0k0, t1k0} with different actions -> RLOO
    # 2 − 0.5 = 1.5 and 0.5 − 2 = −1.5; the turn-1 states and traj 2 are singletons -> 0
    expect = torch.tensor([[1 + 0.5 * 1.5, 1.0], [-1 - 0.5 * 1.5, -1.0], [0.0, 0.0]])
    assert torch.allclose(A.double(), expect.double())
    assert m["bipace_singleton_share"] == pytest.approx(3 / 4)  # clusters: {2 rows}, {t0k1}, {t1k1}, {t2k0}
    assert m["bipace_steps_in_singletons"] == pytest.approx(3 / 5)
    assert m["bipace_rloo_share"] == pytest.approx(2 / 5) and m["bipace_pace_share"] == 0
    assert m["bipace_parse_rate"] == 1.0
    # same actions in the shared state -> PACE: Q = V, so A^S = 0 there
    acts2 = [["search[boots]", "click[#1]"], ["Search[ boots]", "click[#1]"], ["search[boots]"]]
    A2, m2 = bipace_advantages(R, Rk, mask, gid, hid, acts2, eps=_d(10), w=0.5)
    assert torch.allclose(A2[:, 0].double(), torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64))
    assert m2["bipace_pace_share"] == pytest.approx(2 / 5)


def test_giant_cluster_metric():
    hid = _deg(0, 1, 2, 3, 90).reshape(1, 5, 3)
    A, m = bipace_advantages(torch.tensor([1.0]), torch.arange(5.0)[None], torch.ones(1, 5), torch.tensor([0]), hid,
                             [["search[a]"] * 5], eps=_d(10), giant_share=0.5)
    assert m["bipace_giant_clusters"] == 1.0 and m["bipace_cluster_p90"] == pytest.approx(4 - 0.1 * 3)


# ------------------------------------------------------------------------------------------------ ε schedule
def test_epsilon_frozen_after_first_batch_and_saved():
    algo = baselines.make("bipace", env_id=ENV)
    z1, z2 = _deg(0, 60, 90), _deg(0, 10, 20)
    g = torch.zeros(3, dtype=torch.long)
    eps1, cal1 = algo.current_epsilon(z1, g)
    eps2, cal2 = algo.current_epsilon(z2, g)
    assert cal1 and not cal2 and eps2 == eps1
    other = baselines.make("bipace", env_id=ENV)
    other.load_algo_state(algo.algo_state())
    assert other.current_epsilon(z2, g) == (eps1, False)
    every = baselines.make("bipace", env_id=ENV, eps_schedule="every_batch")
    every.current_epsilon(z1, g)
    assert every.current_epsilon(z2, g)[0] == pytest.approx(calibrate_epsilon(z2, g, 10))
    assert baselines.make("bipace", env_id=ENV, epsilon=0.3).current_epsilon(z1, g) == (0.3, False)


def test_bad_config_raises():
    for bad in ({"eps_percentile": 150}, {"hidden_pooling": "max"}, {"epsilon": 3.0}, {"min_peers": 0}):
        with pytest.raises(ConfigError):
            baselines.make("bipace", env_id=ENV, **bad)


# ------------------------------------------------------------------------------------------------ hidden states
def _agent(mode, **kw):
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    return LMAgent(env_id=ENV, model=build_model(tok, size="tiny", seed=0), tokenizer=tok, context_mode=mode,
                   max_new_tokens=6, **kw)


def test_trainer_switches_recording_on_and_hidden_is_last_prompt_token():
    from shopsim.rollout import collect

    agent = _agent("concat")
    assert not agent.sampling.record_hidden
    baselines.make("grpo", env_id=ENV).configure_agent(agent)
    assert not agent.sampling.record_hidden
    BiPACE().configure_agent(agent)
    assert agent.sampling.record_hidden
    trajs = collect(ENV, agent, episodes=2, group_size=2, num_envs=2, env_kwargs={"max_turns": 3}, progress=False,
                    agent_seed=0)
    turns = [t for tr in trajs for t in tr.turns]
    assert len(turns) >= 3 and all(t.hidden for t in turns)
    # concat mode with the KV cache: later turns reuse cached states, yet "last" / "mean" are the last prompt
    # token's / the prompt's mean last-layer state of a full forward over the prompt
    model = agent.model
    for t in turns:
        ids = torch.tensor([t.prompt_ids])
        with torch.no_grad():
            h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].float()
        assert torch.allclose(torch.tensor(t.hidden["last"]), h[-1], atol=1e-4)
        assert torch.allclose(torch.tensor(t.hidden["mean"]), h.mean(0), atol=1e-4)
    assert agent.kv_cache.reused_tokens > 0  # the cache was used


def test_missing_hidden_raises():
    from baselines.core.batch import build_batch
    from shopsim.rollout import collect

    agent = _agent("window")
    trajs = collect(ENV, agent, episodes=1, group_size=2, num_envs=2, env_kwargs={"max_turns": 2}, progress=False)
    with pytest.raises(ConfigError, match="hidden"):
        BiPACE().compute_advantages(build_batch(trajs), None)


# ------------------------------------------------------------------------------------------------ training
SMALL = dict(group_size=2, tasks_per_iter=1, eval_episodes=2, num_envs=2, max_new_tokens=6, lr=1e-4,
             env_kwargs={"max_turns": 3}, task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=0)


def test_bipace_trains_two_iterations_and_resumes_epsilon(tmp_path):
    import agents

    algo = baselines.make("bipace", env_id=ENV, **SMALL)
    res = algo.train(ENV, iterations=1, seed=0, out_dir=tmp_path, agent=_agent("concat"), progress=False)
    first = res.history[-1]
    assert first["bipace_epsilon_calibrated"] == 1.0 and first["bipace_epsilon"] >= 0
    # resume in a fresh object: ε comes from the saved state, it is not recalibrated on the new batch
    algo2 = baselines.make("bipace", env_id=ENV, **SMALL)
    res = algo2.train(ENV, iterations=2, seed=0, out_dir=tmp_path, agent=_agent("concat"), progress=False)
    assert len(res.history) == 2
    last = res.history[-1]
    assert last["bipace_epsilon_calibrated"] == 0.0 and last["bipace_epsilon"] == first["bipace_epsilon"]
    assert torch.isfinite(torch.tensor(last["loss"])) and last["gen_tokens"] > 0 and "dev_success" in last
    for k in ("singleton_share", "pace_share", "rloo_share", "parse_rate", "steps_in_singletons"):
        assert 0.0 <= last[f"bipace_{k}"] <= 1.0
    shares = last["bipace_pace_share"] + last["bipace_rloo_share"] + last["bipace_steps_in_singletons"]
    assert shares == pytest.approx(1.0)
    assert last["bipace_peer_count"] >= 1 and last["bipace_cluster_p90"] >= 1
    assert agents.load_checkpoint(tmp_path / "checkpoint").model is not None


def test_epsilon_for_a_target_singleton_rate():
    """Three pairs of near-duplicate states, pairs far apart: the smallest ε with no singleton lies between the
    within-pair and the between-pair distances, and clusters the pairs; a target of 1 needs no merging (ε = 0)."""
    from baselines.bipace import calibrate_epsilon_singleton, cluster_group, singleton_share

    base = torch.eye(3, dtype=torch.float64)
    z = torch.stack([base[0], base[0] + 0.02 * base[1], base[1], base[1] + 0.02 * base[2], base[2],
                     base[2] + 0.02 * base[0]])
    groups = torch.zeros(6, dtype=torch.long)
    within = 1 - torch.nn.functional.cosine_similarity(z[0], z[1], dim=0).item()
    eps = calibrate_epsilon_singleton(z, groups, 0.0)
    assert within <= eps < 0.5  # between-pair distances are ≈ 1
    assert cluster_group(z, eps) == [0, 0, 1, 1, 2, 2]
    assert singleton_share(z, groups, eps) == 0.0 and singleton_share(z, groups, 0.0) == 1.0
    assert calibrate_epsilon_singleton(z, groups, 1.0) == 0.0
    # the trainer uses it when asked, and the percentile rule otherwise
    algo = BiPACE(eps_target_singleton=0.0)
    assert algo.current_epsilon(z, groups) == (pytest.approx(eps), True)
    assert BiPACE().current_epsilon(z, groups)[0] != pytest.approx(eps)
