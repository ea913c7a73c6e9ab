"""`LMConfig.greedy_failed_share`: each iteration's tasks drawn among the episodes greedy decoding fails, and the
`kl_start` estimate's row subset (`baselines.core.trainer`)."""

import pytest
import torch

import baselines

ENV = "shopsim/Shopping-v0"


@pytest.fixture(scope="module")
def shipped():
    from agents.lm.agent import LMAgent, default_checkpoint_dir
    from agents.registry import manifest_env_kwargs

    ckpt = default_checkpoint_dir()
    return LMAgent(env_id=ENV, checkpoint=ckpt, temperature=1.0), {**manifest_env_kwargs(ckpt), "max_turns": 15}


def _replay(agent, env_kwargs, tasks, seeds):
    from shopsim.rollout import collect

    agent.sampling.greedy = True
    try:
        return [bool(t.success) for t in collect(ENV, agent, tasks=tasks, seeds=seeds, split="train", num_envs=8,
                                                 env_kwargs=env_kwargs, progress=False, agent_seed=0)]
    finally:
        agent.sampling.greedy = False


def test_the_screen_puts_greedy_failures_first_and_fills_with_solved_episodes(shipped):
    import numpy as np

    agent, env_kwargs = shipped
    algo = baselines.make("grpo", env_id=ENV, group_size=2, tasks_per_iter=8, num_envs=8, greedy_failed_share=0.25,
                          screen_rounds=3, task_families=("bundle", "after_sales"))
    rng = np.random.default_rng(3)
    tasks = algo.train_tasks(ENV, rng, 8)
    seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=8)]
    chosen, chosen_seeds, m = algo.prefer_greedy_failures(ENV, agent, tasks, seeds, rng, env_kwargs=env_kwargs)
    assert agent.sampling.greedy is False  # the rollouts still sample
    assert len(chosen) == len(chosen_seeds) == 8
    wins = _replay(agent, env_kwargs, chosen, chosen_seeds)
    # two failures first, then the solved episodes in draw order, then (too few solved) the other failures
    solved = wins.count(True)
    assert 0 < solved and wins == [False, False] + [True] * solved + [False] * (6 - solved)
    assert m["greedy_failed_tasks"] == wins.count(False) / 8
    assert m["screen_rollouts"] % 8 == 0 and 8 <= m["screen_rollouts"] <= 24
    # the first round is the draw itself: when it holds the failures asked for, its episodes are kept in draw order
    first = _replay(agent, env_kwargs, tasks, seeds)
    assert first.count(False) >= 2  # this draw (seed 3) has them
    assert m["screen_rollouts"] == 8
    failed = [(t, s) for t, s, w in zip(tasks, seeds, first, strict=True) if not w]
    won = [(t, s) for t, s, w in zip(tasks, seeds, first, strict=True) if w]
    assert list(zip(chosen, chosen_seeds, strict=True)) == (failed[:2] + won + failed[2:])[:8]


def test_a_share_of_one_takes_only_failures_when_the_rounds_find_them(shipped):
    import numpy as np

    agent, env_kwargs = shipped
    algo = baselines.make("grpo", env_id=ENV, group_size=2, tasks_per_iter=4, num_envs=8, greedy_failed_share=1.0,
                          screen_rounds=4, task_families=("bundle",))
    rng = np.random.default_rng(0)
    tasks = algo.train_tasks(ENV, rng, 4)
    seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=4)]
    chosen, chosen_seeds, m = algo.prefer_greedy_failures(ENV, agent, tasks, seeds, rng, env_kwargs=env_kwargs)
    wins = _replay(agent, env_kwargs, chosen, chosen_seeds)
    assert m["greedy_failed_tasks"] == wins.count(False) / 4
    if m["screen_rollouts"] < 16:  # stopped early: enough failures were found
        assert not any(wins)
    if m["screen_rollouts"] == 4:  # the draw itself held them: it was all the screen played
        assert m["screen_greedy_success"] == _replay(agent, env_kwargs, tasks, seeds).count(True) / 4 == 0


def test_the_screen_needs_task_ids():
    import numpy as np

    from shopsim.errors import ConfigError

    algo = baselines.make("grpo", env_id=ENV, greedy_failed_share=0.5)
    with pytest.raises(ConfigError, match="task ids"):
        algo.prefer_greedy_failures(ENV, object(), None, [1], np.random.default_rng(0))


def test_kl_start_rows_are_spread_over_the_batch():
    from baselines.core.trainer import kl_rows

    assert kl_rows(10, 0).tolist() == list(range(10))
    assert kl_rows(10, 64).tolist() == list(range(10))
    rows = kl_rows(256, 64)
    assert len(rows) == 64 and rows[0] == 0 and rows[-1] == 255
    assert torch.all(rows[1:] > rows[:-1])
