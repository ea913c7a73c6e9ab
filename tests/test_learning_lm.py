"""benchmarks.learning_lm summary: paired gains over the start with 95% t-intervals, per family, atomic files."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import baselines
from benchmarks.learning_lm import compare_rows, summarise, summary_table, targets, versus_reference, write_results
from shopsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

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


@pytest.mark.parametrize(("start", "stem"), [("sft", "learning_lm"), ("weaken", "learning_lm_weaken")])
def test_write_results_records_the_protocol(tmp_path, start, stem):
    rows = summarise(_curves(), START, 2, FAMS)
    args = SimpleNamespace(families=list(FAMS), start=start, target=0.3, iterations=2, rollouts=32, group_size=8,
                           minibatches=4, lr=1e-4, temperature=0.5, max_new_tokens=48, max_turns=15,
                           eval_episodes=100, seeds=[0, 1, 2], init=None)
    write_results(tmp_path, rows, START, args, 125.0, "python -m benchmarks.learning_lm --iterations 2")
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["protocol"]["start"] == start
    assert data["command"].endswith("--iterations 2") and data["seeds"] == [0, 1, 2] and data["wall_s"] == 125.0
    assert data["commit"] and data["protocol"]["families"] == list(FAMS)
    assert [r["algo"] for r in data["rows"]] == ["grpo", "mpo"]
    md = (tmp_path / f"{stem}.md").read_text()
    assert f"start: `{start}`" in md
    assert "--iterations 2" in md and "2.1 min" in md and "| mpo | 2 |" in md


def _three_algos():
    """grpo gains +0.10 +0.15 +0.05; mpo +0.10 -0.05 (seeds 0, 1); dapo -0.20 -0.16 -0.14."""
    return _curves() + [_row("dapo", 0, 2, 0.00, 0.2, 0.0), _row("dapo", 1, 2, 0.04, 0.2, 0.0),
                        _row("dapo", 2, 2, 0.06, 0.2, 0.0)]


def test_algorithm_pairs_are_decided_seed_by_seed():
    rows = summarise(_three_algos(), START, 2, FAMS)
    pairs = {(p["a"], p["b"]): p for p in compare_rows(rows)}
    assert set(pairs) == {("grpo", "mpo"), ("grpo", "dapo"), ("mpo", "dapo")}
    gd = pairs[("grpo", "dapo")]
    assert gd["seeds"] == [0, 1, 2] and gd["diff"]["per_seed"] == pytest.approx([0.30, 0.31, 0.19])
    half = 4.303 * float(np.std([0.30, 0.31, 0.19], ddof=1)) / math.sqrt(3)
    assert gd["diff"]["ci95"] == pytest.approx([0.80 / 3 - half, 0.80 / 3 + half])
    assert gd["separated"] and gd["better"] == "grpo"
    gm = pairs[("grpo", "mpo")]  # seeds 0 and 1 only: differences 0.0 and 0.2, t(1) = 12.7 spans 0
    assert gm["seeds"] == [0, 1] and gm["diff"]["mean"] == pytest.approx(0.1) and not gm["separated"]
    assert gm["better"] is None
    assert versus_reference(list(pairs.values())) == {"beat": [], "lose": ["dapo"], "indistinguishable": ["mpo"]}


def test_targets_of_the_table_of_record():
    checks = {t["target"]: t for t in targets(summarise(_three_algos(), START, 2, FAMS))}
    assert checks["grpo test gain ≥ +0.05"]["met"] and checks["grpo test gain ≥ +0.05"]["value"] == pytest.approx(0.1)
    assert checks["every grpo seed gains"]["met"]
    assert not checks["grpo's 95% interval above 0"]["met"]  # 0.10 ± 0.124
    assert not checks["grpo bundle gain ≥ +0.08"]["met"] and checks["grpo bundle gain ≥ +0.08"]["value"] is None
    few = checks["every algorithm has 3 seeds"]
    assert not few["met"] and few["value"][0] == "mpo (2)" and "reinforce (0)" in few["value"]
    assert "grpo (3)" not in few["value"] and "dapo (3)" not in few["value"]


def test_report_only_rerenders_the_recorded_tables(tmp_path, monkeypatch):
    """`--report-only --results DIR` rebuilds both starts' tables from DIR's own files: the same bytes as the
    measuring invocation wrote, its command, commit and wall time kept, whatever the other options say."""
    import benchmarks.learning_lm as lm

    curves = _three_algos()
    for start in ("sft", "weaken"):
        args = SimpleNamespace(families=list(FAMS), start=start, target=0.3, iterations=2, rollouts=32, group_size=8,
                               minibatches=4, lr=1e-4, temperature=0.5, max_new_tokens=48, max_turns=15,
                               eval_episodes=100, seeds=[0, 1, 2], init=None, top_p=0.8)
        write_results(tmp_path, summarise(curves, START, 2, FAMS), START, args, 125.0,
                      f"python -m benchmarks.learning_lm --start {start}", curves=curves, digest="abc")
    names = ["learning_lm.md", "learning_lm.json", "learning_lm_weaken.md", "learning_lm_weaken.json"]
    before = {n: (tmp_path / n).read_bytes() for n in names}
    md = before["learning_lm.md"].decode()
    assert "**1 of 3 pairs are separated**" in md and "- lose to grpo: dapo" in md and "top-p 0.8" in md
    assert "| grpo's 95% interval above 0 |" in md
    assert "## Targets" not in before["learning_lm_weaken.md"].decode()  # the targets are the table of record's
    for n in ("learning_lm.md", "learning_lm_weaken.md"):
        (tmp_path / n).unlink()
    monkeypatch.setattr(lm, "run", lambda *a, **k: pytest.fail("report-only must not train or evaluate"))
    monkeypatch.setattr(lm, "git_commit", lambda: "another-commit")
    assert lm.main(["--report-only", "--results", str(tmp_path), "--iterations", "7"]) == 0
    assert {n: (tmp_path / n).read_bytes() for n in names} == before
    (tmp_path / "learning_lm.md").unlink()
    lm.main(["--report-only", "--results", str(tmp_path), "--start", "sft"])
    assert (tmp_path / "learning_lm.md").read_bytes() == before["learning_lm.md"]
    with pytest.raises(SystemExit, match="no recorded tables"):
        lm.main(["--report-only", "--results", str(tmp_path / "empty")])


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


def _args(tmp_path, **over):
    from benchmarks.learning_lm import main

    seen = {}

    def capture(a, argv=None):
        seen["a"] = a

    import benchmarks.learning_lm as lm

    real = lm.run
    lm.run = capture
    try:
        main(["--iterations", "2", "--families", ",".join(FAMS), "--out", str(tmp_path / "out"),
              "--results", str(tmp_path / "results"), "--init", str(tmp_path / "init"), "--algos", "grpo", "mpo",
              "--seeds", "0", "1", "--start", "weaken"])
    finally:
        lm.run = real
    for k, v in over.items():
        setattr(seen["a"], k, v)
    return seen["a"]


def test_runs_recorded_in_the_results_folder_are_reused_under_the_same_protocol_and_start(tmp_path, monkeypatch):
    """A second invocation that lost OUT (another machine, a cleaned runs/) trains only the runs the results
    folder does not record, and its table still has every run; another protocol, other start weights or a start
    that evaluates differently reuse nothing."""
    import benchmarks.learning_lm as lm

    (tmp_path / "init").mkdir()
    (tmp_path / "init" / "config.json").write_text("{}")
    (tmp_path / "init" / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(lm, "weaken", lambda *a, **k: {"alpha": 0.5, "calib_success": 0.3, "sft_success": 0.8,
                                                      "families": list(FAMS), "start": "weaken"})
    trained = []

    def fake_train(job):
        name, seed, args, env_kwargs, out, parent = job
        trained.append((name, seed))
        d = out / name / f"seed{seed}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "run.json").write_text(json.dumps({"config": lm._algo(name, args, env_kwargs).run_identity(lm.ENV, seed)
                                                ["config"]}))
        test = 0.3 + 0.1 * seed + (0.05 if name == "grpo" else 0.0)
        (d / "metrics.csv").write_text(
            "iteration,rollouts,rollout_s,update_s,dev_success,test_success,test_success/find_and_buy,"
            "test_success/clarify_and_buy\n1,32,2.0,1.0,,,,\n"
            f"2,32,2.0,1.0,0.4,{test},{test},{test}\n")
        return name, seed, [{"test_success": test, "dev_success": 0.4, "rollouts": 32}], 6.0

    monkeypatch.setattr(lm, "_train_one", fake_train)

    def invoke(args):
        (args_out := tmp_path / "out" / "start").mkdir(parents=True, exist_ok=True)
        (args_out / f"eval-{args.eval_episodes}.json").write_text(json.dumps(START))
        lm.run(args, ["--test"])

    invoke(_args(tmp_path, seeds=[0]))
    assert trained == [("grpo", 0), ("mpo", 0)]
    import shutil

    shutil.rmtree(tmp_path / "out")
    invoke(_args(tmp_path))
    assert trained[2:] == [("grpo", 1), ("mpo", 1)]  # seed 0 came from the results folder
    data = json.loads((tmp_path / "results" / "learning_lm_weaken.json").read_text())
    assert {r["algo"]: r["seeds"] for r in data["rows"]} == {"grpo": [0, 1], "mpo": [0, 1]}
    assert data["train_s_total"] == pytest.approx(4 * 6.0)
    grpo = next(r for r in data["rows"] if r["algo"] == "grpo")
    assert grpo["gain_test"]["per_seed"] == pytest.approx([0.15, 0.25])

    shutil.rmtree(tmp_path / "out")
    invoke(_args(tmp_path, critic_lr=3e-4))  # other algorithm settings (not the protocol): retrained, not reused
    assert trained[4:] == [("grpo", 0), ("mpo", 0), ("grpo", 1), ("mpo", 1)]
    with pytest.raises(SystemExit, match="other settings of the algorithm"):  # OUT's runs, asked under others
        invoke(_args(tmp_path))
    assert len(trained) == 8
    shutil.rmtree(tmp_path / "out")
    invoke(_args(tmp_path, lr=2e-4))  # another protocol: everything again
    assert len(trained) == 12
    shutil.rmtree(tmp_path / "out")
    (tmp_path / "init" / "model.safetensors").write_bytes(b"other weights")
    invoke(_args(tmp_path, lr=2e-4))
    assert len(trained) == 16
    rows, why = lm.recorded_curves(tmp_path / "results", _args(tmp_path, lr=2e-4), {**START, "dev": 0.31},
                                   lm.init_digest(tmp_path / "init"))
    assert rows == [] and "evaluates differently" in why


def test_rollouts_before_rl_are_counted_and_an_empty_mid_training_stage_is_flagged(tmp_path):
    """Mid-training's generation and value pre-training sample episodes before the first iteration: they count in
    the row's rollouts, and a mid-training seed whose stage 1 kept nothing (a plain GRPO run) is named in the notes."""
    import benchmarks.learning_lm as lm

    def run_dir(algo, seed, pre, config):
        d = tmp_path / algo / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "pretrain.json").write_text(json.dumps(pre))
        (d / "run.json").write_text(json.dumps({"config": config}))
        (d / "metrics.csv").write_text("iteration,rollouts,rollout_s,update_s,dev_success,test_success\n"
                                       "1,32,1.0,1.0,,\n2,32,1.0,1.0,0.4,0.3\n")

    run_dir("midtrain", 0, {"pretrain_rollouts": 768, "gen_candidates": 768, "gen_kept": 0}, {"lr": 1})
    run_dir("midtrain", 1, {"pretrain_rollouts": 768, "gen_candidates": 768, "gen_kept": 12}, {"lr": 1})
    # a value pre-training file from before `pretrain_rollouts` existed: 2 batches + 1 held out, G x tasks each
    run_dir("vapo", 0, {"pretrain_steps": 20}, {"value_pretrain_batches": 2, "group_size": 8, "tasks_per_iter": 4})
    curves = lm._curves(tmp_path, START, ())
    final = {(c["algo"], c["seed"]): c for c in curves if c["iteration"] == 2}
    assert final[("midtrain", 0)]["rollouts"] == 768 + 64 and final[("vapo", 0)]["rollouts"] == 96 + 64
    assert final[("midtrain", 0)]["config"] == final[("midtrain", 1)]["config"] != final[("vapo", 0)]["config"]
    rows = {r["algo"]: r for r in summarise(curves, START, 2, ())}
    assert rows["midtrain"]["gen_kept"] == [0, 12] and rows["midtrain"]["pre_rollouts"] == 768
    notes = "\n".join(lm.row_notes(list(rows.values())))
    assert "kept nothing on seed 0" in notes and "kept 0 / 12 examples" in notes
    assert "vapo: 96 of its 160 rollouts were sampled before RL (value pre-training)" in notes
    assert lm._stale_runs(curves, {"midtrain": final[("midtrain", 0)]["config"]}) == [("vapo", 0)]


