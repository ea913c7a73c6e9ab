"""The standard tier (resume, shipped results, your algorithm among the shipped rows) and the main job's live check
of the shipped results, on the toy env; and every results file shipped in data/results/standard."""

import json
import shlex
from pathlib import Path

from shopsim.app.bench import Budget, run_bench, shipped_dir, shipped_results
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
    from benchmarks.learning_lm import parse_args
    from shopsim.app.bench import budget_for
    from shopsim.app.cli import build_parser
    from shopsim.envs import all_env_ids, family_of
    from shopsim.leaderboard.protocols import load_protocol, record_key

    results = shipped_results(REPO_DATA)
    assert results
    parser = build_parser()
    for rec in results:
        assert rec["status"] == "ok" and rec["protocol_hash"] and rec["tier"] == "standard", rec["_path"]
        argv = shlex.split(rec["command"])
        assert rec["env_id"] in all_env_ids() and load_protocol(record_key(rec)).hash == rec["protocol_hash"]
        budget = budget_for("standard", record_key(rec), family_of(rec["env_id"]))
        if rec["entry"] in budget.imported:  # trained by the learning benchmark, which wrote the file
            assert argv[:3] == ["python", "-m", "benchmarks.learning_lm"], rec["_path"]
            args = parse_args(argv[3:])
            assert rec["entry"] in args.algos and rec["budget"]["iterations"] == args.iterations
            assert rec["budget"]["source"] == "benchmarks.learning_lm" and args.start == "sft"
            assert rec["train_seeds"] == args.seeds
        else:
            assert argv[0] == "shopsim"
            args = parser.parse_args(argv[1:])  # raises SystemExit on an unknown command or option
            # the command names the row's leaderboard key (env id, or env id:scenario), whose protocol it scored on
            assert args.budget == "standard" and f"shopsim/{args.envs[0]}" == record_key(rec)
        if rec["kind"] == "trained":
            assert len(rec["train_seeds"]) >= 3 and rec["curve"]["metric"] and len(rec["curve"]["per_seed"]) >= 3
    files = [p for p in REPO_DATA.rglob("*") if p.is_file()]
    lm = [p for p in files if p.name == "model.safetensors" and (p.parent / "tokenizer.json").is_file()]
    size = sum(p.stat().st_size for p in files if p not in lm)
    assert size < 8e6, f"shipped results take {size / 1e6:.1f} MB without LM weights; keep the repository small"
    # every shipped LM's weights together (data/lm, with the 8.4 MB bfloat16 TrOPD teacher, and the standard tier's
    # Shopping checkpoints): at most 35 MB
    lm_total = sum(p.stat().st_size for p in lm) + sum(
        p.stat().st_size for p in (REPO_DATA.parents[1] / "lm").rglob("*") if p.is_file())
    assert lm_total < 35e6, f"shipped LM checkpoints take {lm_total / 1e6:.1f} MB (limit 35)"
    assert not list(REPO_DATA.rglob("critic.pt")), "a critic is not needed to evaluate a checkpoint; don't ship it"


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


def test_shopping_trainers_are_compared_with_their_sft_start_and_random_at_zero_has_no_ratio():
    from benchmarks.repro_standard import claims

    def row(entry, kind, per_seed, ci):
        return {"entry": entry, "kind": kind, "family": "shopping", "config": {},
                "metrics": {"success_rate": {"mean": sum(per_seed) / len(per_seed), "per_seed": per_seed,
                                             "ci95": ci}}}

    shop = {"random": row("random", "reference", [0.0], [0.0, 0.01]),
            "lm-sft": row("lm-sft", "checkpoint", [0.10], [0.08, 0.13]),
            "grpo": row("grpo", "trained", [0.12, 0.13, 0.11], [0.10, 0.15]),
            "mpo": row("mpo", "trained", [0.20, 0.21, 0.22], [0.17, 0.25])}
    got = {c["claim"]: c for c in claims({"Shopping-v0": shop})}
    assert got["grpo beats random on success_rate"]["verdict"] == "shown"
    assert got["grpo beats random on success_rate"]["relative_pct"] is None  # no percentage of 0
    grpo = got["grpo above its start (lm-sft) on success_rate"]
    assert grpo["verdict"] == "not shown" and grpo["note"] == "every seed above the start: yes"  # 0.10..0.15 overlaps
    mpo = got["mpo above its start (lm-sft) on success_rate"]
    assert mpo["verdict"] == "shown" and mpo["relative_pct"] == 110.0
