"""The shared training loop (baselines/core/loop.py): an interrupted run, resumed, gives the same metrics curve and
the same final parameters as an uninterrupted one, for CA-PG, HPO / hybrid PPO, ProRL and the LM loop; a finished
run is not retrained; a run folder of another config is refused."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

import baselines
from baselines.capg import CAPG
from baselines.core.loop import LEGACY_STATE_FILE, STATE_FILE
from baselines.hpo import HPO
from baselines.hybrid_ppo import HybridPPO
from baselines.prorl import ProRL
from shopsim.app.cli import main
from shopsim.errors import ConfigError

ITERATIONS = 4
CRASH_AT = 2  # iteration index whose work is done when the process dies, before its row and state are saved

CAPG_ENV = "shopsim/TwoStageRetrieval-v0"
CAPG_CFG = dict(batch_size=32, steps_per_iteration=3, eval_every=2, eval_contexts=200,
                env_kwargs={"n_items": 100, "k": 5})
HPO_ENV = "shopsim/Replenishment-v0"
HPO_CFG = dict(batch_scenarios=4, eval_scenarios=2, hidden=(16, 16), value_hidden=(16, 16))
HPO_OPTS = {"env_kwargs": {"horizon": 30, "warmup": 5}}
REC_ENV = "shopsim/ProactiveRec-v0"
REC_WORLD = dict(catalog_size=100, simulator="analytic")
# 24 prompts / 8 per iteration = 3 iterations per RL epoch: the resume lands mid-epoch (the saved prompt order is
# used) and the run then crosses into epoch 2 (a fresh permutation, running statistics frozen)
REC_CFG = dict(REC_WORLD, group_size=4, prompts_per_iter=8, num_train_prompts=24, eval_every=2, eval_tasks=8,
               valid_only=True, lr=3e-3)


def _rec_agent():
    from agents.rec_model import build_model
    from agents.rec_policies import RecPolicyAgent

    agent = RecPolicyAgent(valid_only=True, **REC_WORLD)
    agent.model = build_model(agent.vocab, d=16, layers=1, heads=2, seed=0).eval()
    return agent


def _lm_opts():
    from tests.fixtures.toy_lm import ToyLMAgent, env_fns

    return {"agent": ToyLMAgent(context_mode="concat"), "env_fns": env_fns(2)}


LM_CFG = dict(group_size=2, tasks_per_iter=2, eval_episodes=2, num_envs=2, lr=1e-3, critic_lr=1e-3, eval_every=2,
              checkpoint_every=1)

# id -> (make the algorithm, env id, extra train() options (a fresh copy per call), the trained parameters,
#        wall-clock columns, which differ between any two runs)
CASES = {
    "capg": (lambda: CAPG(**CAPG_CFG), CAPG_ENV, dict,
             lambda r: r.agent.scorer.state_dict(), {"train_seconds"}),
    "hpo": (lambda: HPO(**HPO_CFG), HPO_ENV, lambda: dict(HPO_OPTS),
            lambda r: r.agent.policy.state_dict(), {"seconds"}),
    "hybrid_ppo": (lambda: HybridPPO(**HPO_CFG), HPO_ENV, lambda: dict(HPO_OPTS),
                   lambda r: r.agent.policy.state_dict(), {"seconds"}),
    "prorl": (lambda: ProRL(**REC_CFG), REC_ENV, lambda: {"agent": _rec_agent()},
              lambda r: r.agent.model.state_dict(), set()),
    "lm_reinforce": (lambda: baselines.make("reinforce", env_id="shopsim/Shopping-v0", **LM_CFG), "toy", _lm_opts,
                     lambda r: r.agent.model.state_dict(), {"rollout_s", "update_s", "train_tokens_per_s"}),
    "lm_ppo": (lambda: baselines.make("ppo", env_id="shopsim/Shopping-v0", **LM_CFG), "toy", _lm_opts,
               lambda r: r.agent.model.state_dict(), {"rollout_s", "update_s", "train_tokens_per_s"}),
    # a learning-rate schedule: the resumed run must continue it from the saved iteration, not restart it
    "lm_grpo_schedule": (lambda: baselines.make("grpo", env_id="shopsim/Shopping-v0", **LM_CFG, lr_warmup_iters=2,
                                                lr_decay="linear"), "toy", _lm_opts,
                         lambda r: r.agent.model.state_dict(), {"rollout_s", "update_s", "train_tokens_per_s"}),
}


class Killed(Exception):
    """Stands for the process dying (Ctrl-C, OOM kill, preemption)."""


def _train(case: str, out: Path, iterations: int = ITERATIONS, crash_at: int | None = None, **config):
    make, env_id, opts, _, _ = CASES[case]
    algo = make()
    if config:
        algo = type(algo)(**{**algo.config.__dict__, **config})
    if crash_at is not None:
        run_iteration = algo.iteration

        def iteration(it):
            row = run_iteration(it)  # the iteration's work (RNG draws, parameter updates) happens, then the crash
            if it == crash_at:
                raise Killed
            return row

        algo.iteration = iteration
    return algo.train(env_id, iterations=iterations, seed=3, out_dir=out, progress=False, **opts())


def _curve(out: Path, drop: set[str]) -> list[dict]:
    with open(out / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]


def _snapshot(out: Path) -> dict:
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_interrupted_run_resumes_to_the_same_curve_and_parameters(case, tmp_path):
    _, _, _, params, timing = CASES[case]
    full = _train(case, tmp_path / "full")
    assert len(full.history) == ITERATIONS and full.resumed_from == 0

    with pytest.raises(Killed):
        _train(case, tmp_path / "part", crash_at=CRASH_AT)
    assert len(_curve(tmp_path / "part", timing)) == CRASH_AT  # the crashed iteration left no row
    resumed = _train(case, tmp_path / "part")
    assert resumed.resumed_from == CRASH_AT and not resumed.already_complete

    # the same curve, digit for digit (metrics.csv holds repr-exact floats), and the same in-memory history
    assert _curve(tmp_path / "part", timing) == _curve(tmp_path / "full", timing)
    strip = [{k: v for k, v in row.items() if k not in timing} for row in resumed.history]
    assert strip == [{k: v for k, v in row.items() if k not in timing} for row in full.history]
    # the same final parameters, bit for bit
    a, b = params(full), params(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_restores_every_generator_not_just_the_parameters(tmp_path):
    """Guard on the test above: without the saved generator states the resumed curve differs."""
    from baselines.core import loop

    full = _train("capg", tmp_path / "full")
    with pytest.raises(Killed):
        _train("capg", tmp_path / "part", crash_at=CRASH_AT)
    restore = loop.restore_rng
    loop.restore_rng = lambda state, streams=None: None
    try:
        resumed = _train("capg", tmp_path / "part")
    finally:
        loop.restore_rng = restore
    assert resumed.resumed_from == CRASH_AT
    assert [r["loss"] for r in resumed.history] != [r["loss"] for r in full.history]


def test_extending_a_finished_run_matches_a_longer_run(tmp_path):
    """iterations=2 then iterations=4 on the same folder equals iterations=4 (CA-PG evaluates every 2 here, so the
    2-iteration run's last-iteration evaluation is one the 4-iteration run makes too)."""
    full = _train("capg", tmp_path / "full")
    _train("capg", tmp_path / "part", iterations=2)
    longer = _train("capg", tmp_path / "part")
    assert longer.resumed_from == 2
    assert _curve(tmp_path / "part", {"train_seconds"}) == _curve(tmp_path / "full", {"train_seconds"})
    a, b = full.agent.scorer.state_dict(), longer.agent.scorer.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("case", ["capg", "hpo", "prorl", "lm_reinforce"])
def test_a_finished_run_is_not_retrained(case, tmp_path):
    first = _train(case, tmp_path, iterations=2)
    before = _snapshot(tmp_path)
    assert {"metrics.csv", STATE_FILE, "run.json"} <= set(before)
    again = _train(case, tmp_path, iterations=2, crash_at=0)  # any iteration run would raise Killed
    assert again.already_complete and again.resumed_from == 2
    assert again.history == first.history
    assert _snapshot(tmp_path) == before  # checkpoint, metrics, state and TensorBoard files untouched
    a, b = CASES[case][3](first), CASES[case][3](again)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the returned agent holds the trained parameters


def test_a_run_stopped_early_is_complete(tmp_path):
    """CA-PG stops at a gradient overflow; re-running does not continue past it."""
    kw = dict(env_id=CAPG_ENV, lr=1e4, optimizer="sgd", batch_size=32, eval_contexts=200,
              env_kwargs={"n_items": 100, "k": 5})
    res = baselines.make("vpg", **kw).train(CAPG_ENV, iterations=30, seed=0, out_dir=tmp_path, progress=False)
    assert res.history[-1]["overflow"] == 1 and len(res.history) < 30
    again = baselines.make("vpg", **kw).train(CAPG_ENV, iterations=30, seed=0, out_dir=tmp_path, progress=False)
    assert again.already_complete and again.history == res.history


def test_a_folder_of_another_config_is_refused(tmp_path):
    _train("capg", tmp_path, iterations=1)
    with pytest.raises(ConfigError, match="config field lr"):
        _train("capg", tmp_path, iterations=2, lr=0.5)
    with pytest.raises(ConfigError, match="seed"):
        CAPG(**CAPG_CFG).train(CAPG_ENV, iterations=2, seed=4, out_dir=tmp_path, progress=False)
    # resume=False starts again on purpose
    fresh = CAPG(**CAPG_CFG, lr=0.5).train(CAPG_ENV, iterations=1, seed=3, out_dir=tmp_path, progress=False,
                                           resume=False)
    assert fresh.resumed_from == 0 and len(fresh.history) == 1


def test_a_crafted_state_file_is_refused_before_it_runs(tmp_path):
    """A run folder whose resume state is a crafted pickle is refused with a message saying to delete it, and the
    pickle never runs: the pickled ``state.pt`` of older versions is not read at all, and the state file proper
    loads without unpickling."""
    from tests.fixtures.planted import plant_pickle

    marker = tmp_path / "ran"
    plant_pickle(tmp_path / "run" / LEGACY_STATE_FILE, marker)
    with pytest.raises(ConfigError, match=f"{LEGACY_STATE_FILE} is the resume state of an older shopsim.*delete it"):
        _train("capg", tmp_path / "run", iterations=1)
    (tmp_path / "run" / LEGACY_STATE_FILE).rename(tmp_path / "run" / STATE_FILE)
    with pytest.raises(ConfigError, match="not a shopsim state file.*delete it"):
        _train("capg", tmp_path / "run", iterations=1)
    assert not marker.exists()
    fresh = CAPG(**CAPG_CFG).train(CAPG_ENV, iterations=1, seed=3, out_dir=tmp_path / "run", progress=False,
                                   resume=False)  # starting again on purpose replaces it
    assert fresh.resumed_from == 0 and _train("capg", tmp_path / "run", iterations=1).already_complete


def test_a_different_checkpoint_cadence_still_resumes(tmp_path):
    """`checkpoint_every` says how often state is written, not what the run computes: a run started with state only
    at its end extends with state after every iteration, to the curve of one uninterrupted run."""
    full = _train("lm_ppo", tmp_path / "full")
    assert full.resumed_from == 0
    _train("lm_ppo", tmp_path / "part", iterations=CRASH_AT, checkpoint_every=0)
    resumed = _train("lm_ppo", tmp_path / "part", checkpoint_every=1)
    assert resumed.resumed_from == CRASH_AT
    timing = CASES["lm_ppo"][4]
    assert _curve(tmp_path / "part", timing) == _curve(tmp_path / "full", timing)


def test_unknown_train_argument_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown argument"):
        CAPG(**CAPG_CFG).train(CAPG_ENV, iterations=1, out_dir=tmp_path, progress=False, env_fns=[])


def test_metrics_csv_appends_and_widens_like_a_full_rewrite(tmp_path):
    from baselines.base import write_metrics_csv
    from baselines.core.loop import MetricsCSV

    rows = [{"iteration": 0, "loss": 0.5}, {"iteration": 1, "loss": 0.25, "value": 1.5},
            {"iteration": 2, "loss": 0.125}, {"iteration": 3, "loss": 1 / 3, "value": 2.0, "early_stop": 1.0}]
    out, history = MetricsCSV(tmp_path / "metrics.csv"), []
    for row in rows:
        history.append(row)
        out.add(row, history)
        write_metrics_csv(tmp_path / "expected.csv", history)
        assert (tmp_path / "metrics.csv").read_text() == (tmp_path / "expected.csv").read_text()


def test_rows_logged_after_the_last_saved_state_are_replaced_on_resume(tmp_path):
    """With a state saved every 2 iterations, a crash in iteration 4 leaves iteration 3 in metrics.csv and
    TensorBoard but not in the state: the resumed run redoes it, and neither file holds it twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _train("lm_reinforce", tmp_path / "full", checkpoint_every=2)
    with pytest.raises(Killed):
        _train("lm_reinforce", tmp_path / "part", crash_at=3, checkpoint_every=2)
    assert len(_curve(tmp_path / "part", set())) == 3  # iteration 3 was logged, the state holds 2
    resumed = _train("lm_reinforce", tmp_path / "part", checkpoint_every=2)
    assert resumed.resumed_from == 2
    timing = CASES["lm_reinforce"][4]
    assert _curve(tmp_path / "part", timing) == _curve(tmp_path / "full", timing)
    acc = EventAccumulator(str(tmp_path / "part" / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3, 4]
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx(
        [float(r["loss"]) for r in _curve(tmp_path / "part", set())])


def test_cli_rerun_of_a_finished_run_says_so_and_keeps_it(tmp_path, capsys):
    argv = ["train", "--env", CAPG_ENV, "--algo", "capg", "--iterations", "2", "--out", str(tmp_path),
            "--set", "batch_size=16", "--set", "steps_per_iteration=2", "--set", "eval_contexts=50", "--no-progress"]
    assert main(argv) == 0
    assert "trained capg" in capsys.readouterr().out
    before = _snapshot(tmp_path)
    assert main(argv) == 0
    assert "already holds a complete capg run (2 iterations)" in capsys.readouterr().out
    assert _snapshot(tmp_path) == before
    assert main([*argv[:6], "3", *argv[7:]]) == 0  # more iterations continue the run
    assert "resumed after iteration 2" in capsys.readouterr().out
    assert len(_curve(tmp_path, set())) == 3


def test_lr_schedule_factor_warms_up_then_decays():
    from baselines.core.trainer import lr_schedule_factor

    assert [lr_schedule_factor(k, 6, 2, "constant") for k in range(6)] == [0.5, 1, 1, 1, 1, 1]
    assert [lr_schedule_factor(k, 6, 2, "linear") for k in range(6)] == [0.5, 1, 1, 0.75, 0.5, 0.25]
    cos = [lr_schedule_factor(k, 6, 0, "cosine") for k in range(6)]
    assert cos[0] == 1 and all(a > b > 0 for a, b in zip(cos, cos[1:], strict=False))
    assert cos[3] == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="lr_decay"):
        lr_schedule_factor(3, 6, 0, "step")


def test_lm_run_trains_at_the_scheduled_learning_rate(tmp_path):
    res = _train("lm_grpo_schedule", tmp_path / "run")
    lrs = [float(r["lr"]) for r in _curve(tmp_path / "run", set())]
    assert lrs == pytest.approx([0.5e-3, 1e-3, 1e-3, 0.5e-3])  # LM_CFG's lr 1e-3, 2 warm-up iterations of 4
    assert res.history[-1]["lr"] == pytest.approx(0.5e-3)


def test_bad_lr_decay_is_a_config_error():
    with pytest.raises(ConfigError, match="lr_decay"):
        baselines.make("grpo", env_id="shopsim/Shopping-v0", **LM_CFG, lr_decay="step")


def test_a_run_saved_before_a_neutral_field_existed_still_resumes(tmp_path):
    """A config field added later (`DIGEST_NEUTRAL`) is absent from the state of runs saved before it: at its
    neutral value such a run resumes; at another value it is refused like any other change of config."""
    from baselines.core.loop import DIGEST_NEUTRAL
    from shopsim.statefile import load_state, save_state

    _train("lm_ppo", tmp_path / "run", iterations=1)
    path = tmp_path / "run" / STATE_FILE
    state = load_state(path)
    assert state["identity"]["config"]["negative_advantage_scale"] == DIGEST_NEUTRAL["negative_advantage_scale"]
    del state["identity"]["config"]["negative_advantage_scale"]  # as written before the field existed
    save_state(path, state)
    with pytest.raises(ConfigError, match="config field negative_advantage_scale"):
        _train("lm_ppo", tmp_path / "run", iterations=2, negative_advantage_scale=0.5)
    assert _train("lm_ppo", tmp_path / "run", iterations=2).resumed_from == 1