def test_config_digest_ignores_only_the_save_cadence():
    from baselines.core.loop import config_digest

    base = {"lr": 1e-4, "group_size": 8, "checkpoint_every": 0, "strategies": ("a", "b")}
    assert config_digest(base) == config_digest({**base, "checkpoint_every": 1})
    assert config_digest(base) == config_digest({**base, "strategies": ["a", "b"]})  # as run.json reads back
    assert config_digest(base) != config_digest({**base, "lr": 2e-4})


def test_tropd_distils_from_the_unweakened_checkpoint_unless_told_otherwise(monkeypatch):
    """From the weakened start the row's teacher is the checkpoint the start was weakened from (the shipped one by
    default, so the digests of runs recorded before TrOPD's own default changed still match); from the shipped
    agent it is TrOPD's own default, the larger model (distilling the start from itself teaches nothing);
    --teacher picks another."""
    import benchmarks.learning_lm as lm
    from baselines.tropd import TrOPDConfig

    seen = []
    monkeypatch.setattr(lm, "run", lambda a, argv=None: seen.append(a))
    lm.main(["--start", "weaken"])
    lm.main(["--start", "weaken", "--init", "/some/ckpt"])
    lm.main(["--start", "weaken", "--teacher", "data/lm/sft-small"])
    lm.main([])
    lm.main(["--teacher", "/t"])
    teachers = [lm._algo("tropd", a, {}).config.teacher for a in seen]
    assert teachers == ["data/lm/sft", "/some/ckpt", "data/lm/sft-small", TrOPDConfig().teacher, "/t"]
    assert TrOPDConfig().teacher != "data/lm/sft"  # the weakened protocol does not simply follow the class default


