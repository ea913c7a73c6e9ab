"""What `shopsim serve` accepts from a connection before its app sees it (docs/clients.md, "Limits and access").

`ServePolicy` holds the server's limits and access rules; `GuardMiddleware` (plain ASGI, so it sees HTTP requests
and WebSocket handshakes alike) refuses, in this order:

* a ``Host`` header that is not an IP literal, ``localhost``, the bound host or one of ``allowed_hosts`` (400): a
  web page whose name was re-pointed at this machine (DNS rebinding) sends its own name there;
* an ``Origin`` header that is not localhost, 127.0.0.1, [::1], the bound host or one of ``allowed_origins`` (403):
  browsers send it on WebSocket handshakes and cross-site POSTs, so any page a user opens could otherwise use the
  server; clients that are not browsers send none and pass;
* a missing or wrong token when the policy has one (401), from ``Authorization: Bearer TOKEN`` or ``?token=TOKEN``
  (for clients that cannot set headers: browsers' WebSocket API), compared in constant time;
* an HTTP body over ``max_body_bytes`` (413), by its ``Content-Length`` or, when streamed, as it arrives.

WebSocket messages are limited to the same size by the server (uvicorn's ``ws_max_size``) and the session loop.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from shopsim.errors import ConfigError

__all__ = ["DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_MAX_BODY_BYTES", "GuardMiddleware", "ServePolicy", "TOKEN_ENV"]

#: the environment variable `shopsim serve` and `ShoppingClient` read the token from
TOKEN_ENV = "SHOPSIM_SERVE_TOKEN"
#: a session that sends nothing for this long is closed (its slot freed): long enough for an agent that thinks
#: between steps, short enough that abandoned connections do not hold the server's sessions for long
DEFAULT_IDLE_TIMEOUT_S = 300.0
#: the largest HTTP body or WebSocket message: an action is a few hundred bytes, so 1 MiB leaves ample room
DEFAULT_MAX_BODY_BYTES = 1 << 20
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARD = ("0.0.0.0", "::", "")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1)."""
    host = host.strip("[]").lower()
    return host == "localhost" or (_is_ip(host) and ipaddress.ip_address(host).is_loopback)


