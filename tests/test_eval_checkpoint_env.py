"""`shopsim eval --checkpoint` evaluates on the env options the checkpoint was trained with."""

import json

import pytest

import baselines
from shopsim.cli import main
from shopsim.commands.eval import manifest_env_kwargs

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
