"""`shopsim train`: generic over families, one-line errors, --set parsing."""

import pytest

from shopsim.app.cli import main
from shopsim.app.commands.train import parse_overrides
from shopsim.errors import ConfigError


def test_parse_overrides():
    from baselines.core.config import LMConfig

    assert parse_overrides(["lr=1e-5", "group_size=4", "dual_clip=null", "task_families=find_and_buy,bundle",
                            'env_kwargs={"max_turns": 3}', "normalize_advantage=true"], LMConfig) == {
        "lr": 1e-5, "group_size": 4, "dual_clip": None, "task_families": ("find_and_buy", "bundle"),
        "env_kwargs": {"max_turns": 3}, "normalize_advantage": True}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(["lr"], LMConfig)


@pytest.mark.parametrize("argv,expect", [
    (["--env", "shopsim/Nope-v0", "--algo", "grpo"], "unknown env"),
    (["--env", "shopsim/Shopping-v0", "--algo", "nope"], "unknown algorithm 'nope'"),
    (["--env", "shopsim/Shopping-v0", "--algo", "hpo"], "does not train 'shopping'"),
    (["--env", "shopsim/Shopping-v0", "--algo", "mpo", "--set", "lam=1"], "unknown option(s) lam"),
    (["--env", "shopsim/Shopping-v0", "--algo", "mpo", "--set", "lam_turn=2"],
     "lam_turn: expected a value in [0, 1], got 2"),
])
def test_errors_are_one_line(argv, expect, tmp_path, capsys):
    code = main(["train", *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and expect in err[0]
