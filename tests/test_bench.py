"""The benchmark orchestration on a toy registered env (fast), and the real quick job on the tiny budget (slow)."""

import json
import os

import pytest

from shopsim.app.bench import BUDGETS, Budget, budget_for, learning_curve, plan, run_bench, sft_checkpoint
from shopsim.app.cli import main
from shopsim.leaderboard.results import find_results
from tests.fixtures.leaderboard_toy import FAMILY, TOY_ID

TABLE = {"quick": {TOY_ID: Budget(references=("expert", "random", "missing_agent"),
                                  algos={"toyalgo": 3, "broken": 2, "not_registered": 1},
                                  tasks=3, seeds=2, tries=4, user_iterations=2)}}


def test_bench_trains_evaluates_and_renders(toy_world, tmp_path):
    out = tmp_path / "bench"
    logs = []
    outcome = run_bench("quick", out, envs=[TOY_ID], table=TABLE, progress=False, log=logs.append,
                        user_algos=["tests.fixtures.leaderboard_toy:ToyAlgo"])
    by_entry = {r["entry"]: r for r in outcome.results}
    # unknown agents / algorithms are left out; the user's class collides with "toyalgo" and gets its path
    assert sorted(by_entry) == ["broken", "expert", "random", "tests.fixtures.leaderboard_toy.ToyAlgo", "toyalgo"]
    assert by_entry["broken"]["status"] == "error" and "always fails" in by_entry["broken"]["error"]
    assert (out / "logs" / "ToyCoin-v0_broken.txt").read_text().count("RuntimeError") >= 1
    assert outcome.exit_code == 0  # a trained entry failing does not fail the run
    trained = by_entry["toyalgo"]
    assert trained["kind"] == "trained" and trained["budget"] == {"mode": "quick", "iterations": 3, "train_seed": 0}
    assert trained["config"] == {"lr": 0.5} and trained["seeds"] == [0, 1] and len(trained["task_ids"]) == 3
    # the learning curve of the primary metric (success_rate, not the loss) from the run's metrics.csv:
    # q = 0.5 -> 0.75, 0.875, 0.9375 at lr 0.5, logged as q * 0.55
    assert trained["curve"]["metric"] == "success_rate" and trained["curve"]["x"] == [0, 1, 2]
    assert trained["curve"]["per_seed"] == [pytest.approx([0.75 * 0.55, 0.875 * 0.55, 0.9375 * 0.55])]
    assert trained["command"] == "shopsim bench --tier quick --envs ToyCoin-v0" and trained["train_seeds"] == [0]
    # q after 3 iterations = 0.9375: between random (0.5) and the expert (1.0)
    sr = {e: by_entry[e]["metrics"]["success_rate"]["mean"] for e in ("expert", "toyalgo", "random")}
    assert sr["expert"] >= sr["toyalgo"] >= sr["random"]
    for name in ("leaderboard.md", "leaderboard.csv", "index.html", "plots/ToyCoin-v0_curves.png"):
        assert (out / name).is_file(), name
    md = outcome.markdown
    assert md.index("| expert |") < md.index("| random |") and "| broken | trained |" in md
    assert any("broken" in line and "error" in line for line in logs)
    assert len(find_results(out / "results")) == 5


def test_bench_exit_code_when_a_reference_fails(toy_world, tmp_path, monkeypatch):
    import agents

    monkeypatch.setitem(agents.registry._REGISTRY, ("random", FAMILY), "tests.fixtures.leaderboard_toy:Nope")
    outcome = run_bench("quick", tmp_path / "b", envs=[TOY_ID], progress=False, log=lambda m: None,
                        table={"quick": {TOY_ID: Budget(tasks=1, seeds=1, tries=1)}})
    assert [r["status"] for r in outcome.results] == ["ok", "error"] and outcome.exit_code == 1