def test_midtrain_generates_with_the_cards_strategy_prompt_from_the_shipped_agent(monkeypatch):
    """From the shipped agent mid-training's stage 1 uses the card's strategy prompt (without the exemplar, which
    the shipped agent cannot follow); from the weakened start the unprompted [derived] fallback."""
    import benchmarks.learning_lm as lm

    seen = []
    monkeypatch.setattr(lm, "run", lambda a, argv=None: seen.append(a))
    lm.main(["--temperature", "0.9"])
    lm.main(["--start", "weaken", "--temperature", "0.9"])
    sft, weak = (lm._algo("midtrain", a, {}).config for a in seen)
    assert (sft.strategy_prompt, sft.exemplar, sft.gen_temperature) == (True, False, 0.9)
    assert (weak.strategy_prompt, weak.exemplar, weak.gen_temperature) == (False, False, 0.9)


def test_the_sft_start_is_the_shipped_checkpoint_untouched(tmp_path, monkeypatch):
    """`--start sft` (the default) saves the shipped weights as they are: no interpolation toward a random model,
    no calibration evaluation; the start's evaluation then runs on exactly those weights."""
    import torch

    import benchmarks.learning_lm as lm
    from agents.lm.model import load_model

    def no_eval(*a, **k):
        raise AssertionError("the sft start needs no calibration")

    monkeypatch.setattr(lm, "evaluate", no_eval)
    args = SimpleNamespace(start="sft", families=list(FAMS))
    init = lm.default_init()
    info = lm.weaken(init, tmp_path / "start", 0.3, 40, {"max_turns": 40}, 6, args)
    assert info["alpha"] == 0.0 and info["start"] == "sft"
    shipped, start = load_model(init).state_dict(), load_model(tmp_path / "start").state_dict()
    assert shipped.keys() == start.keys()
    assert all(torch.equal(shipped[k], start[k]) for k in shipped)
    assert json.loads((tmp_path / "start" / "weaken.json").read_text())["start"] == "sft"


