"""`shopsim serve` against clients that misbehave, on purpose or by accident (localhost only).

Each test plays one attack or mistake: anonymous session-create calls, idle connections holding slots, one client
taking every slot, a missing token, closing someone else's session, HTTP calls that cannot hold an episode, huge
bodies, abrupt disconnects, cross-site pages and re-pointed host names, and a server started on bad arguments. The
last test, marked slow, runs 16 clients of mixed behaviour against one server and reports its throughput and memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from shopsim.integrations.openenv import ServePolicy, ShoppingAction, ShoppingClient, background_server

ENV_KW = {"catalog_size": 2000, "max_turns": 12}
TOKEN = "a-test-token-0123456789"


@pytest.fixture(scope="module")
def url():
    with background_server(max_concurrent_envs=2, **ENV_KW) as base:
        yield base


def _ws(base: str, path: str = "/ws", *, source: str | None = None, **kwargs):
    """A blocking WebSocket client of the server at `base`; `source`: the local address to connect from (any
    address of 127.0.0.0/8 reaches a server on 127.0.0.1, so tests can play several client machines)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    sock = None
    if source is not None:
        sock = socket.socket()
        sock.bind((source, 0))
        sock.connect((host, int(port)))
    return connect(f"ws://{host}:{port}{path}", sock=sock, open_timeout=10, **kwargs)


def _call(ws, message: dict) -> dict:
    ws.send(json.dumps(message))
    return json.loads(ws.recv(timeout=30))


