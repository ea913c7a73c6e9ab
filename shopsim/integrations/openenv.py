"""The shopping env behind an OpenEnv (``openenv-core``) server, with typed action, observation and state models.

OpenEnv serves an environment as a FastAPI app: each WebSocket session (``/ws``) gets its own environment instance
built by a factory, and clients (`openenv.core.EnvClient` subclasses) send ``reset`` / ``step`` / ``state``
messages whose payloads are the pydantic models below. This module provides

* `ShoppingAction`: one action, either the text grammar (``text="search[hiking boots]"``) or a tool call
  (``tool="search", arguments={"query": "hiking boots"}``), exactly one of the two (the tools are
  `ShoppingEnv`'s table, `shopsim.envs.shopping.tools`);
* `ShoppingObservation`: the rendered page and what ``info`` says about the step (valid actions, the invalid-action
  reason and kind, score, success, end reason, episode metrics; the tool schemas on reset). The privileged
  ``info["oracle"]`` (the hidden goal) is never sent;
* `ShoppingState`: episode id, step count, task, return so far;
* `ShoppingEnvironment`: the server-side `openenv.core.env_server.interfaces.Environment` around one `ShoppingEnv`.
  Instances share nothing mutable (the memoised catalog and search index are read-only), so
  ``SUPPORTS_CONCURRENT_SESSIONS`` is True and one server holds many sessions;
* `ShoppingClient`: the `EnvClient` for it (async; ``.sync()`` for a blocking client; ``token=`` for a server that
  has one);
* `create_shopping_app` / `serve`: the app and a uvicorn runner, which ``shopsim serve --env <env id>
  --port P`` calls; `background_server` runs the same app on a thread of this process (tests, benchmarks,
  notebooks). The app speaks OpenEnv's WebSocket protocol on ``/ws`` (one env per session) within the limits of a
  `ServePolicy` (`shopsim.integrations.serve_guard`): at most ``max_sessions`` sessions and ``per_client`` of them
  per client address, a session idle for ``idle_timeout_s`` closed, a size limit on requests and messages, Host and
  Origin checks, and an optional token. A session belongs to its WebSocket: only that connection ends it (a
  ``close`` message or disconnecting), and there is no call that names another session. HTTP ``/reset``,
  ``/step`` and ``/state`` would have no session to keep the episode in, so they answer 400 saying to use ``/ws``.

An action the env rejects (unknown tool, bad arguments, not applicable on this page) is an in-episode invalid
action, as in the Gymnasium env: the observation's ``invalid_action`` holds the reason and the episode goes on.
A payload that is not a `ShoppingAction` (unknown fields, neither or both of ``text`` / ``tool``) is refused by the
server's validation instead, and the client raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import WebSocket
from fastapi.responses import JSONResponse
from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from shopsim.envs.records import SHOPPING
from shopsim.errors import ConfigError
from shopsim.integrations.serve_guard import TOKEN_ENV, GuardMiddleware, ServePolicy, client_address, is_loopback

__all__ = ["SERVABLE", "ServePolicy", "ShoppingAction", "ShoppingClient", "ShoppingEnvironment",
           "ShoppingObservation", "ShoppingState", "background_server", "create_shopping_app", "prepare_server",
           "serve"]

#: env ids `serve` can expose: the shopping env, whose `ShoppingEnvironment` this module defines
SERVABLE = (SHOPPING.id,)


class ShoppingAction(Action):
    """One shopping-env action: ``text`` (the text grammar or a JSON tool-call string) or ``tool`` + ``arguments``."""

    text: str | None = Field(default=None, description="An action in the text grammar, e.g. 'search[boots]'")
    tool: str | None = Field(default=None, description="A tool name, e.g. 'search'")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments by name")

    @model_validator(mode="after")
    def _one_form(self):
        # a PydanticCustomError (not a ValueError) so that the server can send the validation error back as JSON
        if (self.text is None) == (self.tool is None):
            raise PydanticCustomError("action_form", "give exactly one of text (the text grammar) or tool "
                                                     "(+ arguments)")
        if self.text is not None and self.arguments:
            raise PydanticCustomError("action_form", "arguments go with tool, not with text")
        return self

    def to_env(self) -> str:
        """The action string `ShoppingEnv.step` reads."""
        if self.text is not None:
            return self.text
        return json.dumps({"name": self.tool, "arguments": self.arguments}, ensure_ascii=False)


class ShoppingObservation(Observation):
    """The page after a reset or step, and the step's outcome (``reward`` / ``done`` are the base fields)."""

    text: str = Field(default="", description="The page rendered as text")
    valid_actions: list[str] = Field(default_factory=list, description="Text forms valid now ([...] = template)")
    invalid_action: str | None = Field(default=None, description="Why the action was invalid; None if valid")
    invalid_kind: str | None = Field(default=None, description="'parse' or 'tool' for an invalid action")
    score: float = Field(default=0.0, description="The episode score (set when it ends)")
    success: bool = Field(default=False, description="score == 1 at the end")
    task_id: int = Field(default=-1, description="The task id")
    family: str = Field(default="", description="The task family")
    split: str = Field(default="", description="The task's split")
    end_reason: str | None = Field(default=None, description="Why the episode ended")
    episode_metrics: dict[str, float] | None = Field(default=None, description="Per-episode metrics at the end")
    tools: list[dict] | None = Field(default=None, description="OpenAI-style tool schemas (on reset)")


