import json
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

from shopsim.datasets import (
    DatasetWriter,
    iter_trajectories,
    read_episodes,
    read_metadata,
    read_trajectories,
    read_turns,
    write_dataset,
)
from shopsim.errors import DatasetError
from shopsim.rollout import collect
from shopsim.testing import COUNT_ID, CountRandom, make_count_env
from shopsim.trajectory import Trajectory, Turn


def lm_trajectory(i=0):
    t = Trajectory(env_id="shopsim/Shopping-v0", task_id=i, split="train", seed=7, group_id=3, strategy="ask first",
                   traj_id=i, agent="lm", meta={"family": "find_and_buy"})
    t.append(Turn("Instruction: find 漢字 shoes ✓", "search[漢字 shoes]", 0.0, False, False, {"page": "results"},
                  prompt_ids=[1, 2, 3], action_ids=[4, 5], action_logprobs=[-0.25, -1.5],
                  hidden={"last": [0.5, -0.5], "mean": [0.1, 0.2]}, value=0.3, extra={"teacher": [0.1]}))
    t.append(Turn("", "", 1.0, True, False, {"success": True, "score": 1.0}, prompt_ids=[1, 2, 3, 4, 5, 6],
                  action_ids=[], action_logprobs=[]))
    return t


def numeric_trajectory():
    t = Trajectory(env_id="shopsim/Replenishment-v0", task_id=5, seed=1, traj_id=0)
    t.append(Turn({"on_hand": [1.0, 2.5]}, {"order": [1, 0], "quantity": [3.5, 0.0]}, -4.5, False, True,
                  {"cost": 4.5}, logprob=-2.25))
    return t


def test_round_trip_unicode_empty_actions_and_numeric(tmp_path):
    trajs = [lm_trajectory(0), lm_trajectory(1), numeric_trajectory()]
    path = write_dataset(tmp_path / "d.parquet", trajs, {"env_id": "mixed", "agent": "test"})
    back = read_trajectories(path)
    assert [t.to_dict() for t in back] == [t.to_dict() for t in trajs]
    assert back[0].turns[1].action == "" and back[0].turns[1].action_ids == []
    assert back[2].turns[0].action == {"order": [1, 0], "quantity": [3.5, 0.0]}
    meta = read_metadata(path)
    assert meta["agent"] == "test" and meta["schema_version"] == 1 and "versions" in meta


def test_loads_with_pandas_and_hf_datasets(tmp_path):
    path = write_dataset(tmp_path / "d.parquet", [lm_trajectory(0), lm_trajectory(1)])
    df = pd.read_parquet(path)
    assert len(df) == 4 and list(df["turn"]) == [0, 1, 0, 1]
    assert df.loc[0, "observation"].endswith("✓") and list(df.loc[0, "action_ids"]) == [4, 5]
    import datasets  # in the dev extra that `make test` installs

    ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert ds.num_rows == 4 and ds[0]["action"] == "search[漢字 shoes]" and ds[0]["prompt_ids"] == [1, 2, 3]
    eps = read_episodes(path)
    assert len(eps) == 2 and eps["success"].tolist() == [True, True] and eps["num_turns"].tolist() == [2, 2]


def test_streaming_in_small_chunks(tmp_path):
    trajs = collect(COUNT_ID, CountRandom(), env_fns=[make_count_env] * 2, num_envs=2, episodes=30, seed=0,
                    progress=False)
    path = tmp_path / "s.parquet"
    with DatasetWriter(path, {"x": 1}, chunk_rows=7) as w:
        w.write_all(trajs)
    assert pq.ParquetFile(path).num_row_groups > 3
    back = list(iter_trajectories(path, batch_rows=5))
    assert [t.to_dict() for t in back] == [t.to_dict() for t in trajs]
    assert len(read_turns(path)) == sum(t.num_turns for t in trajs)