def test_the_screened_pool_keeps_the_tasks_the_start_both_solves_and_fails(tmp_path, monkeypatch):
    """A task enters the training pool when some of its screening rollouts succeed and some fail; the pool is saved
    in the start folder and reused; the screening rollouts are the start's own at the rollout temperature."""
    import benchmarks.learning_lm as lm
    import shopsim.rollout

    seen = {}

    class FakeAgent:
        def __init__(self, env_id, checkpoint, temperature, max_new_tokens, top_p=1.0):
            seen["temperature"], seen["top_p"] = temperature, top_p
            self.sampling = SimpleNamespace(greedy=False)

    def fake_collect(env_id, agent, *, tasks, group_size=1, **kw):
        if agent.sampling.greedy:  # arg-max solves the always-solved tasks and the odd ones of the half-solved
            return [SimpleNamespace(success=t % 3 == 0 or (t % 3 == 2 and t % 2 == 1)) for t in tasks]
        out = []
        for t in tasks:  # task % 3: 0 always solved, 1 never, 2 half the time
            for r in range(group_size):
                out.append(SimpleNamespace(success=(t % 3 == 0) or (t % 3 == 2 and r % 2 == 0)))
        return out

    import agents.lm.agent

    monkeypatch.setattr(agents.lm.agent, "LMAgent", FakeAgent)
    monkeypatch.setattr(shopsim.rollout, "collect", fake_collect)
    args = SimpleNamespace(screen_tasks=12, screen_samples=4, temperature=1.0, max_turns=40, max_new_tokens=48,
                           families=["bundle"], start="sft", num_envs=None)
    info = lm.screen_pool(tmp_path, args, {})
    assert info["pool"] and all(t % 3 == 2 for t in info["pool"])
    fam = info["families"]["bundle"]
    assert fam["kept"] == len(info["pool"]) and fam["always"] + fam["never"] + fam["kept"] == 12
    # where the draws disagree with arg-max: sampled success on the tasks greedy solves and on those it fails
    half = list(info["pool"])
    solved_half = sum(t % 2 == 1 for t in half)
    n_solved = fam["always"] + solved_half
    assert fam["greedy_success"] == pytest.approx(n_solved / 12)
    assert fam["sampled_on_greedy_solved"] == pytest.approx((fam["always"] + 0.5 * solved_half) / n_solved)
    assert fam["greedy_failed"] == 12 - n_solved
    assert fam["greedy_failed_solved_by_a_sample"] == len(half) - solved_half
    assert fam["sampled_on_greedy_failed"] == pytest.approx(0.5 * (len(half) - solved_half) / (12 - n_solved))
    assert seen["temperature"] == 1.0 and seen["top_p"] == 1.0
    monkeypatch.setattr(shopsim.rollout, "collect", lambda *a, **k: pytest.fail("the saved pool is reused"))
    assert lm.screen_pool(tmp_path, args, {}) == info
    # a nucleus-sampled protocol screens with its own draws, into its own pool file
    monkeypatch.setattr(shopsim.rollout, "collect", fake_collect)
    nucleus = lm.screen_pool(tmp_path, SimpleNamespace(**{**vars(args), "top_p": 0.9}), {})
    assert seen["top_p"] == 0.9 and nucleus["top_p"] == 0.9 and len(list(tmp_path.glob("pool-*.json"))) == 2


