"""The split manifests are read in one module (`shopsim.splits`): one cached reader, clear errors, task ids."""

import json

import numpy as np
import pytest

from shopsim import splits
from shopsim.envs.proactive_rec.env import load_split as rec_split
from shopsim.envs.replenishment import load_split as inv_split
from shopsim.envs.shopping import FAMILIES
from shopsim.envs.two_stage_retrieval import load_splits as ret_splits
from shopsim.errors import DatasetError
from shopsim.leaderboard.protocols import load_protocol

SHOP = "shopsim/Shopping-v0"


def test_every_reader_shares_the_one_cached_manifest():
    # the envs' helpers and the leaderboard go through shopsim.splits: the same object, read once
    assert inv_split() is splits.load_splits("shopsim/Replenishment-v0")
    assert rec_split() is splits.load_splits("shopsim/ProactiveRec-v0")
    assert ret_splits() is splits.load_splits("shopsim/TwoStageRetrieval-v0")
    assert load_protocol("shopsim/Replenishment-v0", sized=False).task_ids == tuple(inv_split()["test"])


def _write(root, name, spec):
    (root / "splits").mkdir(exist_ok=True)
    path = root / "splits" / f"{name}.json"
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return path


def test_a_rewritten_manifest_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOPSIM_DATA_DIR", str(tmp_path))
    _write(tmp_path, "Toy-v0", {"train": {"range": [0, 10]}, "dev": [1, 2], "test": [3]})
    first = splits.load_splits("shopsim/Toy-v0")
    assert splits.load_splits("Toy-v0") is first  # cached, whichever spelling of the id
    _write(tmp_path, "Toy-v0", {"train": {"range": [0, 10]}, "dev": [1, 2], "test": [3, 4, 5, 6]})
    assert splits.load_splits("shopsim/Toy-v0")["test"] == [3, 4, 5, 6]


def test_missing_and_malformed_manifests_name_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOPSIM_DATA_DIR", str(tmp_path))
    assert not splits.has_splits("shopsim/Toy-v0")
    with pytest.raises(DatasetError, match=r"split manifest .*Toy-v0\.json for shopsim/Toy-v0 is missing"):
        splits.load_splits("shopsim/Toy-v0")
    assert splits.eval_tasks("shopsim/Toy-v0", "dev", 3) is None  # trainers fall back to the env's own draw
    _write(tmp_path, "Toy-v0", "{not json")
    with pytest.raises(DatasetError, match=r"Toy-v0\.json is not valid JSON"):
        splits.load_splits("shopsim/Toy-v0")
    _write(tmp_path, "Toy-v0", "[1, 2]")
    with pytest.raises(DatasetError, match="must hold a JSON object"):
        splits.load_splits("shopsim/Toy-v0")


def test_eval_tasks_are_the_first_ids_with_families_interleaved():
    dev = splits.load_splits(SHOP)["dev"]
    assert splits.eval_tasks(SHOP, "dev", 5) == dev[:5]
    fams = (FAMILIES[1], FAMILIES[0])
    ids = splits.eval_tasks(SHOP, "dev", 6, families=fams)
    # Shopping-v0's default mix: family = FAMILIES[task_id % len(FAMILIES)]
    assert [FAMILIES[t % len(FAMILIES)] for t in ids] == [fams[0], fams[1]] * 3
    for fam in fams:  # each family's first dev ids, in order
        assert [t for t in ids if FAMILIES[t % len(FAMILIES)] == fam] == \
            [t for t in dev if FAMILIES[t % len(FAMILIES)] == fam][:3]


def test_sample_tasks_draw_train_ids_in_the_families_with_the_callers_rng():
    lo, hi = splits.load_splits(SHOP)["train"]["range"]
    a = splits.sample_tasks(SHOP, "train", np.random.default_rng(3), 20, families=(FAMILIES[2],))
    b = splits.sample_tasks(SHOP, "train", np.random.default_rng(3), 20, families=(FAMILIES[2],))
    assert a == b and len(a) == 20
    assert all(lo <= t < hi and FAMILIES[t % len(FAMILIES)] == FAMILIES[2] for t in a)
    assert splits.sample_tasks(SHOP, "nope", np.random.default_rng(0), 3) is None
