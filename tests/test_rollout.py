import gymnasium as gym
import pytest

from shopsim.errors import ConfigError
from shopsim.rollout import RunningSummary, collect, plan_episodes, summarize
from shopsim.testing import COUNT_ID, CountEnv, CountExpert, CountRandom, make_count_env


def run(agent, **kw):
    kw.setdefault("progress", False)
    return collect(COUNT_ID, agent, env_fns=[make_count_env] * kw.pop("num_envs", 3), num_envs=3, **kw)


def test_expert_solves_every_episode_in_order():
    trajs = run(CountExpert(), episodes=7, seed=10)
    assert [t.traj_id for t in trajs] == list(range(7))
    assert [t.seed for t in trajs] == list(range(10, 17))
    for t in trajs:
        assert t.success and t.terminated and not t.truncated
        assert t.num_turns == 2 + t.task_id % 5
        assert "oracle" not in t.turns[0].info  # privileged info is not stored
        assert t.turns[0].extra["anchor"] == "v=0"  # the pre-action state key
        assert t.final_info["episode_metrics"]["success"] == 1.0


def test_groups_share_task_and_initial_state():
    trajs = run(CountRandom(), tasks=[3, 8], group_size=4, seed=5)
    assert len(trajs) == 8
    assert [t.group_id for t in trajs] == [0] * 4 + [1] * 4
    first_obs = [t.turns[0].observation for t in trajs]
    assert len(set(first_obs[:4])) == 1 and len(set(first_obs[4:])) == 1
    assert {t.task_id for t in trajs[:4]} == {3}
    # the random agent's samples differ within a group
    assert len({tuple(turn.action for turn in t.turns) for t in trajs[:4]}) > 1


def test_same_seed_same_trajectories_and_num_envs_do_not_change_order():
    a = run(CountRandom(), episodes=6, seed=1)
    b = run(CountRandom(), episodes=6, seed=1)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    c = collect(COUNT_ID, CountExpert(), env_fns=[make_count_env], num_envs=1, episodes=6, seed=1, progress=False)
    d = collect(COUNT_ID, CountExpert(), env_fns=[make_count_env] * 4, num_envs=4, episodes=6, seed=1, progress=False)
    assert [t.to_dict() for t in c] == [t.to_dict() for t in d]


def test_truncation_and_invalid_actions_are_recorded():
    trajs = run(CountRandom(), episodes=4, seed=0)
    assert any(t.truncated for t in trajs) or all(t.success for t in trajs)
    invalid = [turn for t in trajs for turn in t.turns if "invalid_action" in turn.info]
    assert invalid, "the random agent sends invalid actions; they must be flagged"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_env_gives_the_same_trajectories(mode):
    ref = run(CountExpert(), episodes=5, seed=3)
    vec = collect(COUNT_ID, CountExpert(), env_fns=[make_count_env] * 2, num_envs=2, episodes=5, seed=3,
                  vector=mode, progress=False)
    assert [t.to_dict() for t in vec] == [t.to_dict() for t in ref]


def test_plan_errors_say_what_to_change():
    with pytest.raises(ConfigError, match="group_size"):
        plan_episodes(episodes=2, group_size=0)
    with pytest.raises(ConfigError, match="give episodes"):
        plan_episodes()
    with pytest.raises(ConfigError, match="only 1 tasks"):
        plan_episodes(episodes=3, tasks=[1])


def test_episode_plan_is_lazy_and_the_same_as_a_list():
    """`plan_episodes` does not build the list: its memory does not grow with the number of episodes (a rollout of
    10^12 episodes starts at once), and every entry is what the list would hold."""
    import tracemalloc

    def options(index, group):
        return {"family": ["a", "b"][group % 2]}

    tracemalloc.start()
    try:
        plan = plan_episodes(episodes=100_000, group_size=3, seed=7, split="dev", reset_options=options)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200_000, f"planning 300000 episodes allocated {peak} bytes"
    assert len(plan) == 300_000
    spec = plan[300_000 - 1]
    assert (spec.index, spec.seed, spec.group_id, spec.options) == (299_999, 7 + 99_999, 99_999,
                                                                     {"family": "b", "split": "dev"})
    assert plan[-1] == spec and plan[4:6] == [plan[4], plan[5]] and list(plan)[:2] == plan[:2]
    huge = plan_episodes(episodes=10**12, seed=1)
    assert len(huge) == 10**12 and huge[-1].seed == 10**12 and huge[-1].index == 10**12 - 1
    tasks = plan_episodes(tasks=[5, 9], seeds=[11, 12], group_size=2)
    assert [(sp.task_id, sp.seed, sp.group_id, sp.options["task_id"]) for sp in tasks] == [
        (5, 11, 0, 5), (5, 11, 0, 5), (9, 12, 1, 9), (9, 12, 1, 9)]


def test_collect_can_stream_without_keeping_trajectories():
    """``keep=False``: trajectories reach `on_episode` (and the writer) in episode order and are then dropped, so
    a long rollout holds only the few that finished ahead of an earlier one."""
    import gc

    from shopsim.trajectory import Trajectory

    ref = run(CountRandom(), episodes=60, seed=2)
    seen, alive, summary = [], [], RunningSummary()

    def on_episode(traj):
        seen.append(traj.to_dict())
        summary.add(traj)
        if len(seen) % 20 == 0:
            alive.append(sum(type(o) is Trajectory for o in gc.get_objects()))

    out = run(CountRandom(), episodes=60, seed=2, keep=False, on_episode=on_episode)
    assert out == [] and seen == [t.to_dict() for t in ref]
    # `ref`'s, plus a few: the 3 env copies' episodes in progress or finished ahead, the one being emitted (kept,
    # they would be 20, 40 and 60 more)
    assert len(alive) == 3 and max(alive) <= len(ref) + 8
    assert summary.result() == pytest.approx(summarize(ref))  # what `shopsim rollout` prints


def test_unknown_env_lists_available():
    from shopsim.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="Shopping-v0"):
        collect("shopsim/Nope-v0", CountExpert(), episodes=1, progress=False)


def test_summarize():
    trajs = run(CountExpert(), episodes=4, seed=0)
    s = summarize(trajs)
    assert s["success"] == 1.0 and s["episodes"] == 4
    assert s["turns"] == pytest.approx(sum(t.num_turns for t in trajs) / 4)


def test_toy_env_passes_check_env():
    from gymnasium.utils.env_checker import check_env

    check_env(CountEnv(), skip_render_check=True)
    assert isinstance(gym.Env, type)