def test_top_p_reaches_the_rollouts_and_keeps_recorded_digests():
    """`LMConfig.top_p` is the rollouts' nucleus mass (the agent's sampling config); at its default 1.0 it is left
    out of the config digest, so runs recorded before the option existed are still reused."""
    from baselines.core.loop import config_digest

    algo = baselines.make("grpo", env_id="shopsim/Shopping-v0", top_p=0.8, temperature=0.7)
    agent = SimpleNamespace(sampling=SimpleNamespace(temperature=1.0, top_p=1.0, greedy=True))
    algo.configure_agent(agent)
    assert (agent.sampling.temperature, agent.sampling.top_p, agent.sampling.greedy) == (0.7, 0.8, False)
    old = {"lr": 1e-4, "temperature": 0.7}
    assert config_digest(old) == config_digest({**old, "top_p": 1.0})
    assert config_digest(old) != config_digest({**old, "top_p": 0.9})
    with pytest.raises(ConfigError, match="top_p"):
        baselines.make("grpo", env_id="shopsim/Shopping-v0", top_p=1.5)


def test_the_balanced_pool_draws_every_family_about_equally_often():
    """`--pool-balance family` repeats the tasks of the families the screening kept fewer of, so that a uniform draw
    over the pool picks each family with about the same probability; the tasks themselves are the screened ones."""
    import benchmarks.learning_lm as lm

    info = {"families": {"find_and_buy": {"kept": 2}, "bundle": {"kept": 6}, "after_sales": {"kept": 0},
                         "clarify_and_buy": {"kept": 3}},
            "pool": [1, 2, 10, 11, 12, 13, 14, 15, 20, 21, 22]}
    assert lm.pool_by_family(info) == {"find_and_buy": [1, 2], "bundle": [10, 11, 12, 13, 14, 15], "after_sales": [],
                                       "clarify_and_buy": [20, 21, 22]}
    pool = lm.balanced_pool(info)
    assert set(pool) == set(info["pool"])
    share = {f: sum(t in ids for t in pool) / len(pool) for f, ids in lm.pool_by_family(info).items() if ids}
    assert share == {"find_and_buy": 6 / 18, "bundle": 6 / 18, "clarify_and_buy": 6 / 18}


def test_kl_coef_reaches_every_algorithm_with_a_kl_term_and_only_those(monkeypatch):
    """``--kl-coef`` sets β for every algorithm whose config has one, except those whose card has none (WAPO); left
    out, each algorithm keeps its own default."""
    import benchmarks.learning_lm as lm

    seen = []
    monkeypatch.setattr(lm, "run", lambda a, argv=None: seen.append(a))
    lm.main(["--kl-coef", "0.05"])
    lm.main([])
    given, default = seen
    for name in ("grpo", "gigpo", "dapo", "arc"):
        assert lm._algo(name, given, {}).config.kl_coef == 0.05
    assert lm._algo("wapo", given, {}).config.kl_coef == 0.0
    assert lm._algo("gigpo", default, {}).config.kl_coef == baselines.resolve("gigpo", env_id=lm.ENV).Config().kl_coef
    assert lm.protocol_of(given)["kl_coef"] == 0.05 and lm.protocol_of(default)["kl_coef"] is None


def test_schedule_and_loss_aggregation_options_reach_every_algorithm(monkeypatch):
    """``--lr-warmup``, ``--lr-decay`` and ``--loss-agg`` set every algorithm's config and enter the protocol;
    left out, the schedule is constant and each algorithm keeps its own aggregation (GRPO: the paper's)."""
    import benchmarks.learning_lm as lm

    seen = []
    monkeypatch.setattr(lm, "run", lambda a, argv=None: seen.append(a))
    lm.main(["--lr-warmup", "2", "--lr-decay", "linear", "--loss-agg", "token-mean"])
    lm.main([])
    given, default = seen
    for name in lm.ALGOS:
        c = lm._algo(name, given, {}).config
        assert (c.lr_warmup_iters, c.lr_decay, c.loss_agg) == (2, "linear", "token-mean"), name
        c = lm._algo(name, default, {}).config
        assert (c.lr_warmup_iters, c.lr_decay) == (0, "constant"), name
    assert lm._algo("grpo", default, {}).config.loss_agg == "seq-mean-token-mean"
    assert {k: lm.protocol_of(given)[k] for k in ("lr_warmup", "lr_decay", "loss_agg")} == {
        "lr_warmup": 2, "lr_decay": "linear", "loss_agg": "token-mean"}
    assert {k: lm.protocol_of(default)[k] for k in ("lr_warmup", "lr_decay", "loss_agg")} == {
        "lr_warmup": 0, "lr_decay": "constant", "loss_agg": None}


def test_reward_scheme_reaches_the_env_of_every_run(monkeypatch):
    """``--reward-scheme strict`` makes every run's env pay 1 only for a success (and enters the protocol); ``loose``
    (the weakened start's default) keeps the env's partial credit and its env options unchanged."""
    import gymnasium as gym

    import benchmarks.learning_lm as lm

    seen = []
    monkeypatch.setattr(lm, "run", lambda a, argv=None: seen.append(a))
    lm.main(["--reward-scheme", "strict"])
    lm.main(["--reward-scheme", "loose"])
    strict, default = seen
    init = lm.default_init()
    kw = lm.protocol_env_kwargs(init, strict)
    assert kw["reward_scheme"] == "strict" and kw["max_turns"] == 40
    assert "reward_scheme" not in lm.protocol_env_kwargs(init, default)
    assert lm.protocol_of(strict)["reward_scheme"] == "strict" and lm.protocol_of(default)["reward_scheme"] == "loose"
    env = gym.make(lm.ENV, **kw)
    assert env.unwrapped.reward_scheme == "strict"
    env.close()


