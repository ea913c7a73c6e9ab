"""`shopsim eval --checkpoint` evaluates on the env options the checkpoint was trained with."""

import json

import pytest
import torch

import baselines
from agents.registry import manifest_env_kwargs
from shopsim.app.cli import main

ENV = "shopsim/TwoStageRetrieval-v0"


def test_checkpoint_env_kwargs_are_used(tmp_path, capsys):
    algo = baselines.make("capg", env_id=ENV, env_kwargs={"k": 5})
    result = algo.train(ENV, iterations=1, seed=0, out_dir=tmp_path / "run", progress=False)
    assert manifest_env_kwargs(result.checkpoint / "shopsim_agent.json")["k"] == 5
    out = tmp_path / "res.json"
    assert main(["eval", "--env", ENV, "--checkpoint", str(result.checkpoint), "--tasks", "4", "--seeds", "0",
                 "--tries", "1", "--out", str(out), "--no-progress"]) == 0
    rec = json.loads(out.read_text())
    assert rec["config"]["env_kwargs"]["k"] == 5
    assert rec["metrics"]["invalid_rate"]["mean"] == 0.0  # a 5-id action is valid on the k=5 env
    # forcing the default env (k=10) makes every 5-id action invalid: the option really reaches the env
    assert main(["eval", "--env", ENV, "--checkpoint", str(result.checkpoint), "--tasks", "4", "--seeds", "0",
                 "--tries", "1", "--env-kwargs", "{}", "--out", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["metrics"]["invalid_rate"]["mean"] == 1.0


@pytest.mark.parametrize("bad", ["{k: 5}", "[1, 2]"])
def test_bad_env_kwargs_is_one_line(tmp_path, capsys, bad):
    assert main(["eval", "--env", ENV, "--agent", "random", "--env-kwargs", bad, "--out",
                 str(tmp_path / "r.json")]) == 2
    assert "--env-kwargs" in capsys.readouterr().err


def test_lm_checkpoint_carries_its_env_options_to_trainers_and_the_leaderboard(tmp_path):
    """An SFT checkpoint's env options travel with the agent: `load_checkpoint` sets ``agent.env_kwargs``, a
    re-save keeps them, an RL trainer started from it collects on them, and a fixed evaluation applies only the
    presentation ones (task options stay the protocol's)."""
    import agents
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer
    from shopsim.envs import presentation_kwargs
    from shopsim.leaderboard.evaluate import agent_env_kwargs
    from shopsim.leaderboard.protocols import load_protocol

    shop = "shopsim/Shopping-v0"
    tok = load_tokenizer()
    lm = LMAgent(env_id=shop, model=build_model(tok, size="tiny"), tokenizer=tok, max_new_tokens=4)
    kw = {"numbered_results": True, "results_per_page": 5, "max_invalid": 2}
    lm.save(tmp_path / "sft", env_kwargs=kw)
    back = agents.load_checkpoint(tmp_path / "sft")
    assert back.env_kwargs == kw
    back.save(tmp_path / "again")
    assert manifest_env_kwargs(tmp_path / "again") == kw
    algo = baselines.make("grpo", env_id=shop, group_size=2, tasks_per_iter=1, max_new_tokens=4, eval_every=0,
                          eval_episodes=1, num_envs=2)
    res = algo.train(shop, iterations=1, seed=0, out_dir=tmp_path / "rl", init=tmp_path / "sft", progress=False)
    assert algo._env_kwargs == kw and manifest_env_kwargs(res.checkpoint) == kw
    assert presentation_kwargs(shop) == {"numbered_results", "results_per_page", "obs_mode", "order_refs",
                                        "task_reminder"}
    proto = load_protocol(shop)
    used = agent_env_kwargs(back, proto)
    assert used == {**proto.env_kwargs, "numbered_results": True, "results_per_page": 5}
    assert agent_env_kwargs(agents.make("random", shop), proto) == dict(proto.env_kwargs)


def test_eval_env_kwargs_keep_the_checkpoints_rendering(tmp_path):
    """With `--env-kwargs`, the recorded task options are replaced but the policy's rendering still applies, and the
    results file records what the evaluation ran on."""
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    shop = "shopsim/Shopping-v0"
    tok = load_tokenizer()
    lm = LMAgent(env_id=shop, model=build_model(tok, size="tiny"), tokenizer=tok, max_new_tokens=4,
                 context_mode="concat")
    lm.save(tmp_path / "sft", env_kwargs={"obs_mode": "terse", "results_per_page": 5, "max_invalid": 2})
    out = tmp_path / "res.json"
    assert main(["eval", "--env", shop, "--checkpoint", str(tmp_path / "sft"), "--tasks", "1", "--seeds", "0",
                 "--tries", "1", "--env-kwargs", '{"family": "find_and_buy", "max_turns": 2}', "--out", str(out),
                 "--no-progress"]) == 0
    used = json.loads(out.read_text())["config"]["env_kwargs"]
    assert used == {"obs_mode": "terse", "results_per_page": 5, "family": "find_and_buy", "max_turns": 2}


def test_eval_decodes_an_lm_checkpoint_greedily_unless_asked_to_sample(tmp_path):
    """`shopsim eval` runs the leaderboard protocol's greedy decoding: the tries of a find_and_buy task (whose
    episode the reset seed does not change) are the same episode, although the loaded checkpoint samples at T = 1
    by itself; `--decoding sample` keeps the agent's sampling, is recorded in the results file and changes the
    protocol hash, so sampled results never share a table with greedy ones."""
    from agents.lm.agent import LMAgent
    from agents.lm.model import build_model
    from agents.lm.tokenizer import load_tokenizer

    shop = "shopsim/Shopping-v0"
    tok = load_tokenizer()
    torch.manual_seed(0)
    lm = LMAgent(env_id=shop, model=build_model(tok, size="tiny"), tokenizer=tok, max_new_tokens=6,
                 context_mode="concat")
    lm.save(tmp_path / "sft", env_kwargs={"obs_mode": "terse", "results_per_page": 5})
    seen = []
    import shopsim.leaderboard.evaluate as ev_mod

    real = ev_mod.evaluate

    def spy(agent, protocol, **kw):
        ev = real(agent, protocol, keep_trajectories=True, **{k: v for k, v in kw.items() if k != "collect"})
        seen.append((agent.sampling.greedy, [[str(t.action) for t in tr.turns] for tr in ev.trajectories]))
        return ev

    args = ["eval", "--env", shop, "--checkpoint", str(tmp_path / "sft"), "--tasks", "1", "--seeds", "0",
            "--tries", "3", "--env-kwargs", '{"family": "find_and_buy", "max_turns": 3}', "--no-progress"]
    import unittest.mock as mock

    with mock.patch.object(ev_mod, "evaluate", spy):
        assert main([*args, "--out", str(tmp_path / "g.json")]) == 0
        assert main([*args, "--decoding", "sample", "--out", str(tmp_path / "s.json")]) == 0
    (g_flag, g_eps), (s_flag, s_eps) = seen
    assert not g_flag and not s_flag  # the agent's own setting is back after the evaluation
    assert len(g_eps) == 3 and g_eps[0] == g_eps[1] == g_eps[2]
    assert len({tuple(e) for e in s_eps}) > 1  # sampling at T = 1 from a random tiny model differs between tries
    g, s = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("g", "s"))
    assert "decoding" not in g and s["decoding"] == "sample"
    assert g["protocol_hash"] != s["protocol_hash"]