def _host_of(authority: str) -> str:
    """The host part of a ``Host`` header value (``example.org:8000``, ``[::1]:8000``), lowercased."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1:authority.find("]")] if "]" in authority else ""
    host, _, port = authority.rpartition(":")
    return host if host and port.isdigit() else authority


@dataclass(frozen=True)
class ServePolicy:
    """The limits and access rules of one server.

    `max_sessions`: sessions (one env each) at a time. `sessions_per_client`: of those, how many one client address
    may hold (None: all of them when the server is bound to a loopback address, where every client is this
    machine; half, rounded up, otherwise). `idle_timeout_s`: a session that sends nothing for this long is closed.
    `token`: when set, every call must carry it. `max_body_bytes`: the largest request body or WebSocket message.
    `bind_host`: the address the server listens on. `allowed_hosts` / `allowed_origins`: more ``Host`` names and
    ``Origin`` values to accept (an origin is ``scheme://host[:port]``; ``*`` accepts every origin)."""

    max_sessions: int = 8
    sessions_per_client: int | None = None
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.max_sessions, int) or self.max_sessions < 1:
            raise ConfigError(f"--max-sessions must be at least 1, got {self.max_sessions}")
        if self.sessions_per_client is not None and not 1 <= self.sessions_per_client <= self.max_sessions:
            raise ConfigError(f"--sessions-per-client must be 1 to --max-sessions ({self.max_sessions}), got "
                              f"{self.sessions_per_client}")
        if not self.idle_timeout_s > 0:
            raise ConfigError(f"--idle-timeout must be > 0 seconds, got {self.idle_timeout_s}")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ConfigError(f"--max-body-bytes must be at least 1024, got {self.max_body_bytes}")
        if self.token is not None and len(self.token) < 8:
            raise ConfigError(f"the token ({TOKEN_ENV} or --token) is {len(self.token)} characters; use at least 8 "
                              "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')")
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            if origin != "*" and (parts.scheme not in ("http", "https") or not parts.hostname or parts.path):
                raise ConfigError(f"--allow-origin {origin!r}: write an origin as scheme://host[:port], e.g. "
                                  "http://lab.example.org:3000, or * for any")

    @property
    def per_client(self) -> int:
        """The sessions one client address may hold."""
        if self.sessions_per_client is not None:
            return self.sessions_per_client
        return self.max_sessions if is_loopback(self.bind_host) else -(-self.max_sessions // 2)

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header names this server."""
        host = _host_of(header or "")
        if not host:
            return False
        if _is_ip(host) or host in _LOOPBACK_NAMES:  # an IP literal involves no name lookup to re-point
            return True
        names = {self.bind_host.lower(), *(h.lower() for h in self.allowed_hosts)}
        if self.bind_host in _WILDCARD:  # every interface: the machine's own names reach it too
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return host in names

    def origin_allowed(self, origin: str | None) -> bool:
        """Whether a request's ``Origin`` header (absent for clients that are not browsers) may use the server."""
        if origin is None:
            return True
        if "*" in self.allowed_origins:
            return True
        if origin.rstrip("/").lower() in {o.rstrip("/").lower() for o in self.allowed_origins}:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # "null" (sandboxed frames, files) and other schemes
        host = parts.hostname.lower()
        return host in _LOOPBACK_NAMES or (self.bind_host not in _WILDCARD and host == self.bind_host.lower())

    def token_ok(self, authorization: str | None, query_token: str | None) -> bool:
        """Whether a request carries the policy's token (always true without one)."""
        if self.token is None:
            return True
        given = None
        if authorization and authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip()
        elif query_token is not None:
            given = query_token
        # compare_digest takes as long whatever the first differing byte, so timing tells nothing of the token
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())


class GuardMiddleware:
    """ASGI middleware applying a `ServePolicy`'s Host, Origin, token and body-size rules (module docstring)."""

    def __init__(self, app, policy: ServePolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _deny(scope, receive, send, *refusal)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        limit = self.policy.max_body_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _deny(scope, receive, send, 413, f"the request body is {int(length)} bytes; this server takes at "
                                                   f"most {limit}")
            return
        # read the whole body here (bodies are small), so a streamed one over the limit is refused whether or not
        # the route would have read it, then hand it to the app as one message
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left mid-body: nobody to answer
                return
            body += message.get("body", b"")
            if len(body) > limit:
                await _deny(scope, receive, send, 413, f"the request body is over {limit} bytes, the most this "
                                                       "server takes")
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    def _refusal(self, scope, headers: dict[str, str]) -> tuple[int, str] | None:
        p = self.policy
        if not p.host_allowed(headers.get("host")):
            return 400, ("the Host header does not name this server; connect by IP address, localhost or a name "
                         "the server was started with (shopsim serve --allow-host NAME)")
        if not p.origin_allowed(headers.get("origin")):
            return 403, (f"requests from the web page at {headers.get('origin')} are refused; start the server "
                         "with --allow-origin ORIGIN to let that page use it")
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if not p.token_ok(headers.get("authorization"), (query.get("token") or [None])[0]):
            return 401, (f"this server needs its token: send 'Authorization: Bearer TOKEN' (ShoppingClient(..., "
                         f"token=...) or {TOKEN_ENV} in the client's environment)")
        return None


async def _deny(scope, receive, send, status: int, detail: str) -> None:
    """Answer `status` with ``{"detail": ...}``; a WebSocket handshake gets the same HTTP answer where the server
    supports it (uvicorn does), else a close."""
    body = json.dumps({"detail": detail}).encode()
    headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    message = await receive()  # the handshake ("websocket.connect") comes before any answer
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})


def client_address(scope: dict[str, Any]) -> str:
    """The peer address of a connection (the server does not trust forwarding headers, so this is the socket's)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"