def test_gradient_noise_scale_from_a_gram_matrix():
    """`benchmarks.grad_noise_lm.noise_stats`: for per-group gradients G_i = g + noise, tr(Σ) and the unbiased |g|²
    recover the values the draws were made with, and B_simple = tr(Σ)/|g|² follows; pure noise gives |g|² ≈ 0."""
    import numpy as np

    from benchmarks.grad_noise_lm import inverse_b_interval, noise_stats

    rng = np.random.default_rng(0)
    n, d = 400, 50
    g = np.full(d, 0.1)  # |g|² = 0.5
    G = g + rng.normal(0, 0.2, size=(n, d))  # tr(Σ) = 50 · 0.04 = 2.0
    st = noise_stats(G @ G.T)
    assert st["groups"] == n
    assert st["tr_sigma"] == pytest.approx(2.0, rel=0.05)
    assert st["grad_sq"] == pytest.approx(0.5, rel=0.1)
    assert st["b_simple"] == pytest.approx(4.0, rel=0.15)
    assert st["grad_sq_biased"] > st["grad_sq"]  # |mean|² carries tr(Σ)/n of noise
    lo, hi = inverse_b_interval(G @ G.T)
    assert lo < st["b_simple"] < hi < 2 * st["b_simple"]
    noise = rng.normal(0, 0.2, size=(n, d))
    assert abs(noise_stats(noise @ noise.T)["grad_sq"]) < 0.01
    assert inverse_b_interval(noise @ noise.T)[1] == float("inf")  # no signal: unbounded above


def test_family_alignment_recovers_aligned_opposed_and_orthogonal_families():
    """`benchmarks.grad_noise_lm.family_alignment`: per-group gradients G_i = g_family + noise; the cosine of two
    families' mean gradients, estimated from distinct groups only, is +1, −1 or 0 as the draws were made, and a
    family's own entry holds its squared mean gradient (the noise of its groups left out)."""
    import numpy as np

    from benchmarks.grad_noise_lm import family_alignment

    rng = np.random.default_rng(1)
    d, n = 40, 150
    a = np.zeros(d)
    a[0] = 1.0
    b = np.zeros(d)
    b[1] = 1.0
    means = {"after_sales": a, "bundle": -a, "find_and_buy": b}
    fams = [f for f in means for _ in range(n)]
    G = np.stack([means[f] + rng.normal(0, 0.5, d) for f in fams])  # noise norm² 10 ≫ signal 1
    out = family_alignment(G @ G.T, fams)
    assert out["after_sales|bundle"]["cos"] == pytest.approx(-1.0, abs=0.1)
    assert out["after_sales|find_and_buy"]["cos"] == pytest.approx(0.0, abs=0.1)
    assert out["after_sales|after_sales"]["dot"] == pytest.approx(1.0, abs=0.15)
    assert out["bundle|find_and_buy"]["groups"] == [n, n]


def test_module_classes_cut_the_flat_gradient_into_disjoint_parts():
    """Every trainable parameter of the shipped model lands in exactly one class of the per-module breakdown, at its
    place in the flattened gradient (the order the optimizer holds them), and the tied output head counts once."""
    from transformers import AutoModelForCausalLM

    import benchmarks.learning_lm as lm
    from benchmarks.grad_noise_lm import module_classes

    model = AutoModelForCausalLM.from_pretrained(lm.default_init())
    parts = module_classes(model)
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    flat = sorted(i for idx in parts.values() for i in idx)
    assert flat == list(range(total))
    assert set(parts) == {"embedding", "attention", "mlp", "norm"}
    assert len(parts["embedding"]) == model.get_input_embeddings().weight.numel()


