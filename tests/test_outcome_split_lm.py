"""`benchmarks.outcome_split_lm`: the episode-by-episode comparison of a run with its start."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from benchmarks import outcome_split_lm as osl


def _turn(action, **info):
    return SimpleNamespace(action=action, info=info)


def _traj(success, actions, family="bundle", **info):
    turns = [_turn(a) for a in actions]
    turns[-1].info = info
    return SimpleNamespace(success=success, turns=turns, meta={"family": family})


def test_failure_kinds_read_the_envs_end_reason_and_reward_parts():
    assert osl.failure_kind(_traj(True, ["a"])) is None
    assert osl.failure_kind(_traj(False, ["a"], end_reason="checkout",
                                  reward_parts={"budget_ok": 0.0, "mean_item_score": 1.0})) == "over_budget"
    assert osl.failure_kind(_traj(False, ["a"], end_reason="checkout",
                                  reward_parts={"budget_ok": 1.0, "mean_item_score": 0.5})) == "wrong_item"
    assert osl.failure_kind(_traj(False, ["a"], end_reason="buy", reward_parts={"price_ok": 0.0})) == "over_budget"
    assert osl.failure_kind(_traj(False, ["a"], end_reason="buy",
                                  reward_parts={"price_ok": 1.0, "options_matched": 1.0})) == "wrong_item"
    assert osl.failure_kind(_traj(False, ["a"], end_reason="too_many_invalid")) == "too_many_invalid"


def test_compare_counts_gains_losses_and_the_first_differing_action():
    start = [_traj(True, ["s", "b", "c"]), _traj(False, ["s", "x"], end_reason="turn_limit"),
             _traj(True, ["s", "b"], family="find_and_buy"), _traj(False, ["s"], family="find_and_buy",
                                                                    end_reason="buy")]
    run = [_traj(False, ["s", "b", "d"], end_reason="too_many_invalid"), _traj(True, ["s", "y", "z"]),
           _traj(True, ["s", "b"], family="find_and_buy"), _traj(False, ["s", "t"], family="find_and_buy",
                                                                  end_reason="turn_limit")]
    out = osl.compare(start, run)
    o = out["overall"]
    assert (o["identical"], o["gained"], o["lost"], o["start_success"], o["run_success"]) == (1, 1, 1, 2, 2)
    e = out["episodes"]
    assert (e[0]["first_diff_turn"], e[0]["start_action"], e[0]["run_action"]) == (2, "c", "d")
    assert (e[1]["first_diff_turn"], e[1]["start_action"], e[1]["run_action"]) == (1, "x", "y")
    assert e[2]["first_diff_turn"] is None
    assert (e[3]["first_diff_turn"], e[3]["start_action"], e[3]["run_action"]) == (1, None, "t")
    assert out["per_family"]["bundle"]["start_failures"] == {"turn_limit": 1}
    assert out["per_family"]["find_and_buy"]["run_failures"] == {"turn_limit": 1}


def test_a_perturbed_shipped_agent_against_the_shipped_one(tmp_path):
    """The same weights play every episode identically; perturbed weights change some, and gained − lost is the
    change in successes. The table names every changed episode."""
    from agents.lm.agent import LMAgent, default_checkpoint_dir

    agent = LMAgent(checkpoint=default_checkpoint_dir())
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in agent.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02 * p.abs().mean())
    agent.save(tmp_path / "noisy")
    same = osl.run(osl_args(default_checkpoint_dir()))
    assert same["overall"]["identical"] == 8 and same["overall"]["gained"] == same["overall"]["lost"] == 0
    res = osl.run(osl_args(tmp_path / "noisy"))
    o = res["overall"]
    assert o["identical"] < 8
    assert o["gained"] - o["lost"] == o["run_success"] - o["start_success"]
    assert o["start_success"] == same["overall"]["start_success"]
    osl.write_table(res, tmp_path / "res")
    md = (tmp_path / "res" / "outcome_split_lm.md").read_text()
    changed = [e for e in res["episodes"] if e["start"] != e["run"]]
    rows = [ln for ln in md.splitlines() if ln.split(" | ")[0].lstrip("| ").isdigit()]
    assert changed and len(rows) == len(changed)
    assert all(f"| {e['episode']} | {e['family']} | {e['first_diff_turn']} |" in md for e in changed)
    assert json.loads((tmp_path / "res" / "outcome_split_lm.json").read_text())["overall"] == o


def osl_args(run):
    return SimpleNamespace(run=str(run), start=None, eval_episodes=8, max_turns=40, max_new_tokens=48, num_envs=8,
                           threads=1, argv=["--run", str(run)])
