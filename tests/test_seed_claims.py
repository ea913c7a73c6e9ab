"""The verdict table of the seed papers' claims (benchmarks/seed_claims.py): its decision rules, and that the
committed table is what the script writes from the committed results files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import seed_claims as sc

ROOT = Path(__file__).resolve().parents[1]


def test_t_interval_matches_the_textbook_value():
    lo, hi = sc.t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, n 3: half-width 4.303 / sqrt(3)
    assert math.isclose(hi - 2.0, 4.303 / math.sqrt(3), rel_tol=1e-9) and math.isclose(lo + hi, 4.0)
    assert all(math.isnan(v) for v in sc.t_interval([1.0]))


def test_paired_rule_shows_a_consistent_difference_and_not_a_noisy_or_wrong_sided_one():
    assert sc.decide_paired([0.9, 1.0, 1.1], "higher")["verdict"] == sc.SHOWN
    assert sc.decide_paired([-0.9, -1.0, -1.1], "lower")["verdict"] == sc.SHOWN
    assert sc.decide_paired([1.0, -0.5, 0.8], "higher")["verdict"] == sc.NOT_SHOWN  # the interval spans 0
    assert sc.decide_paired([0.9, 1.0, 1.1], "lower")["verdict"] == sc.NOT_SHOWN  # consistent, but the wrong side
    assert sc.decide_paired([0.9, float("inf"), 1.1], "higher")["verdict"] == sc.NOT_SHOWN  # a seed without a figure
    assert sc.decide_paired([1.0], "higher")["verdict"] == sc.NOT_SHOWN  # one seed decides nothing


def test_every_seed_rule():
    assert sc.decide_every([True, True, True])["verdict"] == sc.SHOWN
    assert sc.decide_every([True, False, True]) == {"holds": "2/3", "verdict": sc.NOT_SHOWN}
    assert sc.decide_every([])["verdict"] == sc.NOT_SHOWN


def _spec(source: str, diffs: list[float]) -> sc.ClaimSpec:
    return sc.ClaimSpec("P", "algo", "a claim", source, "ref", "paired_t",
                        lambda res: {"seeds": [0, 1, 2], "figure": res["x"], "reference": [0, 0, 0], "diff": res["x"]})


def test_a_row_reads_its_source_and_a_missing_source_is_not_measured(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"x": [2.0, 2.1, 1.9]}))
    row = sc.decide(_spec("r.json", []), tmp_path)
    assert row["verdict"] == sc.SHOWN and row["figure"] == [2.0, 2.1, 1.9] and row["seeds"] == [0, 1, 2]
    assert sc.decide(_spec("absent.json", []), tmp_path)["verdict"] == sc.NOT_MEASURED


def test_the_committed_table_is_what_the_script_writes_from_the_committed_results():
    committed = json.loads((ROOT / "docs/results/seed_claims.json").read_text())
    fresh = json.loads(json.dumps(sc.build(ROOT / "docs" / "results")))
    assert fresh["rows"] == committed["rows"]
    assert fresh["sources"] == committed["sources"]
    for r in committed["rows"]:  # every row whose results are recorded is decided; the others say what is missing
        recorded = sc.source_path(r["source"], ROOT / "docs" / "results").is_file()
        assert r["verdict"] in ((sc.SHOWN, sc.NOT_SHOWN) if recorded else (sc.NOT_MEASURED,))
        assert recorded or "is missing" in r["note"]
    md = (ROOT / "docs/results/seed_claims.md").read_text()
    assert md == sc.to_markdown(committed)


def test_a_row_against_another_leaderboard_row_reads_both_files_paired_by_training_seed(tmp_path):
    """The standard tier's CA-PG rows compare two results files (capg.json against vpg.json of the K = 20 table),
    paired by training seed; a missing reference file leaves the row not measured."""

    def row(pv: list[float]) -> dict:
        return {"budget": {"iterations": 300, "train_seeds": [0, 1, 2]}, "config": {"env_kwargs": {"k": 20}},
                "command": "shopsim bench", "metrics": {"policy_value": {"per_seed": pv, "tasks": 4000}}}

    (tmp_path / "a.json").write_text(json.dumps(row([8.0, 8.1, 8.2])))
    spec = sc.ClaimSpec("P", "capg", "a claim", "a.json", "vpg", "paired_t", sc._std_paired("policy_value"),
                        reference_source="b.json")
    assert sc.decide(spec, tmp_path)["verdict"] == sc.NOT_MEASURED
    (tmp_path / "b.json").write_text(json.dumps(row([7.0, 7.2, 7.1])))
    got = sc.decide(spec, tmp_path)
    assert got["verdict"] == sc.SHOWN and got["reference_figure"] == [7.0, 7.2, 7.1] and got["seeds"] == [0, 1, 2]
    assert got["reference_source"] == "b.json" and "K = 20" in got["note"]
    assert [s.reference_source for s in sc.SPECS if s.algorithm in ("capg", "top1") and s.reference_source] == [
        f"{sc.CAPG_STD}/vpg.json"] * 2


def test_lm_claims_read_the_learning_table_paired_by_seed(tmp_path):
    """MPO's bundle claim against PPO, from the learning benchmark's rows (per-seed gains, paired by seed index); an
    algorithm the table has not recorded yet leaves its claims not measured."""

    def row(algo, seeds, overall, bundle):
        return {"algo": algo, "seeds": seeds, "gain_test": {"per_seed": overall},
                "gain_test_family": {"bundle": {"per_seed": bundle}}}

    res = {"protocol": {"iterations": 16, "rollouts": 256, "eval_episodes": 400},
           "rows": [row("mpo", [0, 1, 2], [0.02, 0.03, 0.01], [0.10, 0.12, 0.08]),
                    row("ppo", [0, 1, 2, 3], [0.03, 0.01, 0.02, 0.5], [0.01, 0.02, 0.00, 0.5])]}
    (tmp_path / sc.LEARNING).write_text(json.dumps(res))
    by_claim = {(s.algorithm, s.reference, s.unit): s for s in sc.SPECS if s.source == sc.LEARNING}
    bundle = sc.decide(by_claim[("mpo", "ppo (same seed)", "test gain (bundle)")], tmp_path)
    assert bundle["seeds"] == [0, 1, 2] and bundle["figure"] == [0.10, 0.12, 0.08]
    assert bundle["reference_figure"] == [0.01, 0.02, 0.00] and bundle["verdict"] == sc.SHOWN
    assert bundle["start"] == "sft" and "16 iterations × 256 rollouts" in bundle["note"]
    overall = sc.decide(by_claim[("mpo", "ppo (same seed)", "test gain")], tmp_path)
    assert overall["diff"] == pytest.approx([-0.01, 0.02, -0.01]) and overall["verdict"] == sc.NOT_SHOWN
    vapo = sc.decide(by_claim[("mpo", "vapo (same seed)", "test gain (bundle)")], tmp_path)
    assert vapo["verdict"] == sc.NOT_MEASURED and "vapo" in vapo["note"]


def test_arm_claims_read_late_gains_and_report_the_asked_share(tmp_path):
    """DelTA's plateau claim reads the runs' change over their last evaluation interval; ARC's rows give each arm's
    share of test episodes that asked the customer; a row without the figure leaves the claim not measured."""
    def row(algo, gains, late=None, asked=None):
        r = {"algo": algo, "seeds": [0, 1, 2], "gain_test": {"per_seed": gains},
             "gain_test_family": {"clarify_and_buy": {"per_seed": gains}}}
        if late is not None:
            r["late_gain_test"] = {"per_seed": late}
        if asked is not None:
            r["asked_test"] = {"mean": asked}
            r["asked_test_family"] = {"clarify_and_buy": {"per_seed": [asked - 0.01, asked, asked + 0.01]}}
        return r

    res = {"protocol": {"iterations": 16, "rollouts": 256, "eval_episodes": 400},
           "rows": [row("delta", [0.05, 0.06, 0.04], late=[0.02, 0.03, 0.025]),
                    row("dapo-nods", [0.03, 0.02, 0.04], late=[0.0, 0.0, 0.005]),
                    row("arc-bias", [0.02, 0.03, 0.025], asked=0.31), row("grpo-bias", [0.0, 0.01, -0.01], asked=0.24),
                    row("arc-bias-noent", [0.0, 0.0, 0.0])]}
    (tmp_path / sc.LEARNING).write_text(json.dumps(res))
    specs = {(s.algorithm, s.reference, s.unit): s for s in sc.SPECS if s.source == sc.LEARNING}
    late = sc.decide(specs[("delta", "dapo-nods (same seed)", "late test gain")], tmp_path)
    assert late["diff"] == pytest.approx([0.02, 0.03, 0.02]) and late["verdict"] == sc.SHOWN
    assert "last evaluation interval" in late["note"]
    arc = sc.decide(specs[("arc-bias", "grpo-bias (same seed)", "test gain (clarify_and_buy)")], tmp_path)
    assert "arc-bias 0.310, grpo-bias 0.240" in arc["note"] and arc["verdict"] == sc.SHOWN
    assert sc.decide(specs[("arc-bias", "arc-bias-noent (same seed)", "test gain")], tmp_path)["verdict"] == sc.SHOWN
    asks = sc.decide(specs[("arc-bias", "grpo-bias (same seed)", "asked share (clarify_and_buy)")], tmp_path)
    assert asks["figure"] == pytest.approx([0.30, 0.31, 0.32]) and asks["diff"] == pytest.approx([0.07] * 3)
    assert asks["verdict"] == sc.SHOWN and "asked the customer" in asks["note"]
    res["rows"][2].pop("asked_test_family")
    (tmp_path / sc.LEARNING).write_text(json.dumps(res))
    none = sc.decide(specs[("arc-bias", "grpo-bias (same seed)", "asked share (clarify_and_buy)")], tmp_path)
    assert none["verdict"] == sc.NOT_MEASURED and "asked_test for clarify_and_buy" in none["note"]
    res["rows"][1].pop("late_gain_test")
    (tmp_path / sc.LEARNING).write_text(json.dumps(res))
    gone = sc.decide(specs[("delta", "dapo-nods (same seed)", "late test gain")], tmp_path)
    assert gone["verdict"] == sc.NOT_MEASURED and "late_gain_test" in gone["note"]


def test_each_papers_claims_are_one_section():
    papers = [s.paper for s in sc.SPECS]
    assert all(papers.index(p) + papers.count(p) - 1 == len(papers) - 1 - papers[::-1].index(p) for p in papers)
    arms = {s.algorithm for s in sc.SPECS if s.source == sc.LEARNING} | {
        s.reference.split(" ")[0] for s in sc.SPECS if s.source == sc.LEARNING}
    from benchmarks.learning_lm import ARMS

    assert arms <= set(ARMS)  # every arm a claim reads is one the learning benchmark can train
