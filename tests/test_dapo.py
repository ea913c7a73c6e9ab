"""DAPO pieces (docs/algorithms/dapo.md): overlong shaping, dynamic sampling."""

import pytest
import torch

from baselines.dapo import DAPO, overlong_penalty
from tests.fixtures.toy_lm import ToyLMAgent, env_fns


def test_overlong_penalty_hand_values():
    L = torch.tensor([10, 12, 14, 16, 20])
    # L_max 16, L_cache 4: free up to 12, linear to -1 at 16, -1 beyond
    assert overlong_penalty(L, 16, 4).tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])


def _scripted_tries(monkeypatch, tries):
    """Make the base collector return the given tries: each a list of (group_id, [rewards])."""
    from baselines.core.trainer import LMAlgorithm
    from shopsim.trajectory import Trajectory, Turn

    calls = iter(tries)

    def fake(self, env_id, agent, iteration, rng, env_kwargs=None, env_fns=None, progress=False):
        out = []
        for gid, rewards in next(calls):
            for r in rewards:
                t = Turn("o", "a", reward=float(r), terminated=True, prompt_ids=[1, 2], action_ids=[3],
                         action_logprobs=[-0.5])
                out.append(Trajectory("toy", task_id=gid, group_id=gid, turns=[t]))
        return out, {"rollouts": len(out)}

    monkeypatch.setattr(LMAlgorithm, "collect_batch", fake)


def test_dynamic_sampling_drops_equal_reward_groups_and_resamples(monkeypatch):
    import numpy as np

    # try 1: group 0 all equal (dropped), group 1 varied (kept); try 2: group 2 varied (kept) fills the batch
    _scripted_tries(monkeypatch, [[(0, [1, 1, 1]), (1, [0, 1, 0])], [(2, [1, 0, 0]), (3, [0, 0, 0])]])
    algo = DAPO(group_size=3, tasks_per_iter=2, max_gen_batches=3, overlong_penalty=False)
    trajs, m = algo.collect_batch("toy", None, 0, np.random.default_rng(0))
    assert m == {"rollouts": 12, "gen_batches": 2, "kept_groups": 2}
    assert [t.group_id for t in trajs] == [(1, 1)] * 3 + [(2, 2)] * 3  # re-keyed per try, equal groups gone
    assert [t.total_reward for t in trajs] == [0, 1, 0, 1, 0, 0]


def test_dynamic_sampling_last_try_keeps_everything(monkeypatch):
    import numpy as np

    _scripted_tries(monkeypatch, [[(0, [1, 1])], [(1, [0, 0]), (2, [1, 1])]])
    algo = DAPO(group_size=2, tasks_per_iter=2, max_gen_batches=2, overlong_penalty=False)
    trajs, m = algo.collect_batch("toy", None, 0, np.random.default_rng(0))
    assert m["gen_batches"] == 2 and m["kept_groups"] == 2
    assert sorted({t.group_id for t in trajs}) == [(2, 1), (2, 2)]


def test_dynamic_sampling_runs_on_real_rollouts():
    import numpy as np

    algo = DAPO(group_size=3, tasks_per_iter=2, max_gen_batches=3, overlong_penalty=False, num_envs=3)
    agent = ToyLMAgent()
    algo.agent = agent
    trajs, m = algo.collect_batch("toy", agent, 0, np.random.default_rng(0), env_fns=env_fns(3))
    assert m["rollouts"] >= len(trajs) and 1 <= m["gen_batches"] <= 3
    groups = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t.total_reward)
    if m["gen_batches"] < 3:  # not the last try: every kept group has reward variance
        assert all(max(v) > min(v) for v in groups.values())