def test_gradient_noise_table_keeps_recorded_arms_of_the_same_protocol(tmp_path):
    """A later `grad_noise_lm --results DIR` run adds its arms to the recorded table when the protocol matches (each
    arm keeps the command and commit that measured it) and starts over when it does not."""
    from benchmarks.grad_noise_lm import merged_with_recorded, write_table

    def arm(b):
        return {"train_success": 0.6, "zero_variance_groups": 0.1, "b_simple": b, "b_simple_ci95": [b / 2, 2 * b],
                "snr": {"8": 8 / b, "16": 16 / b}}

    proto = {"seed": 0, "group_size": 8, "groups": 64, "pool_size": 139, "lr": 1e-4, "machine": "m", "wall_s": 1.0}
    old = {**proto, "command": "old cmd", "commit": "aaa", "arm_options": {"a": {}, "b": {}},
           "arms": {"a": arm(100.0), "b": arm(200.0)}}
    path = tmp_path / "grad_noise_lm.json"
    path.write_text(json.dumps(old))
    new = {**proto, "command": "new cmd", "commit": "bbb", "arm_options": {"b": {}, "c": {}},
           "arms": {"b": arm(150.0), "c": arm(300.0)}}
    res = merged_with_recorded(json.loads(json.dumps(new)), path)
    assert set(res["arms"]) == {"a", "b", "c"}
    assert res["arms"]["a"]["commit"] == "aaa" and res["arms"]["b"]["commit"] == "bbb"
    assert res["arms"]["b"]["b_simple"] == 150.0 and res["earlier_runs"][0]["command"] == "old cmd"
    write_table(res, tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text()
    assert "| a |" in text and "| c |" in text and "earlier run kept" in text
    other = merged_with_recorded({**json.loads(json.dumps(new)), "groups": 32}, path)
    assert set(other["arms"]) == {"b", "c"}


def test_gradient_noise_table_from_recorded_json_files(tmp_path):
    """`grad_noise_lm --from-json A B --results DIR` measures nothing and writes the table of both runs' arms, each
    with its own command and commit; a record under another protocol is refused with the field that differs."""
    from benchmarks.grad_noise_lm import main, result_stem, same_protocol
    from shopsim.envs.shopping import FAMILIES

    ALL = list(FAMILIES)

    def rec(cmd, commit, arms, **over):
        return {"seed": 0, "group_size": 8, "groups": 128, "pool_size": 200, "lr": 1e-4, "families": ALL,
                "machine": "m", "wall_s": 1.0, "command": cmd, "commit": commit, "arm_options": dict.fromkeys(arms, {}),
                "arms": {a: {"train_success": 0.6, "zero_variance_groups": 0.1, "b_simple": 90.0,
                             "b_simple_ci95": [60.0, 180.0], "snr": {"8": 0.09, "16": 0.18}} for a in arms}, **over}

    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(rec("cmd a", "aaa", ["x"])))
    b.write_text(json.dumps(rec("cmd b", "bbb", ["y"])))
    c.write_text(json.dumps(rec("cmd c", "ccc", ["z"], families=["bundle", "after_sales"])))
    assert result_stem(ALL) == "grad_noise_lm" and result_stem(["bundle", "after_sales"]) == (
        "grad_noise_lm_bundle-after_sales")
    old = rec("cmd o", "ooo", ["o"])
    del old["families"]  # a record from before --families: the seed checks' two families
    assert result_stem(None) == "grad_noise_lm_find_and_buy-clarify_and_buy"
    assert same_protocol(old, rec("cmd", "c", ["o"], families=["find_and_buy", "clarify_and_buy"])) == []
    assert same_protocol(old, rec("cmd", "c", ["o"])) == ["families"]
    assert main(["--from-json", str(a), str(b), "--results", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "grad_noise_lm.json").read_text())
    assert {k: v["commit"] for k, v in res["arms"].items()} == {"x": "aaa", "y": "bbb"}
    assert "| x |" in (tmp_path / "out" / "grad_noise_lm.md").read_text()
    with pytest.raises(SystemExit, match="families"):
        main(["--from-json", str(a), str(c), "--results", str(tmp_path / "out2")])


def test_standard_rows_import_only_runs_whose_seeds_all_finished(tmp_path, monkeypatch):
    import shopsim.app.bench as bench
    from benchmarks.learning_lm import standard_rows

    for algo, its in (("grpo", (2, 2)), ("mpo", (2, 1)), ("dapo-nods", (2, 2))):  # mpo's seed 1 stopped early
        for seed, it in enumerate(its):
            d = tmp_path / algo / f"seed{seed}"
            (d / "checkpoint").mkdir(parents=True)
            rows = "".join(f"{i},0.5\n" for i in range(1, it + 1))
            (d / "metrics.csv").write_text("iteration,train_success\n" + rows)
    calls = []

    def fake(env_id, entry, dirs, results_dir, **kw):
        calls.append((entry, [d.name for d in dirs], kw["budget"], kw["keep_checkpoint"]))
        return {"metrics": {"success_rate": {"mean": 0.5}}}

    monkeypatch.setattr(bench, "import_trained", fake)
    args = SimpleNamespace(algos=["grpo", "mpo", "dapo-nods"], seeds=[0, 1], iterations=2, no_progress=True,
                           families=list(FAMS),
                           start="sft", target=0.3, rollouts=32, group_size=8, minibatches=1, lr=1e-4,
                           temperature=1.0, max_new_tokens=48, max_turns=40, eval_episodes=400)
    rows = standard_rows(tmp_path, args, tmp_path / "std", "python -m benchmarks.learning_lm", "abc")
    # mpo has an unfinished seed; dapo-nods is a seed paper's arm, not a leaderboard row
    assert len(rows) == 1 and [c[0] for c in calls] == ["grpo"] and calls[0][1] == ["seed0", "seed1"]
    budget = calls[0][2]
    assert budget["source"] == "benchmarks.learning_lm" and budget["train_seeds"] == [0, 1]
    assert budget["protocol"]["temperature"] == 1.0 and budget["init_sha256"] == "abc" and calls[0][3]


