"""ProactiveRec-v0: env API, determinism, semantic IDs, scorer == per-step env, reward rules, agents."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import shopsim  # noqa: F401  (registers the env ids)
from shopsim.envs.proactive_rec import INVALID, STOP, PathScorer, build_semantic_ids, get_world
from shopsim.envs.proactive_rec.env import ProactiveRecEnv, load_split
from shopsim.errors import ConfigError

ENV_ID = "shopsim/ProactiveRec-v0"
SMALL = dict(catalog_size=500, simulator="analytic")  # no training: fast


def _check(env):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    msgs = [str(w.message) for w in caught]
    assert not msgs, msgs


@pytest.mark.parametrize("mode", ["semantic_id", "item"])
def test_check_env_small(mode):
    _check(gym.make(ENV_ID, action_mode=mode, **SMALL).unwrapped)


@pytest.mark.slow
def test_check_env_default_sasrec():
    _check(gym.make(ENV_ID).unwrapped)


def _rollout(env, seed, task_id, actions):
    obs, info = env.reset(seed=seed, options={"task_id": task_id})
    out = [(obs, info)]
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        out.append((obs, r, term, trunc, info))
        if term:
            break
    return out


def test_seed_and_task_determinism():
    env1, env2 = ProactiveRecEnv(**SMALL), ProactiveRecEnv(**SMALL)
    rng = np.random.default_rng(0)
    acts = [env1.world.sids.codes[rng.integers(env1.n)] for _ in range(10)]
    a, b = _rollout(env1, 3, 17, acts), _rollout(env2, 3, 17, acts)
    for x, y in zip(a, b, strict=False):
        assert gym.utils.env_checker.data_equivalence(x, y)
    # the scenario is a pure function of the task id (not of the reset seed)
    o1, _ = env1.reset(seed=1, options={"task_id": 17})
    o2, _ = env1.reset(seed=99, options={"task_id": 17})
    assert np.array_equal(o1["history"], o2["history"]) and o1["target"] == o2["target"]
    o3, _ = env1.reset(seed=1, options={"task_id": 18})
    assert not np.array_equal(o1["history"], o3["history"])
    # without task_id the split's ids are drawn with the env RNG
    _, i1 = env1.reset(seed=5, options={"split": "dev"})
    _, i2 = env2.reset(seed=5, options={"split": "dev"})
    assert i1["task_id"] == i2["task_id"] and i1["task_id"] in load_split()["dev"]


def test_target_is_far_from_history():
    world = get_world(**{"catalog_size": 500, "simulator": "analytic"})
    hist, tgt = world.tasks(range(50))
    cos = np.einsum("bd,bd->b", world.emb[tgt], world.emb[hist].mean(1))
    mean_cos = (world.emb[hist].mean(1) @ world.emb.T).mean(1)
    assert (cos < mean_cos).mean() > 0.95
    assert not (hist == tgt[:, None]).any()


def test_splits_disjoint():
    split = load_split()
    lo, hi = split["train"]["range"]
    for name in ("dev", "test"):
        ids = np.array(split[name])
        assert ((ids < lo) | (ids >= hi)).all()
    assert not set(split["dev"]) & set(split["test"])


def test_semantic_ids_unique_with_collision_digit():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((40, 8))
    emb = np.concatenate([base, base, base[:5]])  # exact duplicates must collide on all 3 codes
    sids = build_semantic_ids(emb, codebook_size=4)
    assert sids.sizes[:3] == (4, 4, 4)
    keys = {tuple(c) for c in sids.codes}
    assert len(keys) == len(emb)  # unique
    assert (sids.codes[:40, :3] == sids.codes[40:80, :3]).all()  # duplicates share the prefix...
    assert sids.sizes[3] >= 3 and (sids.codes[:, 3] < sids.sizes[3]).all()  # ...and the digit separates them
    assert np.array_equal(sids.lookup(sids.codes), np.arange(len(emb)))
    assert sids.lookup(np.array([[0, 0, 0, sids.sizes[3] - 1 + 5]]))[0] == -1  # digit out of range
    prefixes = {tuple(c[:3]) for c in sids.codes}
    free = next(p for p in np.ndindex(4, 4, 4) if p not in prefixes)
    assert sids.lookup(np.array([[*free, 0]]))[0] == -1  # in range but names no item


def test_semantic_ids_catalog_scale():
    world = get_world(**{"catalog_size": 500, "simulator": "analytic"})
    k1, k2, k3, c = world.sids.sizes
    assert k1 == k2 == k3 == 13 and c >= 1  # 1.6·500^(1/3) ≈ 13 codes per level for a 500-item catalog
    assert len({tuple(x) for x in world.sids.codes}) == world.n_items


def _env_path_vs_scorer(env, n_paths=6, seed=0):
    rng = np.random.default_rng(seed)
    scorer = env.scorer
    world = env.world
    for p in range(n_paths):
        env.reset(seed=p, options={"task_id": 100 + p})
        hist = env.hist.copy()
        n_items = int(rng.integers(1, 11))
        path, rewards, comps = [], [], []
        for k in range(n_items):
            u = rng.random()
            if u < 0.15:  # invalid semantic ID
                codes = np.array([0, 0, 0, world.sids.sizes[3] - 1])
                while world.sids.lookup(codes[None])[0] >= 0:
                    codes = np.array([rng.integers(s) for s in world.sids.sizes])
                item = INVALID
            elif u < 0.3 and k > 0 and path[-1] >= 0:  # duplicate of the previous item
                item = path[-1]
                codes = world.sids.codes[item]
            else:
                item = int(rng.integers(world.n_items))
                codes = world.sids.codes[item]
            _, r, term, _, info = env.step(codes)
            path.append(item)
            rewards.append(r)
            comps.append((info["IoI"], info["IoR"], info["CTR"], info["valid"], info["duplicate"]))
            if term:
                break
        if len(path) < 10:
            _, r, term, _, info = env.step(np.array([world.sids.sizes[0], 0, 0, 0]))
            assert term and r == 0.0
        padded = np.full((1, 10), STOP)
        padded[0, : len(path)] = path
        s = scorer.score(hist[None], [env.target], padded)
        assert s.lengths[0] == len(path)
        for k, (ioi, ior, ctr, valid, dup) in enumerate(comps):
            np.testing.assert_allclose([s.ioi[0, k], s.ctr[0, k]], [ioi, ctr], atol=1e-4)
            assert abs(s.ior[0, k] - ior) <= 1  # integer ranks; float ties may differ by one position
            assert bool(s.valid[0, k]) == valid and bool(s.duplicate[0, k]) == dup
        fused = env.weights.fuse(s.ioi[0, : len(path)], s.ior[0, : len(path)], s.ctr[0, : len(path)])
        np.testing.assert_allclose(fused, rewards, atol=1e-2 / 1)
        m = info["episode_metrics"]
        assert m["length"] == len(path)
        assert m["invalid"] == pytest.approx(np.mean([i == INVALID for i in path]))


def test_scorer_matches_step_env_analytic():
    _env_path_vs_scorer(ProactiveRecEnv(**SMALL))


@pytest.mark.slow
def test_scorer_matches_step_env_sasrec():
    _env_path_vs_scorer(ProactiveRecEnv(), n_paths=10)


def _random_paths_with_specials(world, hist, rng, length=10):
    """Random paths (0..length items, some rows empty) with invalid items, repeats of earlier path items and of
    history items, so that every rule of the scorer is exercised."""
    b = len(hist)
    items = rng.integers(world.n_items, size=(b, length))
    u = rng.random((b, length))
    items = np.where(u < 0.12, INVALID, items)
    items[:, 1:] = np.where(u[:, 1:] > 0.85, items[:, :-1], items[:, 1:])  # repeat (maybe an invalid one)
    from_hist = rng.random((b, length)) < 0.1
    items = np.where(from_hist, hist[np.arange(b)[:, None], rng.integers(hist.shape[1], size=(b, length))], items)
    lengths = rng.integers(0, length + 1, size=b)
    return np.where(np.arange(length)[None] < lengths[:, None], items, STOP)


def _assert_same_scores(fast, ref):
    for f in ("ioi", "ior", "ctr", "logp_target"):
        np.testing.assert_allclose(getattr(fast, f), getattr(ref, f), rtol=0, atol=1e-5, err_msg=f)
    for f in ("target_rank", "valid", "duplicate", "step_mask"):
        np.testing.assert_array_equal(getattr(fast, f), getattr(ref, f), err_msg=f)


def _untrained_sasrec_world(n=300, seed=0):
    """A world-like object with a randomly initialised SASRec: the same code path as the trained simulator (the
    scorer does not care what the weights are), without the training the cached 5k-item model needs."""
    from types import SimpleNamespace

    import torch

    from shopsim.envs.proactive_rec.simulator import SASRec, SASRecSimulator

    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n, 32)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    torch.manual_seed(seed)
    return SimpleNamespace(sim=SASRecSimulator(SASRec(n, init_emb=emb)), n_items=n), emb


@pytest.mark.parametrize("simulator", ["analytic", "sasrec_untrained"])
@pytest.mark.parametrize("rows", [None, 7])
def test_fast_scorer_matches_reference_implementation(simulator, rows):
    """`PathScorer.score` (blocked catalog pass) == `score_reference` (the first implementation) within 1e-5,
    ranks exactly, for both invalid-item rules; rows=7 puts block boundaries inside paths and a partial last block."""
    rng = np.random.default_rng(3)
    if simulator == "analytic":
        world = get_world(**SMALL)
        hist, tgt = world.tasks(np.arange(40))
    else:
        world, _ = _untrained_sasrec_world()
        hist = np.stack([rng.choice(world.n_items, 10, replace=False) for _ in range(40)])
        tgt = rng.integers(world.n_items, size=40)
    scorer = PathScorer(world, rows=rows, chunk=16)
    paths = _random_paths_with_specials(world, hist, rng)
    assert (paths == INVALID).any() and (paths == STOP).all(1).any()
    for rule in ("fixed", "batch_min"):
        fast = scorer.score(hist, tgt, paths, invalid=rule)
        ref = scorer.score_reference(hist, tgt, paths, invalid=rule)
        assert fast.duplicate.any() and (fast.step_mask & ~fast.valid).any()
        _assert_same_scores(fast, ref)
    one = scorer.score(hist[:1], tgt[:1], paths[:1])  # a batch of one (the per-step env's call) agrees too
    _assert_same_scores(one, scorer.score_reference(hist[:1], tgt[:1], paths[:1]))


@pytest.mark.slow
def test_fast_scorer_matches_reference_trained_sasrec():
    world = get_world()  # 5k items, trained SASRec (cached on disk)
    rng = np.random.default_rng(4)
    hist, tgt = world.tasks(np.arange(600))
    paths = _random_paths_with_specials(world, hist, rng)
    scorer = PathScorer(world)
    _assert_same_scores(scorer.score(hist, tgt, paths), scorer.score_reference(hist, tgt, paths))


def test_invalid_duplicate_and_batch_min_rules():
    env = ProactiveRecEnv(**SMALL)
    world, scorer = env.world, env.scorer
    hist, tgt = world.tasks([1, 2])
    paths = np.array([[5, INVALID, 5, STOP, 7], [hist[1, 0], 9, STOP, STOP, STOP]])
    s = scorer.score(hist, tgt, paths)
    assert s.step_mask.tolist() == [[True, True, True, False, False], [True, True, False, False, False]]
    assert s.ctr[0, 1] == -1.0 and s.ioi[0, 1] == scorer.invalid_ioi and s.ior[0, 1] == scorer.invalid_ior
    assert s.duplicate[0, 2] and s.ctr[0, 2] == 0.0 and s.ioi[0, 2] != 0.0  # IoI kept for a duplicate
    assert s.duplicate[1, 0] and s.ctr[1, 0] == 0.0  # duplicate of a history item
    assert not s.duplicate[0, 0] and 0 < s.ctr[0, 0] < 1
    # the invalid item is not appended: the state after it equals the state before it
    assert s.logp_target[0, 2] == s.logp_target[0, 1]
    b = scorer.score(hist, tgt, paths, invalid="batch_min")
    real = s.valid
    assert b.ioi[0, 1] == pytest.approx(s.ioi[real].min() - 1.0)
    assert b.ior[0, 1] == pytest.approx(s.ior[real].min() - 1.0)


def test_malformed_actions_are_flagged_not_raised():
    env = ProactiveRecEnv(**SMALL)
    env.reset(seed=0, options={"task_id": 3})
    _, r, term, trunc, info = env.step(np.array([999, 0, 0, 0]))
    assert "invalid_action" in info and not info["valid"] and info["CTR"] == -1.0 and not term
    _, _, _, _, info = env.step("not an action")
    assert "invalid_action" in info and not info["valid"]
    env2 = ProactiveRecEnv(action_mode="item", **SMALL)
    env2.reset(seed=0, options={"task_id": 3})
    _, _, _, _, info = env2.step(10_000)
    assert "out of range" in info["invalid_action"]
    _, r, term, _, info = env2.step(env2.n)  # EOS
    assert term and r == 0.0 and info["episode_metrics"]["length"] == 1.0
    with pytest.raises(ConfigError):
        ProactiveRecEnv(action_mode="bogus", **SMALL)


def test_episode_ends_at_l_max():
    env = ProactiveRecEnv(action_mode="item", **SMALL)
    env.reset(seed=0, options={"task_id": 4})
    for k in range(10):
        _, _, term, trunc, info = env.step(k)
        assert term == (k == 9) and not trunc
    assert set(info["episode_metrics"]) == {"IoI", "IoR", "CTR", "length", "invalid"}
    assert isinstance(info["success"], bool) and isinstance(info["score"], float)


def test_expert_and_random_agents_run_and_expert_wins():
    from agents import make
    from agents.rec_policies import expert_paths, random_paths
    from shopsim.envs.proactive_rec.scoring import path_metrics

    world = get_world(500, 0, "analytic")
    hist, tgt = world.tasks(load_split()["dev"][:64])
    items, lengths = expert_paths(world, hist, tgt)
    scorer = PathScorer(world)
    exp = path_metrics(scorer.score(hist, tgt, items))
    rnd = path_metrics(scorer.score(hist, tgt, random_paths(world, 64, np.random.default_rng(0))))
    assert exp["IoI"] > rnd["IoI"] and exp["CTR"] > rnd["CTR"]
    # the per-step agent interface gives the same first item as the batched expert
    agent = make("expert", ENV_ID, **SMALL)
    env = ProactiveRecEnv(**SMALL)
    obs, info = env.reset(seed=0, options={"task_id": load_split()["dev"][0]})
    agent.reset(1, 0)
    act = agent.act([obs], [info], [0])[0].action
    first = items[0, 0]
    if first >= 0:
        assert np.array_equal(act, world.sids.codes[first])
    rnd_agent = make("random", ENV_ID, **SMALL)
    rnd_agent.reset(1, 0)
    for _ in range(3):
        a = rnd_agent.act([obs], [info], [0])[0].action
        assert env.action_space.contains(np.asarray(a, dtype=np.int64))


def test_expert_acting_for_many_slots_at_once_picks_what_it_picks_for_each_alone():
    from agents import make
    from shopsim.rollout import collect

    agent = make("expert", ENV_ID, **SMALL)
    tasks = load_split()["dev"][:16]
    trajs = collect(ENV_ID, agent, tasks=tasks, seeds=list(range(16)), split="dev", num_envs=8, progress=False,
                    env_kwargs=SMALL)
    env = ProactiveRecEnv(**SMALL)
    for traj, task, seed in zip(trajs, tasks, range(16), strict=True):
        obs, info = env.reset(seed=seed, options={"task_id": task})
        for turn in traj.turns:  # the same episode with the agent acting for this one slot only
            alone = agent.act([obs], [info], [0])[0].action
            assert np.array_equal(np.asarray(alone), np.asarray(turn.action))
            obs, _, terminated, truncated, info = env.step(alone)
        assert terminated or truncated
    assert max(len(t.turns) for t in trajs) > 2  # paths of several items: the batch held slots at other steps


@pytest.mark.parametrize("valid_only,no_repeat", [(False, False), (True, False), (False, True), (True, True)])
def test_policy_agent_per_step_matches_batched_decoding(valid_only, no_repeat):

    from agents.rec_model import build_model
    from agents.rec_policies import RecPolicyAgent, policy_paths

    kw = dict(catalog_size=100, simulator="analytic")
    agent = RecPolicyAgent(valid_only=valid_only, no_repeat=no_repeat, **kw)
    agent.model = build_model(agent.vocab, d=32, layers=1, heads=2, seed=1).eval()
    env = ProactiveRecEnv(**kw)
    task_ids = load_split()["dev"][:3]
    hist, tgt = env.world.tasks(task_ids)
    _, gen, lp, items, lengths = policy_paths(agent, hist, tgt, greedy=True)
    agent.reset(1, 0)
    for row, t in enumerate(task_ids):
        obs, info = env.reset(seed=0, options={"task_id": t})
        stepped, logps = [], []
        for _ in range(11):
            d = agent.act([obs], [info], [0])[0]
            logps += d.action_logprobs
            obs, _, term, _, info = env.step(d.action)
            if not info["eos"]:
                stepped.append(info["item"] if info["valid"] else INVALID)
                assert not (no_repeat and info["duplicate"])
            if term:
                break
        assert stepped == [int(i) for i in items[row, : lengths[row]]]
        n_tok = 4 * lengths[row] + (1 if lengths[row] < 10 else 0)
        np.testing.assert_allclose(logps[:n_tok], lp[row, :n_tok].numpy(), atol=1e-5)
        if valid_only:
            assert (items[row, : lengths[row]] >= 0).all()


def test_logged_paths_continue_the_history():
    """`logged_paths` (the 'logged' SFT source) continues exactly the scenario's history under the hidden process."""
    from agents.rec_policies import logged_paths, pretrained_policy
    from shopsim.envs.proactive_rec.simulator import generate_sequences

    world = get_world(500, 0, "analytic")
    ids = np.array([3, 17, 900_001])
    hist, tgt = world.tasks(ids)
    items, lengths = logged_paths(world, ids, tgt)
    for i, t in enumerate(ids):
        seq = generate_sequences(world.emb, 1, 20, seed=[world.seed, int(t), 0x7A5C])[0]
        assert (seq[:10] == hist[i]).all()  # the same user: its history is the prefix of the longer sequence
        n = int(lengths[i])
        assert 1 <= n <= 10 and (items[i, :n] == seq[10:10 + n]).all() and (items[i, n:] == -1).all()
        cos = world.emb[seq[10:]] @ world.emb[tgt[i]]
        assert cos[n - 1] == cos.max()  # cut after the item closest to the target
    with pytest.raises(ConfigError):
        pretrained_policy(catalog_size=500, simulator="analytic", sft_source="nope")