def test_bench_cli_with_user_algo_and_eval_leaderboard_commands(toy_world, tmp_path, capsys, monkeypatch):
    from shopsim.app import bench

    monkeypatch.setitem(bench.BUDGETS["tiny"], FAMILY, Budget(algos={"toyalgo": 1}, tasks=2, seeds=2, tries=4))
    out = tmp_path / "b"
    rc = main(["bench", "--budget", "tiny", "--envs", "ToyCoin-v0", "--out", str(out), "--no-progress",
               "--algo", "tests.fixtures.leaderboard_toy:ToyAlgo"])
    text = capsys.readouterr().out
    assert rc == 0 and "## shopsim/ToyCoin-v0" in text and "| toyalgo | trained |" in text
    res = tmp_path / "r" / "expert.json"
    assert main(["eval", "--env", TOY_ID, "--agent", "expert", "--tasks", "2", "--seeds", "5", "6",
                 "--out", str(res), "--no-progress"]) == 0
    rec = json.loads(res.read_text())
    assert rec["seeds"] == [5, 6] and rec["kind"] == "reference" and rec["episodes"] == 16
    assert main(["leaderboard", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "lb"), "--no-plots"]) == 0
    assert "| expert | reference |" in (tmp_path / "lb" / "leaderboard.md").read_text()
    bad = tmp_path / "r" / "old.json"
    bad.write_text(json.dumps({**rec, "schema_version": 0}))
    capsys.readouterr()
    assert main(["leaderboard", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "lb")]) == 2
    assert "schema_version 0 is older" in capsys.readouterr().err


def test_the_full_tier_trains_every_algorithm_of_each_env():
    """`full` is the tier that ranks every baseline: an algorithm registered for an env but missing from its budget
    would silently have no row."""
    import baselines

    for env, budget in BUDGETS["full"].items():
        if env != "*":
            assert set(budget.algos) == set(baselines.available(env)), env


def test_plan_and_budget_table(tmp_path):
    assert {"quick", "tiny", "full"} <= set(BUDGETS)
    assert budget_for("quick", "shopsim/Replenishment-v0", "inventory").references[0] == "s_S"
    assert budget_for("quick", "shopsim/New-v0", "newfamily") == BUDGETS["quick"]["*"]
    with pytest.raises(Exception, match="unknown benchmark mode"):
        budget_for("huge", "shopsim/Replenishment-v0", "inventory")
    entries = plan("quick", ["shopsim/Shopping-v0"], [], sft=None)
    trained = [e for e in entries if e.kind == "trained"]
    assert trained and all("no SFT checkpoint" in e.skip_reason for e in trained)
    assert sft_checkpoint(tmp_path) is None
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.json").write_text("{}")
    assert sft_checkpoint(tmp_path) == tmp_path / "sft"
    entries = plan("quick", ["shopsim/Shopping-v0"], [], sft=tmp_path / "sft")
    assert [e.name for e in entries if e.kind == "checkpoint"] == ["lm-sft"]
    assert all(e.skip_reason is None for e in entries)


def test_learning_curve_of_runs_without_an_iteration_column(tmp_path):
    """A training log without an ``iteration`` column counts its rows as the x axis (it raised AttributeError:
    ``range`` has no ``astype``)."""
    for seed, values in enumerate(([0.1, 0.2, 0.4], [0.2, 0.3, 0.5])):
        (tmp_path / f"{seed}.csv").write_text("success_rate\n" + "".join(f"{v}\n" for v in values))
    curve = learning_curve([tmp_path / "0.csv", tmp_path / "1.csv"], "shopping")
    assert curve == {"metric": "success_rate", "x": [0, 1, 2], "per_seed": [[0.1, 0.2, 0.4], [0.2, 0.3, 0.5]]}
    (tmp_path / "it.csv").write_text("iteration,success_rate\n0,0.1\n5,0.3\n5,0.35\n")
    assert learning_curve([tmp_path / "it.csv"], "shopping") == {"metric": "success_rate", "x": [0, 5],
                                                                   "per_seed": [[0.1, 0.35]]}


