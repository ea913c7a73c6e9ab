"""docs/adding-an-env.md runs as printed: its Python snippets in order, then its `shopsim` commands, in one fresh
interpreter (the toy env and its agents are registered in that process only), with the data folder in a tmp dir."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "adding-an-env.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def test_adding_an_env_page_runs_as_printed(tmp_path):
    commands = [line for block in blocks("bash") for line in block.splitlines() if line.strip()]
    cli = [c for c in commands if c.startswith("shopsim ")]
    # the pytest line needs the env among the shipped records; the conformance snippet runs the same checks
    assert [c for c in commands if c not in cli] == ["pytest tests/test_env_conformance.py -k Guess"]
    assert len(blocks("python")) == 6 and cli
    script = "\n\n".join(blocks("python")) + "\n\n" + "\n".join([
        "import shlex",
        "from shopsim.app.cli import main",
        *(f"assert main(shlex.split({c!r})[1:]) == 0, {c!r}" for c in cli),
    ])
    (tmp_path / "walkthrough.py").write_text(script)
    env = {**os.environ, "SHOPSIM_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "walkthrough.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "| expert | reference | 1.000" in res.stdout  # the conformance check's row and the API walk-through's
    board = (tmp_path / "leaderboard" / "leaderboard.md").read_text()
    assert "## shopsim/Guess-v0" in board and "| random | reference |" in board
    header = next(line for line in board.splitlines() if line.startswith("| entry") or "success_rate" in line)
    assert "misses" in header  # the record's columns, with the metric the walk-through registered
    assert not (ROOT / "data" / "splits" / "Guess-v0.json").exists()
