"""Every code block of docs/clients.md and docs/scale.md, run exactly as printed (offline, on CPU).

The blocks are read from the Markdown files, so what runs is what the pages show. Each ```python and ```bash block
is named in `RUN` by a line only it contains, with the test that runs it; a ```text block (a folder layout, an
output sample) is shown, not run; a block with any other fence (or none) fails the bookkeeping test, so a new
block has to be placed. Python blocks run with `exec`, bash blocks with ``bash -e``, both in a fresh folder with
shopsim's virtual environment first on PATH; the blocks of one section share the folder and run in the order
printed (a later block reads what an earlier one wrote). The runs are slow tests; the bookkeeping is not.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.fixtures.ray_head import stop_head

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = ("clients.md", "scale.md")
BIN = Path(sys.executable).parent
#: fences that run, and those that are only shown
RUN_LANGS, SHOWN_LANGS = ("python", "bash"), ("text",)

#: (page, a line only that block contains) -> the test that runs the block as printed
RUN = {
    ("clients.md", "learn(30_000)"): "test_sb3_replenishment_snippets_run_as_printed",
    ("clients.md", "VecNormalize.load("): "test_sb3_replenishment_snippets_run_as_printed",
    ("clients.md", "retrieval = PPO("): "test_sb3_retrieval_and_rec_snippet_runs_as_printed",
    ("clients.md", "--out runs/expert.parquet"): "test_trl_sft_snippets_run_as_printed",
    ("clients.md", "runs/trl-sft"): "test_trl_sft_snippets_run_as_printed",
    ("clients.md", "model import smollm2-135m-instruct --out models/smollm2"):
        "test_trl_grpo_smollm2_snippets_run_as_printed",
    ("clients.md", "runs/trl-grpo-smollm2"): "test_trl_grpo_smollm2_snippets_run_as_printed",
    ("clients.md", "runs/trl-grpo-tiny"): "test_trl_grpo_tiny_snippet_runs_as_printed",
    ("clients.md", "shopsim serve --env"): "test_openenv_server_and_client_snippets_run_as_printed",
    ("clients.md", "ShoppingClient(base_url="): "test_openenv_server_and_client_snippets_run_as_printed",
    ("scale.md", "shopsim bench --tier tiny"): "test_scale_one_machine_snippet_runs_as_printed",
    ("scale.md", "SOURCE_DATE_EPOCH=1700000000"): "test_scale_same_rows_snippet_runs_as_printed",
    ("scale.md", "rollout_workers=2"): "test_scale_training_rollouts_snippet_runs_as_printed",
    ("scale.md", "ray start --head"): "test_scale_ray_head_snippet_runs_as_printed",
}

_FENCE = re.compile(r"^```(.*)$")


def blocks(page: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of a docs page, in order; an unclosed fence is an error."""
    out, lang, code = [], None, []
    for n, line in enumerate((DOCS / page).read_text().splitlines(), 1):
        m = _FENCE.match(line)
        if lang is None and m:
            lang, code, start = m.group(1).strip(), [], n
        elif lang is not None and line.strip() == "```":
            out.append((lang, "\n".join(code) + "\n"))
            lang = None
        elif lang is not None:
            code.append(line)
    assert lang is None, f"{page}: the block opened on line {start} is never closed"
    return out


def snippet(page: str, marker: str) -> str:
    found = [code for lang, code in blocks(page) if lang in RUN_LANGS and marker in code]
    assert len(found) == 1, f"{page}: {len(found)} blocks contain {marker!r}"
    return found[0]