def test_a_shipped_checkpoint_row_records_a_path_every_machine_shares(toy_world, tmp_path):
    """A checkpoint under the shipped data folder is recorded as ``data/...``, not by the absolute path of the
    machine that ran the bench, so its config hash and reproduce command are the same on every machine."""
    from shopsim.app.bench import Entry, run_entry
    from shopsim.leaderboard.protocols import load_protocol
    from shopsim.paths import portable_path
    from tests.fixtures.leaderboard_toy import CoinPolicy

    ckpt = CoinPolicy(q=1.0).save(toy_world / "lm" / "coin")
    rec = run_entry(Entry(TOY_ID, "coin", "checkpoint", checkpoint=ckpt), load_protocol(TOY_ID).limited(tasks=1),
                    tmp_path / "out", budget=TABLE["quick"][TOY_ID], mode="quick", log=lambda _: None)
    assert rec["status"] == "ok" and rec["config"]["checkpoint"] == "data/lm/coin"
    assert portable_path(tmp_path / "mine") == str(tmp_path / "mine")  # a user's own folder stays as given


@pytest.mark.slow
def test_real_quick_bench_end_to_end_on_tiny_budget(tmp_path):
    """The main job, every registered env, on the tiny budget (CI: `pytest -m slow tests/test_bench.py`)."""
    out = tmp_path / "tiny"
    rc = main(["bench", "--budget", "tiny", "--out", str(out), "--no-progress"])
    results = find_results(out / "results")
    refs = [r for r in results if r["kind"] == "reference"]
    assert refs and all(r["status"] == "ok" for r in refs), [(r["entry"], r.get("error")) for r in refs]
    assert rc == 0
    assert (out / "index.html").is_file() and (out / "leaderboard.md").read_text().count("## shopsim/") >= 2
    envs = {r["env_id"] for r in results}
    assert "shopsim/Replenishment-v0" in envs
    if os.environ.get("CI"):
        errors = [(r["env_id"], r["entry"], r["error"]) for r in results if r["status"] == "error"]
        assert not errors, errors


def test_eval_checkpoint_command(toy_world, tmp_path, capsys):
    from tests.fixtures.leaderboard_toy import CoinPolicy

    ckpt = CoinPolicy(q=1.0).save(tmp_path / "ckpt")
    out = tmp_path / "res.json"
    assert main(["eval", "--env", TOY_ID, "--checkpoint", str(ckpt), "--episodes", "8", "--out", str(out),
                 "--no-progress"]) == 0
    rec = json.loads(out.read_text())
    assert rec["kind"] == "checkpoint" and rec["entry"] == "ckpt" and len(rec["task_ids"]) == 2  # 8 // 4 tries
    assert rec["metrics"]["success_rate"]["mean"] > 0.2 and "success_rate" in capsys.readouterr().out
    assert main(["eval", "--env", TOY_ID, "--checkpoint", str(tmp_path), "--out", str(out)]) == 2
    assert "not a shopsim checkpoint" in capsys.readouterr().err


def test_several_training_seeds_give_intervals_over_training_runs(toy_world, tmp_path):
    table = {"quick": {TOY_ID: Budget(references=(), algos={"toyalgo": 2}, tasks=2, seeds=2, tries=4)}}
    outcome = run_bench("quick", tmp_path / "b", envs=[TOY_ID], table=table, progress=False, log=lambda m: None,
                        train_seeds=3, train_seed=10)
    (rec,) = outcome.results
    assert rec["ci_over"] == "train_seeds" and rec["budget"]["train_seeds"] == [10, 11, 12]
    assert rec["metrics"]["success_rate"]["n"] == 3
    assert all((tmp_path / "b" / "runs" / "ToyCoin-v0" / "toyalgo" / f"seed{s}" / "metrics.csv").is_file()
               for s in (10, 11, 12))