def test_seasonal_claim_reads_the_paired_gap_to_s_S():
    from benchmarks.repro_standard import claims

    def row(entry, kind, cost, gap=None):
        metrics = {"cost": {"mean": cost[0], "per_seed": cost, "ci95": [cost[0] - 1, cost[0] + 1]}}
        if gap is not None:
            metrics["gap_to_s_S_pct"] = {"mean": gap[0], "ci95": gap[1]}
        return {"entry": entry, "kind": kind, "family": "inventory", "config": {}, "metrics": metrics}

    def verdict(gap):
        rows = {"Replenishment-v0:seasonal": {"s_S": row("s_S", "reference", [100.0]),
                                              "hpo": row("hpo", "trained", [90.0, 95.0, 85.0], gap)}}
        got = [c for c in claims(rows) if c["claim"].startswith("HPO below (s, S)")]
        assert len(got) == 1 and got[0]["env"] == "Replenishment-v0:seasonal"
        return got[0]

    shown = verdict((-10.0, [-14.0, -6.0]))
    assert shown["verdict"] == "shown" and shown["relative_pct"] == -10.0 and shown["values"]["sd"] == 5.0
    assert verdict((-3.0, [-7.0, 1.0]))["verdict"] == "not shown"  # the paired interval reaches 0


def test_main_job_can_leave_shipped_checkpoints_to_the_standard_tier(toy_world, tmp_path):
    import dataclasses

    _ship(tmp_path)
    quick = dataclasses.replace(STANDARD["quick"][TOY_ID], live_checkpoints=())
    outcome = run_bench("quick", tmp_path / "quick", envs=[TOY_ID], table={**STANDARD, "quick": {TOY_ID: quick}},
                        progress=False, plots=False, log=lambda m: None)
    assert sorted(r["entry"] for r in outcome.reproduction) == ["expert", "random"]  # no toyalgo-seed0
    assert "Not re-evaluated here" in outcome.markdown and "ToyCoin-v0 toyalgo" in outcome.markdown


def test_capg_claims_read_the_k20_table_when_the_tier_has_it():
    """The CA-PG card claims CA-PG and TOP1 above V-PG at K = 20: with both TwoStageRetrieval tables shipped, the
    rows read the k20 scenario's (the default K = 10 table only gets its beats-random rows)."""
    from benchmarks.repro_standard import claims

    def row(entry, kind, pv, k):
        return {"entry": entry, "kind": kind, "family": "retrieval", "config": {"env_kwargs": {"k": k} if k else {}},
                "metrics": {"policy_value": {"mean": sum(pv) / len(pv), "per_seed": pv,
                                             "ci95": [min(pv) - 0.01, max(pv) + 0.01]}}}

    def table(k, capg, vpg):
        return {"random": row("random", "reference", [6.0], k), "capg": row("capg", "trained", capg, k),
                "top1": row("top1", "trained", capg, k), "vpg": row("vpg", "trained", vpg, k)}

    k10 = table(None, [7.6, 7.7, 7.65], [7.4, 7.5, 7.7])
    k20 = table(20, [8.1, 8.2, 8.15], [7.5, 7.55, 7.6])
    got = {(c["env"], c["claim"]): c for c in claims({"TwoStageRetrieval-v0": k10, "TwoStageRetrieval-v0:k20": k20})}
    vs = {key: c for key, c in got.items() if "above vpg" in key[1]}
    assert sorted(vs) == [("TwoStageRetrieval-v0:k20", "capg above vpg on policy value (K = 20, the card's setting)"),
                          ("TwoStageRetrieval-v0:k20", "top1 above vpg on policy value (K = 20, the card's setting)")]
    assert all(c["verdict"] == "shown" for c in vs.values())
    assert got[("TwoStageRetrieval-v0", "capg beats random on policy_value")]["verdict"] == "shown"
    only10 = [c for c in claims({"TwoStageRetrieval-v0": k10}) if "above vpg" in c["claim"]]
    assert [c["claim"] for c in only10][0] == "capg above vpg on policy value (K = 10, the card claims it at K = 20)"


