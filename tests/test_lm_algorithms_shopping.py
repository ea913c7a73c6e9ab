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
