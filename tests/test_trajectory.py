import json

import numpy as np

from shopsim.trajectory import Trajectory, Turn, success_by_family, to_jsonable


def test_derived_views_and_json_round_trip():
    t = Trajectory(env_id="e", task_id=1, seed=2, group_id=0)
    t.append(Turn("o1", "a1", 0.5, info={"x": np.float32(1.5)}, action_ids=[1, 2, 3]))
    t.append(Turn("o2", "a2", 1.0, terminated=True, info={"success": True, "score": 0.75}, action_ids=[4]))
    assert t.total_reward == 1.5 and t.success and t.score == 0.75 and t.num_generated_tokens == 4
    assert t.terminated and not t.truncated
    d = json.loads(json.dumps(t.to_dict()))
    assert Trajectory.from_dict(d).to_dict() == d
    assert d["turns"][0]["info"]["x"] == 1.5


def test_score_defaults_to_return_and_numpy_is_converted():
    t = Trajectory(env_id="e")
    t.append(Turn({"a": np.arange(3)}, np.array([1.0, 2.0]), -2.0, truncated=True))
    assert t.score == -2.0 and not t.success and t.truncated
    assert to_jsonable(t.turns[0].observation) == {"a": [0, 1, 2]}
    assert t.episode_record()["num_turns"] == 1


def test_success_by_family_counts_only_trajectories_that_record_one():
    def traj(fam, ok):
        t = Trajectory("x", turns=[Turn("o", "a", reward=float(ok), terminated=True, info={"success": ok})])
        t.meta = {} if fam is None else {"family": fam}
        return t

    got = success_by_family([traj("bundle", True), traj("bundle", False), traj("after_sales", True),
                             traj(None, True)])
    assert got == {"after_sales": 1.0, "bundle": 0.5}
