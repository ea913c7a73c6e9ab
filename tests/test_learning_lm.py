"""benchmarks.learning_lm summary: paired gains over the start with 95% t-intervals, per family, atomic files."""

import json
import math
from types import SimpleNamespace

import pytest

from benchmarks.learning_lm import summarise, summary_table, write_results

FAMS = ("find_and_buy", "clarify_and_buy")
START = {"dev": 0.3, "test": 0.2, "test/find_and_buy": 0.4, "test/clarify_and_buy": 0.0}


def _row(algo, seed, it, test, fb, cb):
    return {"algo": algo, "seed": seed, "iteration": it, "dev_success": test + 0.05, "test_success": test,
            "test_success/find_and_buy": fb, "test_success/clarify_and_buy": cb, "rollouts": 64}


def _curves():
    return [{"algo": "start", "seed": -1, "iteration": 0, "dev_success": 0.3, "test_success": 0.2, "rollouts": 0},
            _row("grpo", 0, 1, 0.9, 0.9, 0.9),  # an intermediate evaluation: not the final one
            _row("grpo", 0, 2, 0.30, 0.60, 0.00), _row("grpo", 1, 2, 0.35, 0.60, 0.10),
            _row("grpo", 2, 2, 0.25, 0.50, 0.00),
            _row("mpo", 0, 2, 0.30, 0.60, 0.00), _row("mpo", 1, 2, 0.15, 0.30, 0.00)]


def test_gains_are_paired_differences_with_t_intervals():
    rows = {r["algo"]: r for r in summarise(_curves(), START, 2, FAMS)}
    g = rows["grpo"]["gain_test"]
    assert g["per_seed"] == pytest.approx([0.10, 0.15, 0.05])
    assert g["mean"] == pytest.approx(0.10)
    half = 4.303 * 0.05 / math.sqrt(3)  # t_{0.975, 2} · sample std / √n
    assert g["ci95"] == pytest.approx([0.10 - half, 0.10 + half])
    assert rows["grpo"]["all_seeds_gain"] and not rows["mpo"]["all_seeds_gain"]
    fam = rows["grpo"]["gain_test_family"]
    assert fam["find_and_buy"]["per_seed"] == pytest.approx([0.2, 0.2, 0.1])
    assert fam["clarify_and_buy"]["mean"] == pytest.approx(0.1 / 3)
    assert rows["mpo"]["seeds"] == [0, 1] and rows["mpo"]["gain_test"]["mean"] == pytest.approx(0.025)
    table = "\n".join(summary_table(list(rows.values()), FAMS))
    assert "| grpo | 3 | 64 | 0.20 | 0.30 | +0.10 [" in table and "| yes |" in table and "| no |" in table


def test_write_results_records_the_protocol(tmp_path):
    rows = summarise(_curves(), START, 2, FAMS)
    args = SimpleNamespace(families=list(FAMS), start="weaken", target=0.3, iterations=2, rollouts=32, group_size=8,
                           minibatches=4, lr=1e-4, temperature=0.5, max_new_tokens=48, max_turns=15,
                           eval_episodes=100, seeds=[0, 1, 2], init=None)
    write_results(tmp_path, rows, START, args, 125.0, "python -m benchmarks.learning_lm --iterations 2")
    data = json.loads((tmp_path / "learning_lm.json").read_text())
    assert data["command"].endswith("--iterations 2") and data["seeds"] == [0, 1, 2] and data["wall_s"] == 125.0
    assert data["commit"] and data["protocol"]["families"] == list(FAMS)
    assert [r["algo"] for r in data["rows"]] == ["grpo", "mpo"]
    md = (tmp_path / "learning_lm.md").read_text()
    assert "--iterations 2" in md and "2.1 min" in md and "| mpo | 2 |" in md


@pytest.mark.parametrize(("given", "families"), [
    ("all", ["find_and_buy", "clarify_and_buy", "bundle", "after_sales"]),
    ("bundle,find_and_buy", ["bundle", "find_and_buy"]),
])
def test_families_option(monkeypatch, given, families):
    import benchmarks.learning_lm as lm

    seen = []
    monkeypatch.setattr(lm, "run", lambda a, argv=None: seen.append(a.families))
    lm.main(["--families", given])
    assert seen == [families]
    with pytest.raises(SystemExit):
        lm.main(["--families", "bundle,nope"])
