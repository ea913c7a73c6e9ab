"""DAPO pieces (docs/algorithms/dapo.md): overlong shaping, dynamic sampling."""

import pytest
import torch

from baselines.dapo import DAPO, overlong_penalty
from tests._toy_lm import ToyLMAgent, env_fns


def test_overlong_penalty_hand_values():
    L = torch.tensor([10, 12, 14, 16, 20])
    # L_max 16, L_cache 4: free up to 12, linear to -1 at 16, -1 beyond
    assert overlong_penalty(L, 16, 4).tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])


def test_dynamic_sampling_keeps_only_groups_with_variance():
    algo = DAPO(group_size=3, tasks_per_iter=2, max_gen_batches=3, overlong_penalty=False, num_envs=3)
    agent = ToyLMAgent()
    algo.agent = agent
    import numpy as np

    trajs, m = algo.collect_batch("toy", agent, 0, np.random.default_rng(0), env_fns=env_fns(3))
    assert m["rollouts"] >= len(trajs) and m["gen_batches"] >= 1
    groups = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t.total_reward)
    if m["gen_batches"] < 3:  # not the last try: every kept group has reward variance
        assert all(max(v) > min(v) for v in groups.values())
        assert len(groups) >= 2
