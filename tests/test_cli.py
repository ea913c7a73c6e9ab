import subprocess
import sys

import pytest

from shopsim.app.cli import main


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "shopsim.app.cli", *args], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def one_line_error(stderr):
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in stderr
    return lines[-1]


def test_unknown_env_is_one_line_and_exit_2(tmp_path):
    code, _, err = run_cli("rollout", "--env", "shopsim/Nope-v0", "--agent", "random", "--episodes", "1",
                           "--out", str(tmp_path / "x.parquet"))
    assert code == 2
    assert "unknown env" in one_line_error(err) and "Shopping-v0" in err


def test_unknown_agent_lists_choices(tmp_path):
    code, _, err = run_cli("rollout", "--env", "shopsim/Shopping-v0", "--agent", "nope", "--episodes", "1",
                           "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and "unknown agent 'nope'" in one_line_error(err) and "expert" in err


@pytest.mark.parametrize("episodes", ["0", "-3", "many"])
def test_bad_episode_count(tmp_path, episodes):
    code, _, err = run_cli("rollout", "--env", "shopsim/Shopping-v0", "--agent", "random", "--episodes", episodes,
                           "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and "--episodes" in err and "Traceback" not in err


def test_unwritable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli("rollout", "--env", "shopsim/Shopping-v0", "--agent", "random", "--episodes", "1",
                           "--out", str(blocker / "sub" / "x.parquet"))
    assert code == 2 and "writable path" in one_line_error(err)


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "rollout" in capsys.readouterr().out