def test_bench_is_deterministic(toy_world, tmp_path):
    table = {"quick": {TOY_ID: Budget(algos={"toyalgo": 2}, tasks=2, seeds=2, tries=4)}}
    runs = [run_bench("quick", tmp_path / f"b{i}", envs=[TOY_ID], table=table, progress=False, log=lambda m: None,
                      plots=False) for i in range(2)]
    assert [r["metrics"] for r in runs[0].results] == [r["metrics"] for r in runs[1].results]
    assert [r["config_hash"] for r in runs[0].results] == [r["config_hash"] for r in runs[1].results]


def test_pettingzoo_section_equals_a_hand_loop_over_the_parallel_env(tmp_path, monkeypatch):
    """MultiWarehouse-v0's section: (s, S) per warehouse through the bench (a 2-warehouse scenario) costs exactly
    what a hand loop over parallel_env's reset/step costs, per warehouse and in total."""
    from dataclasses import replace

    import numpy as np

    from agents.inventory_policies import SSPolicyAgent
    from shopsim.envs import RECORDS, env_record
    from shopsim.envs.multi_warehouse import parallel_env
    from shopsim.envs.record import Scenario
    from shopsim.leaderboard.protocols import load_protocol

    kw = {"n_warehouses": 2, "horizon": 30, "warmup": 5}
    mw = env_record("shopsim/MultiWarehouse-v0")
    monkeypatch.setitem(RECORDS, mw.id, replace(mw, scenarios={"two": Scenario(kw)}))
    key = "shopsim/MultiWarehouse-v0:two"
    table = {"quick": {key: Budget(references=("s_S", "random"), tasks=3)}}
    outcome = run_bench("quick", tmp_path / "mw", envs=["MultiWarehouse-v0:two"], table=table, progress=False,
                        log=lambda m: None, plots=False)
    rows = {r["entry"]: r for r in outcome.results}
    assert set(rows) == {"s_S", "random"} and all(r["status"] == "ok" for r in rows.values())
    s_s = rows["s_S"]
    assert s_s["scenario"] == "two" and s_s["env_kwargs"] == kw
    assert (tmp_path / "mw" / "results" / "MultiWarehouse-v0_two" / "s_S.json").is_file()

    protocol = load_protocol(key).limited(tasks=3)
    assert s_s["protocol_hash"] == protocol.hash != load_protocol("shopsim/MultiWarehouse-v0").limited(tasks=3).hash
    per_wh, totals = [], []
    for i, task in enumerate(protocol.task_ids):
        env, agent = parallel_env(**kw), SSPolicyAgent("shopsim/MultiWarehouse-v0")
        obs, infos = env.reset(seed=protocol.episode_seed(protocol.seeds[0], i, 0),
                               options={"split": "test", "task_id": task})
        names = list(env.possible_agents)
        acc = np.zeros(len(names))
        for t in range(kw["horizon"]):
            acts = {a: agent.act_one(w, obs[a], infos[a]) for w, a in enumerate(names)}
            obs, _, _, _, infos = env.step(acts)
            if t >= kw["warmup"]:
                acc += [infos[a]["cost"] for a in names]
        per_wh.append(acc)
        totals.append(acc.sum())
    m = s_s["metrics"]
    assert m["cost"]["mean"] == pytest.approx(np.mean(totals), rel=1e-9)
    for w in range(2):
        assert m[f"cost/warehouse_{w}"]["mean"] == pytest.approx(np.mean([c[w] for c in per_wh]), rel=1e-9)
    assert m["gap_to_s_S_pct"]["mean"] == 0.0 and 0 < m["fill_rate"]["mean"] <= 1
    assert rows["random"]["metrics"]["gap_to_s_S_pct"]["mean"] > 0  # measured against (s, S) on the same episodes
    assert "cost/warehouse_1" in outcome.markdown and "## shopsim/MultiWarehouse-v0:two" in outcome.markdown


