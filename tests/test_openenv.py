"""The OpenEnv server for Shopping-v0 (`shopsim.integrations.openenv`, `shopsim serve`): a client round trip on
localhost gives exactly the in-process episode, bad actions are in-episode invalid actions, and concurrent clients
keep their own episodes."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from shopsim.envs.shopping import ShoppingEnv
from shopsim.integrations.openenv import ShoppingAction, ShoppingClient, background_server

SIZE = 2000
ENV_KW = {"catalog_size": SIZE, "max_turns": 12}
#: a find_and_buy episode: search, a bad action of each kind, open the first result, buy
SCRIPT = [ShoppingAction(tool="search", arguments={"query": "perfume"}), ShoppingAction(text="dance[now]"),
          ShoppingAction(tool="click", arguments={"target": "no such button"}),
          ShoppingAction(text="click[#1]"), ShoppingAction(tool="buy")]


@pytest.fixture(scope="module")
def url():
    with background_server(max_concurrent_envs=4, **ENV_KW) as base:
        yield base


def _reference(seed: int, task_id: int, actions) -> list[tuple[str, float, bool, dict]]:
    """The same episode in process: (page, reward, done, info) after reset and after each action."""
    env = ShoppingEnv(**ENV_KW)
    obs, info = env.reset(seed=seed, options={"task_id": task_id, "family": "find_and_buy"})
    out = [(obs, None, False, info)]
    for a in actions:
        obs, r, term, trunc, info = env.step(a.to_env())
        out.append((obs, r, term or trunc, info))
    return out


def test_client_round_trip_matches_the_in_process_episode(url):
    ref = _reference(3, 7, SCRIPT)
    with ShoppingClient(base_url=url).sync() as client:
        first = client.reset(seed=3, task_id=7, family="find_and_buy")
        obs = first.observation
        assert obs.text == ref[0][0] and not first.done and obs.task_id == 7 and obs.family == "find_and_buy"
        assert [t["function"]["name"] for t in obs.tools] == list(ShoppingEnv(**ENV_KW).tools)
        assert "oracle" not in obs.model_dump()  # the hidden goal never leaves the server
        results = [client.step(a) for a in SCRIPT]
        for res, (page, reward, done, info) in zip(results, ref[1:], strict=True):
            assert res.observation.text == page and res.reward == reward and res.done == done
            assert res.observation.invalid_action == info["invalid_action"]
            assert res.observation.invalid_kind == info["invalid_kind"]
        # bad actions are flagged and the episode goes on
        assert results[1].observation.invalid_kind == "parse" and not results[1].done
        assert results[2].observation.invalid_kind == "tool" and not results[2].done
        assert "Invalid action" in results[2].observation.text
        end = results[-1]
        assert end.done and end.observation.end_reason == "buy"
        assert end.observation.episode_metrics == ref[-1][3]["episode_metrics"]
        assert end.observation.episode_metrics["invalid_actions"] == 2.0
        state = client.state()
        assert state.step_count == len(SCRIPT) and state.done and state.task_id == 7
        assert state.total_reward == pytest.approx(sum(r for _, r, _, _ in ref[1:]))


def test_protocol_errors_raise_and_the_session_survives(url):
    with ShoppingClient(base_url=url).sync() as client:
        client.reset(seed=0, task_id=7, family="find_and_buy")
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):  # neither text nor tool: not a ShoppingAction
            client.step(ShoppingAction.model_construct(text=None, tool=None, arguments={}))
        assert client.step(ShoppingAction(text="search[perfume]")).observation.invalid_action is None
        client.step(ShoppingAction(text="click[#1]"))
        assert client.step(ShoppingAction(text="buy")).done
        with pytest.raises(RuntimeError, match="episode has ended"):
            client.step(ShoppingAction(text="search[more]"))
        assert not client.reset(seed=1, task_id=8).done  # a reset starts over on the same session
    with pytest.raises(ValueError, match="exactly one"):
        ShoppingAction()


def test_concurrent_clients_keep_their_own_episodes(url):
    """Four sessions step in lockstep on different tasks; each sees exactly its own in-process episode."""
    tasks = [(10 + i, 20 + i) for i in range(4)]
    actions = [ShoppingAction(text="search[tea]"), ShoppingAction(text="click[#2]"), ShoppingAction(text="back"),
               ShoppingAction(text="click[#1]")]

    async def run():
        clients = [ShoppingClient(base_url=url) for _ in tasks]
        for c in clients:
            await c.connect()
        try:
            pages = [[(await c.reset(seed=s, task_id=t, family="find_and_buy")).observation.text]
                     for c, (s, t) in zip(clients, tasks, strict=True)]
            for a in actions:  # interleaved: every client steps before any steps again
                results = await asyncio.gather(*(c.step(a) for c in clients))
                for p, r in zip(pages, results, strict=True):
                    p.append(r.observation.text)
            states = await asyncio.gather(*(c.state() for c in clients))
        finally:
            for c in clients:
                await c.close()
        return pages, states

    pages, states = asyncio.run(run())
    for (seed, task), got, state in zip(tasks, pages, states, strict=True):
        assert got == [page for page, _, _, _ in _reference(seed, task, actions)]
        assert state.task_id == task and state.step_count == len(actions)
    assert len({p[0] for p in pages}) == len(tasks)  # different tasks, so a leak would show


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shopsim_serve_answers_an_openenv_client():
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "shopsim.app.cli", "serve", "--env", "shopsim/Shopping-v0",
                             "--port", str(port), "--env-kwargs", '{"catalog_size": 2000}'],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "shopsim serve did not start"
                time.sleep(0.2)
        with ShoppingClient(base_url=f"http://127.0.0.1:{port}").sync() as client:
            first = client.reset(seed=0, task_id=5)
            assert first.observation.text.startswith("Task:")
            step = client.step(ShoppingAction(tool="search", arguments={"query": "tea"}))
            assert "results for" in step.observation.text and step.observation.invalid_action is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_refuses_an_env_without_models():
    from shopsim.app.cli import main

    assert main(["serve", "--env", "shopsim/Replenishment-v0", "--port", "0"]) == 2