def test_variant_arms_train_their_algorithm_with_their_options(monkeypatch):
    """A seed paper's arm is its algorithm under the same protocol with the arm's own config and env options on
    top; its digest differs from the algorithm's row, so its runs are never mistaken for the row's."""
    import benchmarks.learning_lm as lm

    seen = []
    monkeypatch.setattr(lm, "run", lambda a, argv=None: seen.append(a))
    lm.main(["--algos", "dapo", "dapo-nods", "arc-bias-free", "--temperature", "0.9"])
    a = seen[0]
    assert a.algos == ["dapo", "dapo-nods", "arc-bias-free"]
    dapo, nods = lm._algo("dapo", a, {"max_turns": 40}), lm._algo("dapo-nods", a, {"max_turns": 40})
    assert type(nods) is type(dapo) and dapo.config.dynamic_sampling and not nods.config.dynamic_sampling
    assert nods.config.temperature == dapo.config.temperature == 0.9
    assert nods.config.max_gen_batches == dapo.config.max_gen_batches
    arc = lm._algo("arc-bias-free", a, {"max_turns": 40})
    assert arc.config.free_group and arc.config.env_kwargs == {"max_turns": 40, "style_bias": 0.1}
    assert arc.config.group_size == lm.ARC_N  # the budget logic of its algorithm applies
    digests = lm.expected_digests(a, {"max_turns": 40}, algos=("dapo", "dapo-nods"))
    assert digests["dapo"] != digests["dapo-nods"]
    assert set(lm.VARIANTS) & set(lm.ALGOS) == set() and all(b in lm.ALGOS for b, _, _ in lm.VARIANTS.values())
    for arm in lm.VARIANTS:  # every arm builds: its options exist on its algorithm's config
        lm._algo(arm, a, {})
    with pytest.raises(SystemExit):
        lm.main(["--algos", "no-such-arm"])


def test_arm_rows_are_listed_apart_and_left_out_of_the_pairs(tmp_path):
    curves = _three_algos() + [_row("dapo-nods", s, 2, 0.5, 0.5, 0.5) for s in (0, 1, 2)]
    args = SimpleNamespace(families=list(FAMS), start="sft", target=0.3, iterations=2, rollouts=32, group_size=8,
                           minibatches=4, lr=1e-4, temperature=0.5, max_new_tokens=48, max_turns=15,
                           eval_episodes=100, seeds=[0, 1, 2], init=None)
    write_results(tmp_path, summarise(curves, START, 2, FAMS), START, args, 1.0, "x", curves=curves)
    md = (tmp_path / "learning_lm.md").read_text()
    main, arms = md.split("The seed papers' arms")
    assert "| dapo-nods |" in arms and "| dapo-nods |" not in main and "| grpo |" in main
    assert "**1 of 3 pairs are separated**" in md  # grpo, mpo, dapo only
    data = json.loads((tmp_path / "learning_lm.json").read_text())
    assert {r["algo"] for r in data["rows"]} == {"grpo", "mpo", "dapo", "dapo-nods"}
    assert all("dapo-nods" not in (p["a"], p["b"]) for p in data["pairs"])


def test_rows_report_the_late_gain_and_the_asked_share_where_every_seed_has_them():
    curves = _curves() + [{**_row("arc", s, 2, 0.3 + s / 10, 0.5, 0.1), "test_asked": 0.2 * s,
                           "test_asked/clarify_and_buy": 0.5} for s in (0, 1)]
    curves += [_row("arc", 0, 1, 0.25, 0.5, 0.0), _row("arc", 1, 1, 0.45, 0.5, 0.0)]
    rows = {r["algo"]: r for r in summarise(curves, START, 2, FAMS)}
    assert rows["arc"]["late_gain_test"]["per_seed"] == pytest.approx([0.05, -0.05])
    assert "late_gain_test" not in rows["grpo"]  # only seed 0 was evaluated before the end
    assert "late_gain_test" not in rows["mpo"] and "asked_test" not in rows["grpo"]
    assert rows["arc"]["asked_test"]["per_seed"] == pytest.approx([0.0, 0.2])
    fam = rows["arc"]["asked_test_family"]
    assert set(fam) == {"clarify_and_buy"} and fam["clarify_and_buy"]["per_seed"] == pytest.approx([0.5, 0.5])


def test_each_start_defaults_to_its_recorded_protocol():
    """With no option given, `--start sft` is the table of record's command (the Makefile's `learning-record`) and
    `--start weaken` the protocol its committed table was measured under; an option given wins over either."""
    import shlex

    from benchmarks.learning_lm import parse_args, protocol_of

    make = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    flags = shlex.split(next(line for line in make.splitlines() if line.startswith("RECORD_FLAGS"))
                        .split(":=", 1)[1].replace("$(RECORD_OUT)", "runs/record"))
    assert protocol_of(parse_args([])) == protocol_of(parse_args(flags))
    weaken = json.loads((ROOT / "docs" / "results" / "learning_lm_weaken.json").read_text())["protocol"]
    got = protocol_of(parse_args(["--start", "weaken"]))
    assert {k: got[k] for k in weaken if k != "seeds"} == {k: v for k, v in weaken.items() if k != "seeds"}
    assert parse_args(["--temperature", "0.3"]).temperature == 0.3
    assert parse_args(["--start", "weaken", "--rollouts", "64"]).rollouts == 64
    assert parse_args([]).rollouts != parse_args(["--start", "weaken"]).rollouts
