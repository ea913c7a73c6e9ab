"""The standard tier (resume, shipped results, your algorithm among the shipped rows) and the main job's live check
of the shipped results, on the toy env; and every results file shipped in data/results/standard."""

import json
import shlex
from pathlib import Path

from shopsim.leaderboard.bench import Budget, run_bench, shipped_dir, shipped_results
from tests.fixtures.leaderboard_toy import TOY_ID

STANDARD = {"standard": {TOY_ID: Budget(algos={"toyalgo": 2}, tasks=3, seeds=1, tries=4, train_seeds=2)},
            "quick": {TOY_ID: Budget(tasks=2, seeds=1, tries=4)}}
REPO_DATA = Path(__file__).resolve().parents[1] / "data" / "results" / "standard"


def _ship(tmp_path, logs=None):
    return run_bench("standard", tmp_path / "std", envs=[TOY_ID], table=STANDARD, progress=False, plots=False,
                     log=(logs.append if logs is not None else lambda m: None), results_dir=shipped_dir())


def test_standard_tier_ships_results_and_resumes(toy_world, tmp_path):
    out = _ship(tmp_path)
    ship = shipped_dir()
    assert ship == toy_world / "results" / "standard"
    rec = json.loads((ship / "ToyCoin-v0" / "toyalgo.json").read_text())
    assert rec["command"] == "shopsim bench --tier standard --envs ToyCoin-v0" and rec["tier"] == "standard"
    assert rec["train_seeds"] == [0, 1] and rec["protocol_hash"] and rec["wall_s"] > 0 and rec["git_commit"]
    assert rec["metrics"]["success_rate"]["seeds_over"] == "train_seeds"
    assert len(rec["metrics"]["success_rate"]["per_seed"]) == 2 and rec["curve"]["metric"] == "success_rate"
    assert len(rec["curve"]["per_seed"]) == 2 and rec["curve"]["x"] == [0, 1]
    # the first training seed's checkpoint ships next to the results file
    assert (ship / "ToyCoin-v0" / "toyalgo" / "seed0" / "shopsim_agent.json").is_file()
    before = {p: p.stat().st_mtime_ns for p in ship.rglob("*.json")}
    logs = []
    again = _ship(tmp_path, logs)  # resume: every entry's file exists on the same protocol, nothing runs again
    assert {p: p.stat().st_mtime_ns for p in ship.rglob("*.json")} == before
    assert sum("done before" in m for m in logs) == 3
    assert [r["metrics"] for r in again.results] == [r["metrics"] for r in out.results]


def test_main_job_checks_the_shipped_results_live(toy_world, tmp_path):
    _ship(tmp_path)
    outcome = run_bench("quick", tmp_path / "quick", envs=[TOY_ID], table=STANDARD, progress=False, plots=False,
                        log=lambda m: None)
    checked = {r["entry"]: r for r in outcome.reproduction}
    # the reference agents and the shipped checkpoint of toyalgo, each evaluated again on the quick protocol
    assert sorted(checked) == ["expert", "random", "toyalgo-seed0"]
    assert all(r["reproduces"] for r in checked.values())
    assert "Every shipped result reproduces" in outcome.markdown
    assert "standard tier (shipped results)" in outcome.markdown and "Live rows" in outcome.markdown
    # a shipped number that is off: reported as not reproducing
    path = shipped_dir() / "ToyCoin-v0" / "expert.json"
    rec = json.loads(path.read_text())
    rec["metrics"]["success_rate"].update(mean=0.01, ci95=[0.0, 0.02])
    path.write_text(json.dumps(rec))
    outcome = run_bench("quick", tmp_path / "quick2", envs=[TOY_ID], table=STANDARD, progress=False, plots=False,
                        log=lambda m: None)
    bad = [r["entry"] for r in outcome.reproduction if not r["reproduces"]]
    assert bad == ["expert"] and "do not reproduce" in outcome.markdown