def test_same_seed_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    paths = []
    for name in ("a", "b"):
        trajs = collect(COUNT_ID, CountRandom(), env_fns=[make_count_env] * 2, num_envs=2, episodes=10, seed=4,
                        progress=False)
        paths.append(write_dataset(tmp_path / f"{name}.parquet", trajs, {"seed": 4}))
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_exception_inside_writer_leaves_no_file(tmp_path):
    path = tmp_path / "x.parquet"
    with pytest.raises(RuntimeError):
        with DatasetWriter(path, chunk_rows=1) as w:
            w.write(lm_trajectory())
            raise RuntimeError("boom")
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_killed_writer_leaves_no_file_that_looks_complete(tmp_path):
    """A process killed mid-write (no cleanup at all) leaves only a hidden temp file that readers reject."""
    path = tmp_path / "killed.parquet"
    code = f"""
import os
from shopsim.datasets import DatasetWriter
from tests.test_datasets import lm_trajectory
w = DatasetWriter({str(path)!r}, chunk_rows=1)
for i in range(50):
    w.write(lm_trajectory(i))
os._exit(1)
"""
    subprocess.run([sys.executable, "-c", code], check=False, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert not path.exists()
    leftovers = list(tmp_path.iterdir())
    assert leftovers and all(p.name.startswith(".") for p in leftovers)
    with pytest.raises(DatasetError):
        read_trajectories(leftovers[0])


def test_a_rerun_removes_what_a_killed_writer_left(tmp_path):
    """The hidden temp file of a writer killed mid-write is removed by the next writer into the folder, so an
    interrupted and rerun rollout leaves only its dataset."""
    path = tmp_path / "x.parquet"
    code = f"""
import os
from shopsim.datasets import DatasetWriter
from tests.test_datasets import lm_trajectory
w = DatasetWriter({str(path)!r}, chunk_rows=1)
w.write(lm_trajectory(0))
os._exit(1)
"""
    subprocess.run([sys.executable, "-c", code], check=False, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert [p.name.startswith(".x.parquet.tmp-") for p in tmp_path.iterdir()] == [True]
    write_dataset(path, [lm_trajectory(1)], {})
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]


def test_reader_errors_are_clear(tmp_path):
    with pytest.raises(DatasetError, match="no dataset"):
        read_trajectories(tmp_path / "missing.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match="not a complete Parquet"):
        read_trajectories(bad)
    foreign = tmp_path / "foreign.parquet"
    pd.DataFrame({"a": [1]}).to_parquet(foreign)
    with pytest.raises(DatasetError, match="no shopsim metadata"):
        read_metadata(foreign)
    with pytest.raises(DatasetError, match="folder"):
        DatasetWriter(tmp_path)
    with pytest.raises(DatasetError, match="no turns"):
        with DatasetWriter(tmp_path / "e.parquet") as w:
            w.write(Trajectory(env_id="x"))


def test_old_schema_version_is_refused(tmp_path):
    import pyarrow as pa

    path = write_dataset(tmp_path / "d.parquet", [lm_trajectory()])
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"shopsim"])
    meta["schema_version"] = 0
    old = tmp_path / "old.parquet"
    pq.write_table(table.replace_schema_metadata({b"shopsim": json.dumps(meta).encode()}), old)
    with pytest.raises(DatasetError, match="schema version 0"):
        read_trajectories(old)
    assert isinstance(table, pa.Table)


def test_numpy_values_are_stored_as_plain_numbers(tmp_path):
    import numpy as np

    t = Trajectory(env_id="e", traj_id=0)
    t.append(Turn({"x": np.arange(3, dtype=np.float32)}, np.array([1, 0]), np.float64(0.5), info={"c": np.int64(3)},
                  prompt_ids=np.array([5, 6], dtype=np.int64), action_logprobs=np.array([-0.5])))
    back = read_trajectories(write_dataset(tmp_path / "n.parquet", [t]))[0].turns[0]
    assert back.observation == {"x": [0.0, 1.0, 2.0]} and back.action == [1, 0]
    assert back.info == {"c": 3} and back.prompt_ids == [5, 6] and back.action_logprobs == [-0.5]