class ShoppingState(State):
    """Server-side episode state (``episode_id`` and ``step_count`` are the base fields)."""

    task_id: int | None = None
    family: str | None = None
    split: str | None = None
    done: bool = False
    total_reward: float = 0.0


class ShoppingEnvironment(Environment[ShoppingAction, ShoppingObservation, ShoppingState]):
    """One `ShoppingEnv` per session; constructor keywords are `ShoppingEnv`'s (``catalog_size``, ``family``...)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, **env_kwargs):
        super().__init__()
        from shopsim.envs.shopping import ShoppingEnv

        self.env = ShoppingEnv(**env_kwargs)
        self._state = ShoppingState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, split: str | None = None,
              task_id: int | None = None, family: str | None = None, strategy: str | None = None
              ) -> ShoppingObservation:
        """Start an episode; `split`, `task_id`, `family`, `strategy` are the shopping env's reset options."""
        options = {k: v for k, v in (("split", split), ("task_id", task_id), ("family", family),
                                     ("strategy", strategy)) if v is not None}
        obs, info = self.env.reset(seed=seed, options=options)
        self._state = ShoppingState(episode_id=episode_id or uuid.uuid4().hex, step_count=0,
                                    task_id=info["task_id"], family=info["family"], split=info["split"])
        return self._observation(obs, None, False, info, tools=self.env.tool_schemas)

    def step(self, action: ShoppingAction, timeout_s: float | None = None, **kwargs) -> ShoppingObservation:
        if self.env.task is None:
            raise RuntimeError("no episode: send reset first")
        if self._state.done:
            raise RuntimeError("the episode has ended; send reset to start another")
        obs, reward, terminated, truncated, info = self.env.step(action.to_env())
        done = bool(terminated or truncated)
        self._state.step_count += 1
        self._state.total_reward += reward
        self._state.done = done
        return self._observation(obs, reward, done, info)

    @property
    def state(self) -> ShoppingState:
        return self._state

    @staticmethod
    def _observation(text: str, reward: float | None, done: bool, info: dict, tools=None) -> ShoppingObservation:
        return ShoppingObservation(
            text=text, reward=reward, done=done, valid_actions=list(info.get("valid_actions", [])),
            invalid_action=info.get("invalid_action"), invalid_kind=info.get("invalid_kind"),
            score=float(info.get("score", 0.0)), success=bool(info.get("success", False)),
            task_id=int(info["task_id"]), family=str(info["family"]), split=str(info["split"]),
            end_reason=info.get("end_reason"), episode_metrics=info.get("episode_metrics"), tools=tools)


