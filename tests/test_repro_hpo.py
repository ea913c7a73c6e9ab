"""benchmarks/repro_hpo: a training curve continued from its saved state is the curve of one uninterrupted run, and
the state it saves loads with ``weights_only=True`` (tensors and plain containers; the numpy stream's state is in
the JSON record)."""

from __future__ import annotations

import json

import torch

from baselines.hpo import HPO
from benchmarks.repro_hpo import train_curve


def _run(path, iterations):
    algo = HPO(batch_scenarios=2, hidden=(8, 8), eval_scenarios=0)
    key = {"algo": "hpo", "n_skus": 2}
    return train_curve(algo, 2, iterations, 0, 1, [0, 1], path, key)


def test_a_continued_curve_equals_one_uninterrupted_run(tmp_path):
    whole = _run(tmp_path / "a.json", 3)
    _run(tmp_path / "b.json", 1)
    state = torch.load(tmp_path / "b.pt", weights_only=True)
    assert set(state) == {"policy", "value", "opt", "gen"}
    assert "rng" in json.loads((tmp_path / "b.json").read_text())
    resumed = _run(tmp_path / "b.json", 3)
    assert resumed["iterations"] == 3 and len(resumed["curve"]) == 4
    assert [r["per_task"] for r in resumed["curve"]] == [r["per_task"] for r in whole["curve"]]
    assert _run(tmp_path / "b.json", 3)["curve"] == resumed["curve"]  # finished: returned as recorded