def _http(base: str, path: str, *, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    """(status, JSON body) of one HTTP call."""
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _sessions(base: str, headers: dict | None = None) -> int:
    return _http(base, "/health", headers=headers)[1]["sessions"]


def _rpc(method: str, **params) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": 1}).encode()


JSON = {"Content-Type": "application/json"}


def test_anonymous_session_create_calls_take_no_slot(url):
    """OpenEnv's HTTP `openenv/session/create` made a session per call that nothing ever closed: two calls filled a
    two-session server for good. Sessions now exist only as WebSocket connections."""
    for _ in range(4):
        status, _ = _http(url, "/mcp", method="POST", body=_rpc("openenv/session/create"), headers=JSON)
        assert status == 404
    assert _sessions(url) == 0
    with ShoppingClient(base_url=url).sync() as client:
        assert client.reset(seed=0, task_id=3).observation.text.startswith("Task:")


def test_a_session_cannot_be_closed_by_another_client(url):
    """A session belongs to its connection: no call names a session, so none can close another client's."""
    with _ws(url) as a, _ws(url) as b:
        assert _call(a, {"type": "reset", "data": {"seed": 0, "task_id": 3}})["type"] == "observation"
        # the OpenEnv calls that told a client its session id and closed a session by id
        mine = _call(a, {"type": "mcp", "data": json.loads(_rpc("openenv/session/create"))})
        assert mine["type"] == "error" and "no MCP tools" in mine["data"]["message"]
        for sid in ("0" * 32, "any-guess"):
            answer = _call(b, {"type": "mcp", "data": json.loads(_rpc("openenv/session/close", session_id=sid))})
            assert answer["type"] == "error" and answer["data"]["code"] == "UNKNOWN_TYPE"
            assert _http(url, "/mcp", method="POST", body=_rpc("openenv/session/close", session_id=sid),
                         headers=JSON)[0] == 404
        step = _call(a, {"type": "step", "data": {"text": "search[tea]"}})
        assert step["type"] == "observation" and "results for" in step["data"]["observation"]["text"]
        assert _sessions(url) == 2


def test_idle_sessions_are_closed_and_free_their_slots():
    """Two connections that go silent held a two-session server forever; now each is closed after the idle
    timeout (with a close reason saying so) and a new client gets in. Traffic keeps a session open."""
    policy = ServePolicy(max_sessions=2, idle_timeout_s=1.0)
    with background_server(policy=policy, **ENV_KW) as base, contextlib.ExitStack() as stack:
        idle = [stack.enter_context(_ws(base)) for _ in range(2)]
        with _ws(base) as late:  # both slots taken: refused, with the limit named
            refused = json.loads(late.recv(timeout=10))
            assert refused["data"]["code"] == "CAPACITY_REACHED" and "--max-sessions" in refused["data"]["message"]
        busy_until = time.monotonic() + 1.6
        while time.monotonic() < busy_until:  # the second session keeps talking past the timeout
            assert _call(idle[1], {"type": "state"})["type"] == "state"
            time.sleep(0.3)
        with pytest.raises(ConnectionClosed) as closed:
            idle[0].recv(timeout=5)
        assert closed.value.rcvd.code == 1001 and "idle for 1 s" in closed.value.rcvd.reason
        with _ws(base) as fresh:
            assert _call(fresh, {"type": "reset", "data": {"seed": 1, "task_id": 4}})["type"] == "observation"
        assert _call(idle[1], {"type": "reset", "data": {"seed": 0}})["type"] == "observation"


def test_one_client_cannot_take_every_session():
    """A per-client limit (by the connection's address) keeps slots for other clients."""
    policy = ServePolicy(max_sessions=3, sessions_per_client=1)
    with background_server(policy=policy, **ENV_KW) as base:
        with _ws(base, source="127.0.0.1") as first, _ws(base, source="127.0.0.1") as second:
            assert _call(first, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
            refused = json.loads(second.recv(timeout=10))
            assert refused["data"]["code"] == "CAPACITY_REACHED"
            assert "--sessions-per-client 1" in refused["data"]["message"]
            with _ws(base, source="127.0.0.2") as other:  # another client machine still gets one
                assert _call(other, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
    # the default: every session for a loopback-bound server's clients (all of them this machine), half otherwise
    assert ServePolicy(max_sessions=8).per_client == 8
    assert ServePolicy(max_sessions=8, bind_host="0.0.0.0").per_client == 4


def test_a_token_is_required_on_every_call(monkeypatch):
    import shopsim.integrations.serve_guard as guard

    monkeypatch.delenv("SHOPSIM_SERVE_TOKEN", raising=False)
    compared = []
    real = guard.hmac.compare_digest
    monkeypatch.setattr(guard.hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    with background_server(policy=ServePolicy(token=TOKEN), **ENV_KW) as base:
        assert _http(base, "/health")[0] == 401
        assert _http(base, "/health", headers={"Authorization": "Bearer wrong-token-1234"})[0] == 401
        assert _http(base, "/health", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert _http(base, f"/health?token={TOKEN}")[0] == 200
        for headers in ({}, {"Authorization": "Bearer wrong-token-1234"}):
            with pytest.raises(InvalidStatus) as denied:
                _ws(base, additional_headers=headers)
            assert denied.value.response.status_code == 401
            assert b"needs its token" in denied.value.response.body
        with pytest.raises(ConnectionError, match="401"):
            ShoppingClient(base_url=base).sync().connect()
        with ShoppingClient(base_url=base, token=TOKEN).sync() as client:
            assert client.reset(seed=0, task_id=3).observation.text.startswith("Task:")
        monkeypatch.setenv("SHOPSIM_SERVE_TOKEN", TOKEN)  # the client reads the variable the server does
        with ShoppingClient(base_url=base).sync() as client:
            client.reset(seed=0, task_id=3)
            assert client.step(ShoppingAction(text="search[tea]")).observation.invalid_action is None
    assert compared  # the token was compared in constant time


def test_http_calls_without_a_session_get_a_4xx_naming_the_websocket(url):
    """HTTP /step built a fresh env per call and answered 500; /reset and /state had no episode to keep either."""
    body = json.dumps({"action": {"text": "search[tea]"}}).encode()
    for method, path, data in (("POST", "/step", body), ("POST", "/reset", b"{}"), ("GET", "/state", None)):
        status, answer = _http(url, path, method=method, body=data, headers=JSON if data else None)
        assert status == 400, (path, status, answer)
        assert "WebSocket sessions only: connect to /ws" in answer["detail"]
    assert _http(url, "/schema")[1]["action"]["title"] == "ShoppingAction"


def test_bodies_over_the_limit_get_413():
    policy = ServePolicy(max_body_bytes=4096)
    with background_server(policy=policy, **ENV_KW) as base:
        status, answer = _http(base, "/step", method="POST", body=b"x" * 10_000, headers=JSON)
        assert status == 413 and "at most 4096" in answer["detail"]
        host, port = base.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:  # streamed: no Content-Length
            s.sendall(b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                      b"Content-Type: application/json\r\n\r\n" + (b"800\r\n" + b"x" * 0x800 + b"\r\n") * 3)
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 413"), head[:80]
        with _ws(base, max_size=None) as ws:
            ws.send(json.dumps({"type": "step", "data": {"text": "x" * 10_000}}))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def _raw_ws(host: str, port: int) -> socket.socket:
    """A socket past the WebSocket handshake of /ws, so a test can drop it however it likes (a client library
    would notice and complain on its own threads)."""
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    return s


def _frame(message: dict) -> bytes:
    """One masked text frame (clients must mask) holding `message` as JSON."""
    payload = json.dumps(message).encode()
    assert len(payload) < 126
    mask = os.urandom(4)
    return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_client_disconnects_log_no_traceback(capfd):
    """Clients that vanish mid-handshake, mid-answer or mid-request are the normal end of a session: nothing on
    stderr, no log record with a traceback, and the slot is freed."""
    handler = _Records()
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "shopsim", "asyncio", "websockets")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        with background_server(max_concurrent_envs=4, **ENV_KW) as base:
            host, port = base.removeprefix("http://").rsplit(":", 1)
            for _ in range(5):
                with _raw_ws(host, int(port)) as s:  # leaves while its reset is being answered
                    s.sendall(_frame({"type": "reset", "data": {"seed": 0}}))
                with _raw_ws(host, int(port)) as s:  # leaves after a step, without a close frame
                    s.sendall(_frame({"type": "reset", "data": {"seed": 1}}))
                    s.recv(1 << 16)
                    s.sendall(_frame({"type": "step", "data": {"text": "search[tea]"}}))
                    s.shutdown(socket.SHUT_RDWR)
                with socket.create_connection((host, int(port))) as s:  # leaves mid-handshake
                    s.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
                with socket.create_connection((host, int(port))) as s:  # leaves mid-request body
                    s.sendall(b"POST /step HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 500\r\n\r\n{\"a\"")
            deadline = time.monotonic() + 10  # every slot freed
            while _http(base, "/health")[1].get("sessions", 0) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _http(base, "/health")[1].get("sessions", 0) == 0
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    noisy = [r for r in handler.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


def test_cross_site_pages_and_foreign_host_names_are_refused(url):
    """Any web page could open sessions on the local server (a WebSocket is not bound by the same-origin rule), and a
    name re-pointed at 127.0.0.1 (DNS rebinding) reached it too."""
    for origin in ("http://evil.example", "null", "https://localhost.evil.example"):
        with pytest.raises(InvalidStatus) as denied:
            _ws(url, origin=origin)
        assert denied.value.response.status_code == 403, origin
        status, _ = _http(url, "/mcp", method="POST", body=_rpc("openenv/session/create"),
                          headers={**JSON, "Origin": origin})
        assert status == 403
    for origin in ("http://localhost:3000", "http://127.0.0.1:8888", None):  # local pages and non-browsers pass
        with _ws(url, origin=origin) as ws:
            assert _call(ws, {"type": "state"})["type"] == "state"
    for host in ("evil.example", "evil.example:8000", ""):
        status, answer = _http(url, "/health", headers={"Host": host})
        assert status == 400 and "Host header" in answer["detail"], host
    assert _http(url, "/health", headers={"Host": "localhost:1234"})[0] == 200
    policy = ServePolicy(allowed_origins=("https://lab.example.org",), allowed_hosts=("lab.example.org",))
    assert policy.origin_allowed("https://lab.example.org") and not policy.origin_allowed("https://lab.example.com")
    assert policy.host_allowed("lab.example.org:8000") and not policy.host_allowed("example.org")


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--env", "shopsim/Nope-v0"], "shopsim serve exposes shopsim/Shopping-v0"),
    (["--env-kwargs", '{"catalog_size": 2000, "max_turns": "many"}'], "max_turns"),
    (["--port", "{busy}"], "is in use"),
    (["--host", "203.0.113.9"], "is not an address of this machine"),
    (["--sessions-per-client", "9"], "--sessions-per-client must be 1 to --max-sessions"),
    (["--token", "short"], "use at least 8"),
    (["--allow-origin", "evil.example"], "scheme://host[:port]"),
])
def test_serve_checks_everything_before_it_says_serving(argv, expected, busy_port, capsys, monkeypatch):
    """Each refusal is one line in the CLI's error form, and comes before the "serving" line and before any env is
    built (an env build or uvicorn start here fails the test)."""
    import uvicorn

    import shopsim.integrations.openenv as openenv
    from shopsim.app.cli import main

    def forbidden(*args, **kwargs):
        raise AssertionError("shopsim serve went on past a bad argument")

    if "--env-kwargs" not in argv:
        monkeypatch.setattr(openenv.ShoppingEnvironment, "__init__", forbidden)
    monkeypatch.setattr(uvicorn.Server, "run", forbidden)
    argv = [a.replace("{busy}", str(busy_port)) for a in argv]
    t = time.monotonic()
    code = main(["serve", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and "serving" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shopsim serve: error: ") and expected in lines[0], err
    assert time.monotonic() - t < 10


def test_serve_command_prints_serving_once_listening():
    """The "serving" line comes when the port is bound: a client that connects as soon as it reads it is served."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SHOPSIM_SERVE_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "shopsim.app.cli", "serve", "--port", "0", "--env-kwargs",
                             json.dumps(ENV_KW)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving shopsim/Shopping-v0 on http://127.0.0.1:") and "token required" in line, (
            line + proc.stderr.read() if proc.poll() is not None else line)
        base = line.split(" on ", 1)[1].split(" ", 1)[0]
        with ShoppingClient(base_url=base, token=TOKEN).sync() as client:
            assert client.reset(seed=0, task_id=5).observation.text.startswith("Task:")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in proc.stderr.read()


# ---------------------------------------------------------------------- bounded load
def _rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_load_sixteen_mixed_clients(capsys):
    """16 clients against one `shopsim serve` process for a bounded time: 10 that step as fast as they can, 3 slow
    ones (0.3 s between steps, under the idle timeout) and 3 that open a session and go silent. The server has
    13 sessions, so the idle ones must be closed for the last clients to get in: every working client finishes its
    episodes (none locked out), and the server's memory grows by a bounded amount. Prints steps/s and the growth."""
    idle_timeout, deadline_s, episodes = 3.0, 150.0, 4
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "shopsim.app.cli", "serve", "--port", "0", "--max-sessions", "13",
                             "--idle-timeout", str(idle_timeout), "--env-kwargs", json.dumps(ENV_KW)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving"), line + (proc.stderr.read() if proc.poll() is not None else "")
        base = line.split(" on ", 1)[1].split(" ", 1)[0]
        with ShoppingClient(base_url=base).sync() as warm:  # the server's caches, before the baseline
            warm.reset(seed=0, task_id=1)
        rss0 = _rss_mb(proc.pid)
        stop_at = time.monotonic() + deadline_s
        plan = [ShoppingAction(text=a) for a in ("search[tea]", "click[#1]", "back", "click[#2]", "buy")]
        done: dict[str, int] = {}
        refusals, steps = [0], [0]

        async def worker(name: str, pause: float) -> None:
            finished = 0
            while finished < episodes and time.monotonic() < stop_at:
                client = ShoppingClient(base_url=base, message_timeout_s=30)
                try:
                    await client.connect()
                    while finished < episodes:
                        result = await client.reset(seed=finished, task_id=finished + 1, family="find_and_buy")
                        for action in plan:
                            if result.done:
                                break
                            await asyncio.sleep(pause)
                            result = await client.step(action)
                            steps[0] += 1
                        finished += 1
                except (RuntimeError, ConnectionClosed) as exc:  # capacity: try again shortly, as a client would
                    assert "CAPACITY_REACHED" in str(exc) or "--max-sessions" in str(exc), exc
                    refusals[0] += 1
                    await asyncio.sleep(0.5)
                finally:
                    await client.close()
            done[name] = finished

        async def silent(i: int) -> None:
            async with ShoppingClient(base_url=base) as client:
                await client.reset(seed=i)
                await asyncio.sleep(idle_timeout * 3)  # held past the timeout: the server closes it

        async def run() -> float:
            t = time.perf_counter()
            idle = [asyncio.create_task(silent(i)) for i in range(3)]
            await asyncio.sleep(0.5)  # the idle clients hold their slots first
            await asyncio.gather(*(worker(f"fast{i}", 0.0) for i in range(10)),
                                 *(worker(f"slow{i}", 0.3) for i in range(3)))
            for task in idle:
                task.cancel()
            await asyncio.gather(*idle, return_exceptions=True)
            return time.perf_counter() - t

        wall = asyncio.run(run())
        rss1 = _rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with capsys.disabled():
        print(f"\nload: 16 clients, {steps[0]} steps in {wall:.1f} s = {steps[0] / wall:.0f} steps/s; "
              f"{refusals[0]} capacity refusals; server RSS {rss0:.0f} -> {rss1:.0f} MB ({rss1 - rss0:+.0f} MB)")
    assert done == {**{f"fast{i}": episodes for i in range(10)}, **{f"slow{i}": episodes for i in range(3)}}, done
    assert rss1 - rss0 < 300, (rss0, rss1)