class ShoppingClient(EnvClient[ShoppingAction, ShoppingObservation, ShoppingState]):
    """Client of a `shopsim serve` server: ``ShoppingClient(base_url="http://localhost:8000").sync()``.

    `token`: the server's token (default: the ``SHOPSIM_SERVE_TOKEN`` environment variable), sent as
    ``Authorization: Bearer`` on the WebSocket handshake; other keywords are `EnvClient`'s."""

    _ws: Any  # EnvClient's WebSocket connection (None until connected); openenv ships no type information

    def __init__(self, base_url: str, *, token: str | None = None, **kwargs) -> None:
        super().__init__(base_url, **kwargs)
        self._token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)

    async def connect(self) -> ShoppingClient:
        if self._ws is not None or self._token is None:
            return await super().connect()
        # EnvClient.connect sends no headers; this is its connection with the token added
        from websockets.asyncio.client import connect as ws_connect

        # a local server is reached directly, not through a configured proxy (EnvClient sets NO_PROXY for that)
        local = is_loopback(urlsplit(self._ws_url).hostname or "")
        try:
            self._ws = await ws_connect(self._ws_url, open_timeout=self._connect_timeout,
                                        max_size=self._max_message_size, proxy=None if local else True,
                                        additional_headers={"Authorization": f"Bearer {self._token}"})
        except Exception as exc:
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    def _step_payload(self, action: ShoppingAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"}, exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ShoppingObservation]:
        fields = dict(payload.get("observation", {}))
        obs = ShoppingObservation(**fields, reward=payload.get("reward"), done=payload.get("done", False))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> ShoppingState:
        return ShoppingState(**payload)


# ---------------------------------------------------------------------- the server
#: the keywords a ``reset`` message may carry (`ShoppingEnvironment.reset`)
RESET_OPTIONS = ("seed", "episode_id", "split", "task_id", "family", "strategy")
#: the answer to HTTP /reset, /step and /state: an HTTP call has no session to keep an episode in
HTTP_NO_SESSION = ("this server keeps episodes in WebSocket sessions only: connect to /ws (e.g. with "
                   "shopsim.integrations.openenv.ShoppingClient); HTTP /reset, /step and /state have no session")
_logger = logging.getLogger(__name__)


class SessionRefused(Exception):
    """A new session would exceed `ServePolicy.max_sessions` or `ServePolicy.per_client`; `reason` is the short
    form for the WebSocket close frame (at most 123 bytes)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SessionTable:
    """The open sessions (id -> client address) within a `ServePolicy`'s limits.

    Only the server's event loop touches it, and `open` checks and reserves without awaiting, so two handshakes
    cannot both take the last slot."""

    def __init__(self, policy: ServePolicy) -> None:
        self.policy = policy
        self.owners: dict[str, str] = {}

    def open(self, client: str) -> str:
        """Reserve a session for `client` and return its id; raise `SessionRefused` saying which limit is hit."""
        p = self.policy
        if len(self.owners) >= p.max_sessions:
            raise SessionRefused(f"the server holds {p.max_sessions} sessions, its --max-sessions; connect again "
                                 f"when one ends (a session idle for {p.idle_timeout_s:g} s ends)",
                                 f"all {p.max_sessions} sessions in use (--max-sessions); try again later")
        held = sum(owner == client for owner in self.owners.values())
        if held >= p.per_client:
            raise SessionRefused(f"this client ({client}) holds {held} sessions, the most one client may "
                                 f"(--sessions-per-client {p.per_client}); close one before opening another",
                                 f"this client holds {held} sessions (--sessions-per-client); close one first")
        sid = uuid.uuid4().hex
        self.owners[sid] = client
        return sid

    def close(self, sid: str) -> None:
        self.owners.pop(sid, None)


def _error(message: str, code, **extra) -> str:
    from openenv.core.env_server.types import WSErrorResponse

    return WSErrorResponse(data={"message": message, "code": str(code.value), **extra}).model_dump_json()


async def _answer(env: ShoppingEnvironment, raw: str) -> str | None:
    """The reply to one session message (None for ``close``): an observation, the state, or an error that names
    what to change; the session goes on after an error."""
    from openenv.core.env_server.serialization import deserialize_action, serialize_observation
    from openenv.core.env_server.types import (
        WSErrorCode,
        WSObservationResponse,
        WSResetMessage,
        WSStateMessage,
        WSStateResponse,
        WSStepMessage,
    )
    from pydantic import ValidationError

    try:
        message = json.loads(raw)
    except ValueError as exc:
        return _error(f"the message is not JSON ({exc})", WSErrorCode.INVALID_JSON)
    if not isinstance(message, dict):
        return _error("a message is a JSON object whose 'type' is reset, step, state or close",
                      WSErrorCode.INVALID_JSON)
    kind = message.get("type")
    try:
        if kind == "reset":
            options = WSResetMessage.model_validate(message).data
            unknown = sorted(set(options) - set(RESET_OPTIONS))
            if unknown:
                return _error(f"unknown reset option(s) {', '.join(map(str, unknown))}; the shopping env takes "
                              f"{', '.join(RESET_OPTIONS)}", WSErrorCode.VALIDATION_ERROR)
            obs = await asyncio.to_thread(env.reset, **options)
        elif kind == "step":
            action = deserialize_action(WSStepMessage.model_validate(message).data, ShoppingAction)
            obs = await asyncio.to_thread(env.step, action)
        elif kind == "state":
            WSStateMessage.model_validate(message)
            return WSStateResponse(data=env.state.model_dump()).model_dump_json()
        elif kind == "close":
            return None
        else:
            return _error(f"unknown message type {kind!r}: send reset, step, state or close (this server has no MCP "
                          "tools)", WSErrorCode.UNKNOWN_TYPE)
    except ValidationError as exc:
        return _error("Invalid message", WSErrorCode.VALIDATION_ERROR,
                      errors=exc.errors(include_url=False, include_context=False))
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:  # the env's refusal: no episode, bad option
        return _error(str(exc) or type(exc).__name__, WSErrorCode.EXECUTION_ERROR)
    except Exception as exc:  # a fault of the server: answer, and keep its traceback for whoever runs it
        _logger.exception("shopsim serve: a %s message failed", kind)
        return _error(f"the server failed on this message ({type(exc).__name__}: {exc})", WSErrorCode.EXECUTION_ERROR)
    return WSObservationResponse(data=serialize_observation(obs)).model_dump_json()


async def _close_quietly(websocket, code: int = 1000, reason: str = "") -> None:
    """Close `websocket` unless the client already has (then there is nobody to tell)."""
    from starlette.websockets import WebSocketDisconnect, WebSocketState

    if websocket.application_state != WebSocketState.CONNECTED:
        return
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await websocket.close(code=code, reason=reason[:120])


async def _run_session(websocket, factory, table: SessionTable) -> None:
    """One WebSocket session: reserve a slot, build the env, answer messages until the client closes, disconnects
    or stays idle for `ServePolicy.idle_timeout_s`; then free the slot. A client that goes away is the normal end
    of a session, so it is logged nowhere."""
    from openenv.core.env_server.types import WSErrorCode
    from starlette.websockets import WebSocketDisconnect

    policy = table.policy
    await websocket.accept()
    try:
        sid = table.open(client_address(websocket.scope))
    except SessionRefused as exc:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_text(_error(str(exc), WSErrorCode.CAPACITY_REACHED))
        await _close_quietly(websocket, 1013, exc.reason)
        return
    env = None
    try:
        env = await asyncio.to_thread(factory)
        while True:
            try:
                message = await asyncio.wait_for(websocket.receive(), policy.idle_timeout_s)
            except TimeoutError:
                await _close_quietly(websocket, 1001, f"idle for {policy.idle_timeout_s:g} s; connect again for a "
                                                      "new session")
                break
            if message["type"] == "websocket.disconnect":
                break
            raw = message.get("text")
            if raw is None:
                raw = (message.get("bytes") or b"").decode("utf-8", "replace")
            if len(raw) > policy.max_body_bytes:
                await websocket.send_text(_error(f"a message is at most {policy.max_body_bytes} bytes",
                                                 WSErrorCode.VALIDATION_ERROR))
                await _close_quietly(websocket, 1009, "message too big")
                break
            reply = await _answer(env, raw)
            if reply is None:
                await _close_quietly(websocket)
                break
            await websocket.send_text(reply)
    except WebSocketDisconnect:  # the client left while its answer was being computed
        pass
    finally:
        table.close(sid)
        if env is not None:
            env.close()


def _check_app_args(env_id: str, env_kwargs: dict) -> None:
    if env_id not in SERVABLE:
        raise ConfigError(f"--env {env_id}: shopsim serve exposes {', '.join(SERVABLE)} (the numeric envs have "
                          "no OpenEnv models yet)")
    from shopsim.envs import check_env_kwargs

    check_env_kwargs(env_id, env_kwargs, what="--env-kwargs")


def create_shopping_app(env_id: str = SHOPPING.id, *, max_concurrent_envs: int = 8,
                        policy: ServePolicy | None = None, warm: bool = True, **env_kwargs):
    """The FastAPI app serving `env_id`: one env per WebSocket session (``/ws``, the OpenEnv protocol's reset /
    step / state / close messages), within `policy`'s limits and access rules (default: ``ServePolicy(
    max_sessions=max_concurrent_envs)``); ``/health``, ``/schema`` and ``/metadata`` over HTTP. HTTP ``/reset``,
    ``/step`` and ``/state`` answer 400 (`HTTP_NO_SESSION`). `warm` builds one env first, so that options the env
    refuses fail here and the first session does not wait for the catalog."""
    from fastapi import FastAPI
    from openenv.core.env_server.types import EnvironmentMetadata, SchemaResponse

    from shopsim import __version__

    _check_app_args(env_id, env_kwargs)
    policy = policy or ServePolicy(max_sessions=max_concurrent_envs)
    factory = functools.partial(ShoppingEnvironment, **env_kwargs)
    if warm:
        try:
            factory().close()
        except (ValueError, TypeError) as exc:  # ShopsimError is a ValueError
            raise ConfigError(f"--env-kwargs: {exc}") from None
    table = SessionTable(policy)
    app = FastAPI(title=f"shopsim serve: {env_id}", version=__version__,
                  description="OpenEnv sessions over the WebSocket /ws (docs/clients.md)")
    app.state.sessions = table

    @app.get("/health")
    async def health() -> dict:
        return {"status": "healthy", "sessions": len(table.owners), "max_sessions": policy.max_sessions}

    @app.get("/schema")
    async def schema() -> dict:
        return SchemaResponse(action=ShoppingAction.model_json_schema(),
                              observation=ShoppingObservation.model_json_schema(),
                              state=ShoppingState.model_json_schema()).model_dump()

    @app.get("/metadata")
    async def metadata() -> dict:
        return EnvironmentMetadata(name=env_id, description="shopsim's simulated shop: find, clarify, bundle and "
                                   "after-sales tasks behind a text page and a tool table", version=__version__,
                                   documentation_url=None).model_dump()

    async def no_session() -> JSONResponse:
        return JSONResponse({"detail": HTTP_NO_SESSION}, status_code=400)

    app.add_api_route("/reset", no_session, methods=["POST"], include_in_schema=False)
    app.add_api_route("/step", no_session, methods=["POST"], include_in_schema=False)
    app.add_api_route("/state", no_session, methods=["GET"], include_in_schema=False)

    @app.websocket("/ws")
    async def session(websocket: WebSocket) -> None:  # FastAPI reads the annotation: WebSocket is a module name
        await _run_session(websocket, factory, table)

    app.add_middleware(GuardMiddleware, policy=policy)
    return app


def bind_port(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port` (0: a free port), or `ConfigError` saying what to change."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)  # SO_REUSEADDR, as uvicorn binds
    except socket.gaierror:
        raise ConfigError(f"--host {host}: no such address; use 127.0.0.1 (this machine only) or 0.0.0.0 (every "
                          "interface)") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use (another server, or an earlier shopsim serve); "
                              "choose another --port or stop that process") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"--host {host} is not an address of this machine; use 127.0.0.1 (this machine only) "
                              "or 0.0.0.0 (every interface)") from None
        if exc.errno == errno.EACCES:
            raise ConfigError(f"port {port} needs administrator rights; choose --port 1024 or above") from None
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --host or --port") from None


def prepare_server(env_id: str = SHOPPING.id, *, host: str = "127.0.0.1", port: int = 8000,
                   policy: ServePolicy | None = None, log_level: str = "warning", **env_kwargs):
    """Everything `serve` does before serving: check the env id and options, bind the port, build the app (and
    one env). Returns ``(uvicorn.Server, socket)``; ``server.run(sockets=[sock])`` serves. Every refusal is a
    `ConfigError`, raised before anything listens for longer than this call."""
    import uvicorn

    policy = policy or ServePolicy(bind_host=host)
    _check_app_args(env_id, env_kwargs)  # the cheap checks before the port, the port before the slow env build
    sock = bind_port(host, port)
    try:
        app = create_shopping_app(env_id, policy=policy, **env_kwargs)
    except BaseException:
        sock.close()
        raise
    # proxy_headers off: a client's address is its socket's, which no header can change (per-client limits)
    config = uvicorn.Config(app, host=host, port=sock.getsockname()[1], log_level=log_level, proxy_headers=False,
                            ws_max_size=policy.max_body_bytes, server_header=False)
    return uvicorn.Server(config), sock


def serve(env_id: str = SHOPPING.id, *, host: str = "127.0.0.1", port: int = 8000,
          max_concurrent_envs: int = 8, log_level: str = "warning", policy: ServePolicy | None = None,
          **env_kwargs) -> None:
    """Serve `env_id` with uvicorn until interrupted (`prepare_server`, then run)."""
    policy = policy or ServePolicy(max_sessions=max_concurrent_envs, bind_host=host)
    server, sock = prepare_server(env_id, host=host, port=port, policy=policy, log_level=log_level, **env_kwargs)
    server.run(sockets=[sock])


@contextlib.contextmanager
def background_server(env_id: str = SHOPPING.id, *, host: str = "127.0.0.1", port: int = 0,
                      max_concurrent_envs: int = 8, startup_timeout_s: float = 60.0,
                      policy: ServePolicy | None = None, **env_kwargs) -> Iterator[str]:
    """Run the server on a daemon thread of this process; yields its base URL (``port=0``: a free port) and stops
    the server on exit. `policy` defaults to ``ServePolicy(max_sessions=max_concurrent_envs)``."""
    import threading

    policy = policy or ServePolicy(max_sessions=max_concurrent_envs, bind_host=host)
    server, sock = prepare_server(env_id, host=host, port=port, policy=policy, **env_kwargs)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="shopsim-openenv", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the OpenEnv server did not start on {host}:{port}")
        time.sleep(0.02)
    bound = sock.getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
