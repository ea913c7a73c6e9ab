"""The LM algorithms on the real Shopping-v0 env with a tiny random LM (transformers, built from config).

The fast test runs MPO (concat) and GRPO (window) for two short iterations; the slow one runs every algorithm.
"""

import pytest
import torch

import baselines

ENV = "shopsim/Shopping-v0"
SMALL = dict(group_size=2, tasks_per_iter=1, eval_episodes=2, num_envs=2, max_new_tokens=6, lr=1e-4,
             env_kwargs={"max_turns": 2}, task_families=("find_and_buy", "clarify_and_buy"), checkpoint_every=0)


def _agent(mode):
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    tok = load_tokenizer()
    return LMAgent(env_id=ENV, model=build_model(tok, size="tiny", seed=0), tokenizer=tok, context_mode=mode,
                   max_new_tokens=6)


def _run(name, mode, tmp_path):
    extra = {"value_pretrain_steps": 1, "value_pretrain_batches": 1} if name == "vapo" else {}
    if name == "dapo":
        extra["max_gen_batches"] = 1
    algo = baselines.make(name, env_id=ENV, **SMALL, **extra)
    res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path, agent=_agent(mode), progress=False)
    assert len(res.history) == 2
    last = res.history[-1]
    assert torch.isfinite(torch.tensor(last["loss"])) and "dev_success" in last
    assert last["gen_tokens"] > 0
    # the evaluation splits success by family (families interleave over the fixed dev tasks)
    per = [last["dev_success/find_and_buy"], last["dev_success/clarify_and_buy"]]
    assert last["dev_success"] == pytest.approx(sum(per) / 2)
    assert (tmp_path / "checkpoint" / "shopsim_agent.json").is_file()
    # the saved checkpoint reloads as an agent
    import agents

    assert agents.load_checkpoint(tmp_path / "checkpoint").model is not None
    return res


@pytest.mark.parametrize("name,mode", [("mpo", "concat"), ("grpo", "window")])
def test_fast_shopping(name, mode, tmp_path):
    _run(name, mode, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reinforce", "ppo", "dapo", "gigpo", "vapo"])
def test_all_algorithms_shopping(name, tmp_path):
    _run(name, "window", tmp_path)


def test_iterations_log_the_diagnostics_a_researcher_needs(tmp_path):
    """Per iteration: train success and zero-variance group share per family, the sampled-token entropy, KL to the
    start (≈ 0 on the first iteration, whose rollouts come from the start itself; > 0 once the policy has moved),
    the gradient norm; the same columns reach metrics.csv."""
    import csv

    # the entropy bonus moves the policy even when every reward of the tiny random model is the same
    algo = baselines.make("grpo", env_id=ENV, **{**SMALL, "group_size": 3, "tasks_per_iter": 2, "lr": 5e-3},
                          entropy_coef=0.5)
    res = algo.train(ENV, iterations=2, seed=0, out_dir=tmp_path, agent=_agent("concat"), progress=False)
    first, second = res.history
    for row in (first, second):
        fams = [k for k in row if k.startswith("train_success/")]
        assert fams and all(0.0 <= row[k] <= 1.0 for k in fams)
        assert 0.0 <= row["zero_var_groups"] <= 1.0
        assert any(k.startswith("zero_var_groups/") for k in row)
        assert row["entropy_sampled"] > 0 and row["grad_norm"] >= 0
    assert abs(first["kl_start"]) < 1e-4  # the start sampled its own rollouts
    assert abs(second["kl_start"]) > 1e-4  # one update at lr 5e-3 moved the policy
    with (tmp_path / "metrics.csv").open() as f:
        header = next(csv.reader(f))
    assert {"kl_start", "entropy_sampled", "zero_var_groups", "grad_norm"} <= set(header)


def test_kl_start_on_a_subset_of_rows_is_zero_before_any_update(tmp_path):
    """`kl_start_rows` smaller than the batch: the estimate reads those rows' own start log-probs (the first
    iteration's rollouts come from the start itself, so it is ~0 however the rows are split into micro-batches)."""
    algo = baselines.make("grpo", env_id=ENV, **{**SMALL, "group_size": 3, "tasks_per_iter": 3, "eval_episodes": 0},
                          kl_start_rows=4, micro_batch_tokens=64)
    res = algo.train(ENV, iterations=1, seed=0, out_dir=tmp_path, agent=_agent("concat"), progress=False)
    assert abs(res.history[0]["kl_start"]) < 1e-5


def test_zero_variance_groups_per_family():
    from shopsim.trajectory import Trajectory, Turn, zero_variance_groups

    def traj(group, family, reward):
        t = Trajectory(env_id=ENV, task_id=group, group_id=group, meta={"family": family})
        t.append(Turn(observation="o", action="a", reward=reward, terminated=True, truncated=False, info={}))
        return t

    trajs = [traj(0, "bundle", 0.0), traj(0, "bundle", 0.0), traj(1, "bundle", 1.0), traj(1, "bundle", 0.0),
             traj(2, "find_and_buy", 1.0), traj(2, "find_and_buy", 1.0), traj(3, "find_and_buy", 1.0)]
    out = zero_variance_groups(trajs)
    assert out["zero_var_groups"] == pytest.approx(2 / 3)  # group 3 is a singleton: not a group
    assert out["zero_var_groups/bundle"] == pytest.approx(0.5)
    assert out["zero_var_groups/find_and_buy"] == 1.0
    assert zero_variance_groups([traj(5, "bundle", 1.0)]) == {}
