"""Shopping-v0 behind an OpenEnv (``openenv-core``) server, with typed action, observation and state models.

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
* `ShoppingClient`: the `EnvClient` for it (async; ``.sync()`` for a blocking client);
* `create_shopping_app` / `serve`: the app (`openenv.core.env_server.http_server.create_fastapi_app`) and a
  uvicorn runner, which ``shopsim serve --env shopsim/Shopping-v0 --port P`` calls; `background_server` runs the
  same app on a thread of this process (tests, benchmarks, notebooks).

An action the env rejects (unknown tool, bad arguments, not applicable on this page) is an in-episode invalid
action, as in the Gymnasium env: the observation's ``invalid_action`` holds the reason and the episode goes on.
A payload that is not a `ShoppingAction` (unknown fields, neither or both of ``text`` / ``tool``) is refused by the
server's validation instead, and the client raises.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from shopsim.errors import ConfigError

__all__ = ["SERVABLE", "ShoppingAction", "ShoppingClient", "ShoppingEnvironment", "ShoppingObservation",
           "ShoppingState", "background_server", "create_shopping_app", "serve"]

#: env ids `serve` can expose
SERVABLE = ("shopsim/Shopping-v0",)


class ShoppingAction(Action):
    """One Shopping-v0 action: ``text`` (the text grammar or a JSON tool-call string) or ``tool`` + ``arguments``."""

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
        """Start an episode; `split`, `task_id`, `family`, `strategy` are Shopping-v0's reset options."""
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
    """Client of a `shopsim serve` server: ``ShoppingClient(base_url="http://localhost:8000").sync()``."""

    def _step_payload(self, action: ShoppingAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"}, exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ShoppingObservation]:
        fields = dict(payload.get("observation", {}))
        obs = ShoppingObservation(**fields, reward=payload.get("reward"), done=payload.get("done", False))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> ShoppingState:
        return ShoppingState(**payload)


def create_shopping_app(env_id: str = "shopsim/Shopping-v0", *, max_concurrent_envs: int = 8, **env_kwargs):
    """The OpenEnv FastAPI app serving `env_id` (one env per WebSocket session, at most `max_concurrent_envs`)."""
    from openenv.core.env_server.http_server import create_fastapi_app

    if env_id not in SERVABLE:
        raise ConfigError(f"--env {env_id}: shopsim serve exposes {', '.join(SERVABLE)} (the numeric envs have "
                          "no OpenEnv models yet)")
    if max_concurrent_envs < 1:
        raise ConfigError(f"max_concurrent_envs must be >= 1, got {max_concurrent_envs}")
    from shopsim.envs import check_env_kwargs

    check_env_kwargs(env_id, env_kwargs, what="--env-kwargs")  # fail here, not in the first session
    factory = functools.partial(ShoppingEnvironment, **env_kwargs)
    return create_fastapi_app(factory, ShoppingAction, ShoppingObservation, max_concurrent_envs=max_concurrent_envs)


def serve(env_id: str = "shopsim/Shopping-v0", *, host: str = "127.0.0.1", port: int = 8000,
          max_concurrent_envs: int = 8, log_level: str = "warning", **env_kwargs) -> None:
    """Run the app with uvicorn until interrupted."""
    import uvicorn

    app = create_shopping_app(env_id, max_concurrent_envs=max_concurrent_envs, **env_kwargs)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


@contextlib.contextmanager
def background_server(env_id: str = "shopsim/Shopping-v0", *, host: str = "127.0.0.1", port: int = 0,
                      max_concurrent_envs: int = 8, startup_timeout_s: float = 60.0, **env_kwargs) -> Iterator[str]:
    """Run the app with uvicorn on a daemon thread; yields its base URL (``port=0``: a free port) and stops the
    server on exit."""
    import threading

    import uvicorn

    app = create_shopping_app(env_id, max_concurrent_envs=max_concurrent_envs, **env_kwargs)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="shopsim-openenv", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the OpenEnv server did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
