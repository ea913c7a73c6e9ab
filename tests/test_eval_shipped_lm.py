"""benchmarks.eval_shipped_lm: the per-family protocol, resumable cells keyed by the weights, the results table."""

import json
import shutil

import pytest

import benchmarks.eval_shipped_lm as esl
from shopsim.paths import data_dir


def test_cell_protocol_is_the_eval_protocol_of_one_family():
    p = esl.cell_protocol("bundle", 7, 3)
    assert len(p.task_ids) == 7 and p.tries == 3 and p.decoding == "greedy"
    assert p.env_kwargs["family"] == "bundle"
    whole = esl.cell_protocol("bundle", 100, 1)
    assert list(whole.task_ids[:7]) == list(p.task_ids)  # the first tasks of the same split


def test_cells_resume_and_follow_the_weights(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(data_dir() / "lm" / "sft", ckpt)
    calls = []

    def fake(path, family, tasks, tries):
        calls.append((family, tries))
        n = tasks * tries
        return {"family": family, "tasks": tasks, "tries": tries, "seeds": [0], "episodes": n,
                "success": {"mean": 0.5, "ci95": [0.25, 0.75]}, "turns": None, "invalid_rate": None, "wall_s": 1.0}

    monkeypatch.setattr(esl, "evaluate_cell", fake)
    argv = ["--checkpoints", str(ckpt), "--tasks", "3", "--out", str(tmp_path / "out"),
            "--results", str(tmp_path / "res")]
    esl.main(argv)
    # clarify_and_buy's customer varies with the reset seed: it alone gets several tries
    assert sorted(calls) == sorted([("find_and_buy", 1), ("clarify_and_buy", 4), ("bundle", 1), ("after_sales", 1)])
    esl.main(argv)
    assert len(calls) == 4  # every cell reused
    esl.main([*argv, "--tasks", "4"])
    assert len(calls) == 8  # another size is measured again
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\1")  # retrained weights: another digest
    esl.main([*argv, "--tasks", "4"])
    assert len(calls) == 12
    table = (tmp_path / "res" / "shipped_lm.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith(f"| `{ckpt}`"))
    assert row.count("0.50 [0.25, 0.75]") == 4 and "1.4M" in row
    meta = json.loads((tmp_path / "res" / "shipped_lm.json").read_text())
    assert meta["checkpoints"][str(ckpt)]["families"]["clarify_and_buy"]["episodes"] == 16


def test_missing_checkpoint_and_bad_families_are_clear_errors(tmp_path):
    with pytest.raises(SystemExit, match="no LM checkpoint"):
        esl.main(["--checkpoints", str(tmp_path / "nope"), "--results", ""])
    with pytest.raises(SystemExit):
        esl.main(["--families", "bundle,nope"])