def test_every_block_is_run_or_marked_as_text():
    for page in PAGES:
        for lang, code in blocks(page):
            assert lang in RUN_LANGS + SHOWN_LANGS, (
                f"{page}: a ```{lang} block; fence it as {' / '.join(RUN_LANGS + SHOWN_LANGS)}:\n{code}")
            if lang in RUN_LANGS:
                named = [m for (p, m) in RUN if p == page and m in code]
                assert len(named) == 1, f"{page}: name this block in RUN (a line only it contains):\n{code}"
    here = sys.modules[__name__]
    for (page, marker), test in RUN.items():
        snippet(page, marker)  # exactly one block
        fn = getattr(here, test, None)
        assert callable(fn), f"RUN names {test}, which is not a test of this module"
        # the test fetches the block itself (not a copy of its text)
        assert f"snippet({page!r}, {marker!r})" in inspect.getsource(fn).replace('"', "'"), (test, marker)


# ------------------------------------------------------------------------------------------------ running blocks
def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1",
               **extra)
    return env


def run_bash(code: str, cwd: Path, env: dict | None = None, timeout: int = 900) -> str:
    res = subprocess.run(["bash", "-e", "-c", code], cwd=cwd, env=env or _env(), capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, f"{code}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


def run_python(code: str, cwd: Path, monkeypatch) -> dict:
    import torch

    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.set_num_threads(1)
    namespace: dict = {"__name__": "__snippet__"}
    exec(compile(code, "<docs snippet>", "exec"), namespace)  # noqa: S102 - the docs' own code, as printed
    return namespace


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------------ clients.md: SB3
@pytest.mark.slow
def test_sb3_replenishment_snippets_run_as_printed(tmp_path, monkeypatch, capsys):
    """Train (30k PPO steps, about 90 s on one thread), save the model with its VecNormalize statistics, load both and
    evaluate on the first 32 test episodes: at most 2x the cost of shopsim's s_S agent on the same episodes, and
    below its random agent (the recipe as printed before cost 1.95M, 125x s_S)."""
    import agents
    from shopsim.leaderboard.evaluate import evaluate
    from shopsim.leaderboard.protocols import load_protocol

    ns = run_python(snippet("clients.md", "learn(30_000)"), tmp_path, monkeypatch)
    assert ns["model"].num_timesteps >= 30_000 and (tmp_path / "runs/sb3/vecnormalize.pkl").is_file()
    ns = run_python(snippet("clients.md", "VecNormalize.load("), tmp_path, monkeypatch)
    assert "mean cost per test episode" in capsys.readouterr().out
    cost = sum(ns["costs"]) / len(ns["costs"])
    protocol = load_protocol("shopsim/Replenishment-v0").limited(tasks=32, seeds=[0], tries=1)
    ref = {name: evaluate(agents.make(name, protocol.env_id), protocol).metrics["cost"]["mean"]
           for name in ("s_S", "random")}
    assert len(ns["costs"]) == 32 and cost <= 2 * ref["s_S"] and cost < ref["random"], (cost, ref)


@pytest.mark.slow
def test_sb3_retrieval_and_rec_snippet_runs_as_printed(tmp_path, monkeypatch):
    """One PPO update on each wrapped env: the policies move away from their seeded initialisation."""
    from stable_baselines3 import PPO

    from shopsim.wrappers import make_sb3_env

    ns = run_python(snippet("clients.md", "retrieval = PPO("), tmp_path, monkeypatch)
    fresh = {"retrieval": PPO("MlpPolicy", make_sb3_env("shopsim/TwoStageRetrieval-v0"), seed=0),
             "rec": PPO("MlpPolicy", make_sb3_env("shopsim/ProactiveRec-v0", simulator="analytic"), seed=0)}
    for name, start in fresh.items():
        trained = ns[name]
        assert trained.num_timesteps >= 2_048, name
        before, after = _params(start.policy), _params(trained.policy)
        assert before.keys() == after.keys() and any((before[k] != after[k]).any() for k in before), name


# ------------------------------------------------------------------------------------------------ clients.md: TRL
@pytest.mark.slow
def test_trl_sft_snippets_run_as_printed(tmp_path, monkeypatch):
    """The expert rollout command, then SFTTrainer on its successful episodes (the snippet said nothing of the CPU:
    TRL stopped with "Your setup doesn't support bf16/gpu")."""
    run_bash(snippet("clients.md", "--out runs/expert.parquet"), tmp_path)
    ns = run_python(snippet("clients.md", "runs/trl-sft"), tmp_path, monkeypatch)
    state = ns["trainer"].state
    losses = [h["loss"] for h in state.log_history if "loss" in h]
    assert state.global_step == 20 and losses and losses[-1] < losses[0]


@pytest.mark.slow
def test_trl_grpo_smollm2_snippets_run_as_printed(tmp_path, monkeypatch):
    """`shopsim model import`, then one GRPOTrainer step with `environment_factory` on the real SmolLM2-135M-Instruct,
    offline on CPU: TRL renders the four tools, parses the model's completions with the Qwen 2.5 schema, and plays
    the episodes of the dataset's tasks in the environment class."""
    run_bash(snippet("clients.md", "model import smollm2-135m-instruct --out models/smollm2"), tmp_path)
    assert json.loads((tmp_path / "models/smollm2/shopsim_model.json").read_text())["name"] == (
        "HuggingFaceTB/SmolLM2-135M-Instruct")
    ns = run_python(snippet("clients.md", "runs/trl-grpo-smollm2"), tmp_path, monkeypatch)
    trainer = ns["trainer"]
    assert type(trainer.model).__name__ == "LlamaForCausalLM" and trainer.processing_class.vocab_size == 49152
    assert sorted(t.__name__ for t in trainer.tools) == ["back", "buy", "click", "search"]
    assert trainer.state.global_step == 1
    (log,) = [h for h in trainer.state.log_history if "rewards/ShoppingToolEnv/mean" in h]  # the env's reward
    assert log["num_tokens"] > 2 * 500  # two prompts with the tool list and the first page
    tasks = set(ns["task_dataset"](2, split="train", family="find_and_buy")["task_id"])
    assert {e.env.task.task_id for e in trainer.environments} <= tasks


@pytest.mark.slow
def test_trl_grpo_tiny_snippet_runs_as_printed(tmp_path, monkeypatch):
    ns = run_python(snippet("clients.md", "runs/trl-grpo-tiny"), tmp_path, monkeypatch)
    trainer = ns["trainer"]
    assert trainer.state.global_step == 4
    assert any("rewards/ShoppingToolEnv/mean" in h for h in trainer.state.log_history)


# ------------------------------------------------------------------------------------------------ clients.md: OpenEnv
@pytest.mark.slow
def test_openenv_server_and_client_snippets_run_as_printed(tmp_path, monkeypatch, capsys):
    """`shopsim serve` as printed (port 8000), then the client block against it: the first page, a search by tool
    call and a click in the text grammar, both valid."""
    assert _port_free(8000), "port 8000 is in use; the printed `shopsim serve --port 8000` needs it"
    server = subprocess.Popen(["bash", "-e", "-c", snippet("clients.md", "shopsim serve --env")], cwd=tmp_path,
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        lines = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("serving"):
                break
        assert lines and lines[-1].startswith("serving") and ":8000" in lines[-1], "".join(lines)[-2000:]
        ns = run_python(snippet("clients.md", "ShoppingClient(base_url="), tmp_path, monkeypatch)
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the shell of the block and the server it started
        server.wait(timeout=60)
    out = capsys.readouterr().out
    result = ns["result"]
    assert out.startswith("Task:") and not result.done and result.observation.invalid_action in (None, "")
    assert result.observation.task_id == 2_000_000


# ------------------------------------------------------------------------------------------------ scale.md
@pytest.mark.slow
def test_scale_one_machine_snippet_runs_as_printed(tmp_path):
    from shopsim.datasets import read_metadata, read_trajectories

    run_bash(snippet("scale.md", "shopsim bench --tier tiny"), tmp_path)
    assert len(list((tmp_path / "runs/ss").glob("part-*.parquet"))) == 16
    trajs = read_trajectories(tmp_path / "runs/ss")
    assert len(trajs) == 200 and read_metadata(tmp_path / "runs/ss")["num_shards"] == 16
    rec = json.loads((tmp_path / "results/s_S.json").read_text())
    assert rec["episodes"] == 32 and rec["entry"] == "s_S"
    board = (tmp_path / "runs/tiny/leaderboard.md").read_text()
    assert "| s_S | reference |" in board and "| hpo | trained |" in board


@pytest.mark.slow
def test_scale_same_rows_snippet_runs_as_printed(tmp_path):
    """The two commands give the same rows; the shards are byte-identical to those of one process writing the same
    shards (`--shard-episodes` without workers)."""
    import pandas as pd

    from shopsim.datasets import read_turns

    code = snippet("scale.md", "SOURCE_DATE_EPOCH=1700000000")
    run_bash(code, tmp_path)
    sharded, single = read_turns(tmp_path / "D"), read_turns(tmp_path / "D.parquet")
    assert len(single) == 64 * 100 and sharded.equals(single)
    assert len(pd.read_parquet(tmp_path / "D")) == len(single)  # the folder reads as one table
    one_process = code.splitlines()[0].replace("--workers 2 --out D", "--shard-episodes 4 --out D1")
    run_bash(one_process, tmp_path)
    shards = sorted((tmp_path / "D").glob("part-*.parquet"))
    assert len(shards) == 16
    assert all(p.read_bytes() == (tmp_path / "D1" / p.name).read_bytes() for p in shards)


@pytest.mark.slow
def test_scale_training_rollouts_snippet_runs_as_printed(tmp_path):
    """GRPO from the shipped model with its rollouts on 2 Ray workers (run where ``data/lm/sft`` is the shipped
    checkpoint, as from a clone's root)."""
    import csv

    (tmp_path / "data").symlink_to(DOCS.parent / "data")
    code = snippet("scale.md", "rollout_workers=2")
    run_bash(code, tmp_path)
    iterations = int(re.search(r"--iterations (\d+)", code).group(1))
    out = tmp_path / "runs/grpo-ray"
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["iteration"]) for r in rows] == list(range(1, iterations + 1))
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["rollout_workers"] == 2 and run["init"] == "data/lm/sft"
    assert (out / "checkpoint" / "shopsim_agent.json").is_file()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_scale_ray_head_snippet_runs_as_printed(tmp_path):
    """`ray start --head --port=6379`, a rollout over every CPU of the cluster (`--ray-address auto`) and an
    evaluation on 2 of its workers, then `ray status`. The head runs with Ray's defaults and a token on the machine
    (token authentication on), in a Ray temp folder of its own, so `auto` finds this head and no other."""
    from shopsim.datasets import read_trajectories

    assert _port_free(6379), "port 6379 is in use; the printed `ray start --head --port=6379` needs it"
    tmp = tempfile.mkdtemp(prefix="shopsim-doc-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    (Path(tmp) / "auth_token").write_text(secrets.token_hex(32))
    env = _env(RAY_TMPDIR=tmp, RAY_AUTH_TOKEN_PATH=str(Path(tmp) / "auth_token"), RAY_USAGE_STATS_ENABLED="0")
    try:
        out = run_bash(snippet("scale.md", "ray start --head"), tmp_path, env=env)
        # the page's note: `ray status` needs token mode named on a cluster with token authentication
        bare = subprocess.run(["ray", "status"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        status = run_bash("RAY_AUTH_MODE=token ray status", tmp_path, env=env)
    finally:
        stop_head(tmp, 6379)
    assert "Token authentication is enabled" in out  # Ray's default with a token on the machine
    assert bare.returncode != 0 and "InvalidAuthToken" in bare.stderr
    assert re.search(r"\d+(\.\d+)?/\d+(\.\d+)? CPU", status), status[-2000:]  # the cluster's CPUs
    data = tmp_path / "runs/ss-cluster"
    assert len(read_trajectories(data)) == 200 and len(list(data.glob("part-*.parquet"))) == 16
    rec = json.loads((tmp_path / "results/s_S-cluster.json").read_text())
    assert rec["episodes"] == 32 and rec["metrics"]["cost"]["mean"] > 0