def test_scenario_keys_give_their_own_protocol_and_table():
    from shopsim.envs import env_record
    from shopsim.errors import ConfigError
    from shopsim.leaderboard.protocols import load_protocol, scenario_keys

    base, seasonal = load_protocol("shopsim/Replenishment-v0"), load_protocol("shopsim/Replenishment-v0:seasonal")
    assert seasonal.env_kwargs == env_record("shopsim/Replenishment-v0").scenarios["seasonal"].env_kwargs
    assert seasonal.task_ids == base.task_ids and seasonal.hash != base.hash and base.env_kwargs == {}
    assert seasonal.key == "shopsim/Replenishment-v0:seasonal" and base.key == "shopsim/Replenishment-v0"
    assert scenario_keys(["shopsim/Replenishment-v0"]) == ["shopsim/Replenishment-v0",
                                                           "shopsim/Replenishment-v0:seasonal"]
    with pytest.raises(ConfigError, match="no leaderboard scenario 'winter'"):
        load_protocol("shopsim/Replenishment-v0:winter")
    trained = [e for e in plan("standard", ["shopsim/Replenishment-v0:seasonal"], []) if e.kind == "trained"]
    assert {e.name for e in trained} == {"hpo", "ppo"} and all(e.scenario == "seasonal" for e in trained)


def test_reference_agents_are_built_for_the_scenarios_env_options(tmp_path, capsys):
    """TwoStageRetrieval's k20 scenario (the CA-PG card's K = 20): the bench built its reference rows with
    `agents.make(name, env_id)` alone, so the random retriever drew 10 candidates for a 20-candidate env. Every
    reference row of the scenario is valid, and `shopsim eval --agent` builds the agent for its env options too."""
    from shopsim.app.bench import Entry, make_agent, run_entry
    from shopsim.leaderboard.protocols import load_protocol

    key = "shopsim/TwoStageRetrieval-v0:k20"
    protocol = load_protocol(key).limited(tasks=8, seeds=1, tries=1)
    assert protocol.env_kwargs == {"k": 20}
    budget = budget_for("standard", key, "retrieval")
    for ref in budget.references:
        rec = run_entry(Entry(protocol.env_id, ref, "reference", scenario="k20"), protocol, tmp_path / "out",
                        budget=budget, mode="standard", log=lambda _: None)
        assert rec["status"] == "ok", rec.get("error")
        assert rec["metrics"]["invalid_rate"]["mean"] == 0.0, ref
        assert rec["metrics"]["recall"]["mean"] > 0.0, ref
    assert make_agent("random", protocol.env_id, protocol.env_kwargs).sample(3).shape == (3, 20)
    # options an agent's constructor does not take are not passed (the inventory references ignore them)
    assert make_agent("s_S", "shopsim/Replenishment-v0", {"seasonality": 0.7}) is not None
    out = tmp_path / "r.json"
    assert main(["eval", "--env", protocol.env_id, "--agent", "random", "--env-kwargs", '{"k": 20}', "--tasks", "4",
                 "--seeds", "0", "--tries", "1", "--out", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["metrics"]["invalid_rate"]["mean"] == 0.0


def test_the_standard_tier_trains_the_retrieval_baselines_at_the_cards_k():
    """The CA-PG card's claims are at K = 20: the standard tier trains all five estimators on the k20 scenario, at
    the default scenario's budget; the main job only re-checks its shipped rows."""
    from shopsim.envs import env_record

    record = env_record("shopsim/TwoStageRetrieval-v0")
    assert record.scenarios["k20"].env_kwargs == {"k": 20}
    key = "shopsim/TwoStageRetrieval-v0:k20"
    standard = budget_for("standard", key, "retrieval")
    assert standard.algos == dict.fromkeys(("capg", "capg_swr", "vpg", "vpg_swr", "top1"), 300)
    assert standard.algos == record.budgets["standard"].algos and standard.train_seeds == 3
    assert budget_for("quick", key, "retrieval").algos == {}
    trained = [e for e in plan("standard", [key], []) if e.kind == "trained"]
    assert len(trained) == 5 and all(e.scenario == "k20" for e in trained)