def test_rows_trained_elsewhere_are_imported_as_the_tier_trains_its_own(toy_world, tmp_path):
    """`import_trained` (how benchmarks.learning_lm writes the Shopping rows) evaluates finished runs on the tier's
    protocol exactly as the tier evaluates the runs it trains: the same metrics from the same checkpoints, the
    budget the runs were trained under recorded, the first seed's checkpoint shipped, and a second call resumes."""
    import pytest

    from shopsim.app.bench import import_trained
    from shopsim.errors import ConfigError

    _ship(tmp_path)
    trained = json.loads((shipped_dir() / "ToyCoin-v0" / "toyalgo.json").read_text())
    runs = tmp_path / "std" / "runs" / "ToyCoin-v0" / "toyalgo"
    dest = tmp_path / "imported"
    budget = {"mode": "standard", "source": "elsewhere", "iterations": 2}
    rec = import_trained(TOY_ID, "toyalgo", [runs / "seed0", runs / "seed1"], dest, budget=budget,
                         command="python -m elsewhere", keep_checkpoint=True, table=STANDARD)
    assert rec["metrics"] == trained["metrics"] and rec["curve"] == trained["curve"]
    assert rec["budget"] == budget and rec["command"] == "python -m elsewhere" and rec["train_seeds"] == [0, 1]
    assert rec["protocol_hash"] == trained["protocol_hash"] and rec["kind"] == "trained"
    assert (dest / "ToyCoin-v0" / "toyalgo" / "seed0" / "shopsim_agent.json").is_file()
    path = dest / "ToyCoin-v0" / "toyalgo.json"
    before = path.stat().st_mtime_ns
    import_trained(TOY_ID, "toyalgo", [runs / "seed0", runs / "seed1"], dest, budget=budget, command="x",
                   table=STANDARD)
    assert path.stat().st_mtime_ns == before  # same protocol and budget: kept
    again = import_trained(TOY_ID, "toyalgo", [runs / "seed0"], dest, budget={**budget, "iterations": 3},
                           command="x", table=STANDARD)
    assert again["budget"]["iterations"] == 3 and len(again["metrics"]["success_rate"].get("per_seed", [])) != 2
    with pytest.raises(ConfigError, match="no checkpoint"):
        import_trained(TOY_ID, "toyalgo", [tmp_path / "nowhere"], dest, budget=budget, command="x", table=STANDARD)


def test_imported_rows_are_rendered_as_recorded_and_never_trained(toy_world, tmp_path):
    """A budget's `imported` rows (the Shopping rows, trained by benchmarks.learning_lm) are shown from the file
    `import_trained` wrote, with the command that made it; the tier trains none of them, and says which command
    writes a missing one."""
    from shopsim.app.bench import import_trained

    _ship(tmp_path)
    runs = tmp_path / "std" / "runs" / "ToyCoin-v0" / "toyalgo"
    rec = import_trained(TOY_ID, "toyalgo", [runs / "seed0", runs / "seed1"], shipped_dir(),
                         budget={"mode": "standard", "source": "elsewhere", "iterations": 2},
                         command="python -m elsewhere", table=STANDARD)
    table = {"standard": {TOY_ID: Budget(imported=("toyalgo",), imported_by="python -m elsewhere", tasks=3, seeds=1,
                                         tries=4)}}
    logs = []
    out = run_bench("standard", tmp_path / "std2", envs=[TOY_ID], table=table, progress=False, plots=False,
                    log=logs.append, results_dir=shipped_dir())
    shown = {r["entry"]: r for r in out.results}
    assert shown["toyalgo"]["command"] == "python -m elsewhere" and shown["toyalgo"]["metrics"] == rec["metrics"]
    assert "| toyalgo |" in out.markdown
    assert not (tmp_path / "std2" / "runs").exists()  # nothing trained
    assert any("toyalgo: recorded by `python -m elsewhere`" in m for m in logs)
    (shipped_dir() / "ToyCoin-v0" / "toyalgo.json").unlink()
    logs.clear()
    out = run_bench("standard", tmp_path / "std3", envs=[TOY_ID], table=table, progress=False, plots=False,
                    log=logs.append, results_dir=shipped_dir())
    assert "toyalgo" not in {r["entry"] for r in out.results} and not (tmp_path / "std3" / "runs").exists()
    assert any("`python -m elsewhere` trains it" in m for m in logs)


def test_shopping_standard_rows_are_exactly_the_learning_tables_algorithms():
    """The Shopping standard budget imports every algorithm `benchmarks.learning_lm` writes a standard row for, and
    trains none itself: a row added to one list and not the other would never be written or never be shown."""
    from benchmarks.learning_lm import ALGOS
    from shopsim.app.bench import budget_for

    b = budget_for("standard", "shopsim/Shopping-v0", "shopping")
    assert sorted(b.imported) == sorted(ALGOS) and not b.algos and b.imported_by == "make learning-record"
    make = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "learning-record:" in make and "--standard-results data/results/standard" in make
