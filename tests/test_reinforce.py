"""REINFORCE baselines on hand examples (docs/algorithms/reinforce.md)."""

import pytest

from baselines.core.batch import build_batch
from baselines.reinforce import ReinforceConfig, reinforce_advantages
from shopsim.errors import ConfigError
from shopsim.trajectory import Trajectory, Turn


def _traj(rewards, group):
    turns = [Turn("o", "a", reward=r, prompt_ids=[1], action_ids=[2], action_logprobs=[-0.5]) for r in rewards]
    return Trajectory("x", group_id=group, turns=turns)


def test_batch_mean_none_and_rloo():
    b = build_batch([_traj([0.0, 1.0], 0), _traj([2.0], 0), _traj([0.0, 0.0], 1)])
    A, _ = reinforce_advantages(b, "none", gamma=1.0)
    assert A.tolist() == [[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]
    A, _ = reinforce_advantages(b, "batch_mean", gamma=1.0)
    # turn 0 mean over 3 rows = 1; turn 1 mean over 2 rows = 0.5
    assert A.tolist() == [[0.0, 0.5], [1.0, 0.0], [-1.0, -0.5]]
    A, _ = reinforce_advantages(b, "rloo", gamma=1.0)
    # group 0: returns 1 and 2 -> baselines 2 and 1; group 1 singleton -> baseline 0
    assert A.tolist() == [[-1.0, -1.0], [1.0, 0.0], [0.0, 0.0]]


def test_ema_baseline_updates():
    b = build_batch([_traj([1.0], 0), _traj([3.0], 0)])
    A, ema = reinforce_advantages(b, "ema", gamma=1.0, ema=None, ema_decay=0.5)
    assert A.tolist() == [[-1.0], [1.0]] and ema.tolist() == [2.0]
    b2 = build_batch([_traj([4.0], 0), _traj([4.0], 0)])
    A, ema = reinforce_advantages(b2, "ema", gamma=1.0, ema=ema, ema_decay=0.5)
    assert A.tolist() == [[2.0], [2.0]] and ema.tolist() == [3.0]


def test_config():
    assert ReinforceConfig(baseline="rloo").group_size == 4
    assert ReinforceConfig().group_size == 1
    with pytest.raises(ConfigError, match="rloo"):
        ReinforceConfig(baseline="rloo", group_size=1)