def test_your_algorithm_is_ranked_among_the_shipped_rows(toy_world, tmp_path):
    _ship(tmp_path)
    outcome = run_bench("standard", tmp_path / "mine", envs=[TOY_ID], table=STANDARD, progress=False, plots=False,
                        log=lambda m: None, user_algos=["tests.fixtures.leaderboard_toy:ToyAlgo"])
    assert [r["entry"] for r in outcome.results] == ["tests.fixtures.leaderboard_toy.ToyAlgo"]  # only yours trains
    md = outcome.markdown
    table = md[md.index("## shopsim/ToyCoin-v0"):]
    # one table (same protocol hash): the shipped rows and the new one ranked together
    assert table.count("## shopsim/ToyCoin-v0") == 1
    for entry in ("| expert |", "| toyalgo |", "| tests.fixtures.leaderboard_toy.ToyAlgo |", "| random |"):
        assert entry in table
    mine = next(r for r in outcome.results if r["entry"] == "tests.fixtures.leaderboard_toy.ToyAlgo")
    assert mine["command"].endswith("--algo tests.fixtures.leaderboard_toy:ToyAlgo")
    assert mine["metrics"]["success_rate"]["per_seed"] and mine["budget"]["iterations"] == 10
    # a row measured on other episodes never shares the table
    path = shipped_dir() / "ToyCoin-v0" / "random.json"
    rec = json.loads(path.read_text())
    rec["protocol_hash"] = "0" * 16
    path.write_text(json.dumps(rec))
    md = run_bench("standard", tmp_path / "mine", envs=[TOY_ID], table=STANDARD, progress=False, plots=False,
                   log=lambda m: None, user_algos=["tests.fixtures.leaderboard_toy:ToyAlgo"]).markdown
    assert "## shopsim/ToyCoin-v0 [protocol 2]" in md


def test_every_shipped_result_validates_and_names_a_command_that_exists():
    from shopsim.cli import build_parser
    from shopsim.envs import all_env_ids

    results = shipped_results(REPO_DATA)
    assert results
    parser = build_parser()
    for rec in results:
        assert rec["status"] == "ok" and rec["protocol_hash"] and rec["tier"] == "standard", rec["_path"]
        argv = shlex.split(rec["command"])
        assert argv[0] == "shopsim"
        args = parser.parse_args(argv[1:])  # raises SystemExit on an unknown command or option
        assert args.budget == "standard" and f"shopsim/{args.envs[0]}" == rec["env_id"] in all_env_ids()
        if rec["kind"] == "trained":
            assert len(rec["train_seeds"]) >= 3 and rec["curve"]["metric"] and len(rec["curve"]["per_seed"]) >= 3
    size = sum(p.stat().st_size for p in REPO_DATA.rglob("*") if p.is_file())
    assert size < 8e6, f"shipped results take {size / 1e6:.1f} MB; keep the repository small"


def test_card_claims_are_read_from_results_with_sample_std():
    from benchmarks.repro_standard import claims

    def row(entry, kind, per_seed, ci, family="inventory", metric="cost"):
        return {"entry": entry, "kind": kind, "family": family, "config": {},
                "metrics": {metric: {"mean": sum(per_seed) / len(per_seed), "per_seed": per_seed, "ci95": ci}}}

    inv = {"random": row("random", "reference", [900.0], [850.0, 950.0]),
           "hpo": row("hpo", "trained", [100.0, 110.0, 120.0], [95.0, 125.0]),
           "ppo": row("ppo", "trained", [118.0, 130.0, 142.0], [115.0, 145.0])}
    got = {c["claim"]: c for c in claims({"Replenishment-v0": inv})}
    assert got["hpo beats random on cost"]["verdict"] == "shown"
    hpo_ppo = got["HPO below Gaussian PPO in cost (N = 5 SKUs)"]
    # the intervals overlap (95..125 vs 115..145): not shown, however the means compare
    assert hpo_ppo["verdict"] == "not shown" and hpo_ppo["values"]["sd"] == 10.0  # sample std of 100, 110, 120
    assert hpo_ppo["relative_pct"] == -15.4  # 110 / 130 - 1
    assert got["the HPO-PPO gap grows with N"]["verdict"] == "not measured"
