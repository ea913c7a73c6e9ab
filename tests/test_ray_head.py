"""`--ray-address` and `--workers` against a real `ray start --head` cluster on this machine (slow: a head takes
about 10 s to start and stop).

The head runs in its own Ray temp folder (``RAY_TMPDIR``) with its own token file (``RAY_AUTH_TOKEN_PATH``) and
free ports, so it neither joins nor disturbs any other Ray cluster on the machine, and it is stopped by killing its
own processes (never ``ray stop``, which stops every cluster of the user). Its token file exists, so Ray 2.60's
default (``RAY_AUTH_MODE`` unset) turns token authentication on, as it does after any earlier local ``ray.init``
wrote ``~/.ray/auth_token``: the case where a driver given ``--ray-address HOST:PORT`` was refused.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fixtures.ray_head import stop_head

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPLENISHMENT = "shopsim/Replenishment-v0"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head():
    """(address, env, folder): a 2-CPU head with token auth on by default, started from a folder of its own."""
    tmp = tempfile.mkdtemp(prefix="shopsim-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    (Path(tmp) / "auth_token").write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_TMPDIR=tmp, RAY_AUTH_TOKEN_PATH=str(Path(tmp) / "auth_token"), OMP_NUM_THREADS="1")
    port = _free_port()
    started = Path(tmp) / "where-ray-started"
    started.mkdir()
    cmd = [str(BIN / "ray"), "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
           f"--ray-client-server-port={_free_port()}", f"--dashboard-port={_free_port()}", "--disable-usage-stats"]
    try:
        res = subprocess.run(cmd, env=env, cwd=started, capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "Token authentication is enabled" in res.stderr + res.stdout  # Ray's default with a token present
        yield f"127.0.0.1:{port}", env, Path(tmp)
    finally:
        stop_head(tmp, port)


def _shopsim(args, env, cwd, timeout=600):
    res = subprocess.run([str(BIN / "shopsim"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, f"shopsim {' '.join(args)}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def test_rollout_and_eval_on_a_ray_start_head_write_into_the_users_folder(head, tmp_path):
    """The issue's commands, as a user would type them: a relative --out, a driver in another folder than the one
    `ray start` ran in, Ray's default authentication. The rows are those of a single-process run."""
    import pandas as pd

    from shopsim.datasets import read_turns

    address, env, tmp = head
    user = tmp_path / "user"
    user.mkdir()
    rollout = ["rollout", "--env", REPLENISHMENT, "--agent", "s_S", "--episodes", "8", "--shard-episodes", "2",
               "--no-progress"]
    out = _shopsim([*rollout, "--ray-address", address, "--out", "D"], env, user)
    assert "wrote D (4 shards: 4 run now" in out
    assert sorted(p.name for p in (user / "D").glob("part-*.parquet")) == [f"part-{k:05d}.parquet" for k in range(4)]
    assert not list((tmp / "where-ray-started").iterdir())  # nothing written where the head started
    _shopsim([*rollout, "--out", "one.parquet"], env, user)
    single = read_turns(user / "one.parquet")
    assert len(single) == 8 * 100 and read_turns(user / "D").equals(single)
    assert len(pd.read_parquet(user / "D")) == len(single)

    ev = ["eval", "--env", REPLENISHMENT, "--agent", "s_S", "--tasks", "2", "--seeds", "0", "--tries", "1",
          "--no-progress"]
    _shopsim([*ev, "--ray-address", address, "--out", "results/ray.json"], env, user)
    _shopsim([*ev, "--out", "results/one.json"], env, user)
    ray_res, one = (json.loads((user / "results" / f).read_text()) for f in ("ray.json", "one.json"))
    assert ray_res["metrics"] and ray_res["metrics"] == one["metrics"]


def test_workers_start_their_own_cluster_while_a_head_runs(head, tmp_path):
    """`--workers 2` while a `ray start` cluster runs on the machine: a plain ray.init found that cluster and failed
    with "When connecting to an existing cluster, num_cpus and num_gpus must not be provided"."""
    _, env, _ = head
    _shopsim(["rollout", "--env", REPLENISHMENT, "--agent", "s_S", "--episodes", "4", "--workers", "2",
              "--no-progress", "--out", "D"], env, tmp_path)
    assert len(list((tmp_path / "D").glob("part-*.parquet"))) == 4


def test_a_wrong_token_is_one_line_saying_what_to_do(head, tmp_path):
    address, env, _ = head
    (tmp_path / "other_token").write_text(secrets.token_hex(32))
    res = subprocess.run([str(BIN / "shopsim"), "eval", "--env", REPLENISHMENT, "--agent", "s_S", "--tasks", "1",
                          "--ray-address", address, "--out", "r/x.json"],
                         env={**env, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "other_token")}, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "uses token authentication" in res.stderr
    assert "RAY_AUTH_MODE=disabled" in res.stderr
    assert not (tmp_path / "r").exists()
