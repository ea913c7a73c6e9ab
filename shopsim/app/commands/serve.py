"""`shopsim serve`: expose an env through an OpenEnv (``openenv-core``) server (`shopsim.integrations.openenv`)."""

from __future__ import annotations

import argparse

from shopsim.app.commands import positive_int


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def add_parser(sub) -> None:
    from shopsim.envs.record import text_env_ids
    from shopsim.integrations.serve_guard import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, TOKEN_ENV

    p = sub.add_parser("serve", help="serve an env to OpenEnv clients over HTTP/WebSocket",
                       description="Run an OpenEnv server for the env: each WebSocket session (/ws) gets its own "
                                   "env; clients send typed reset/step/state messages "
                                   "(shopsim.integrations.openenv.ShoppingClient). Needs shopsim[openenv]. "
                                   "docs/clients.md describes the limits and access rules.")
    p.add_argument("--env", default=text_env_ids()[0], help="env id: a text env (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    p.add_argument("--port", type=_port, default=8000, help="TCP port (0: a free one)")
    p.add_argument("--max-sessions", type=positive_int, default=8, help="concurrent sessions (one env each)")
    p.add_argument("--sessions-per-client", type=positive_int, default=None, metavar="N",
                   help="sessions one client address may hold (default: all of --max-sessions when bound to a "
                        "loopback address, where every client is this machine; half of them otherwise)")
    p.add_argument("--idle-timeout", type=_seconds, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                   help="close a session that sends nothing for this long, freeing its slot "
                        f"(default {DEFAULT_IDLE_TIMEOUT_S:g})")
    p.add_argument("--token", default=None,
                   help=f"require this token on every call (default: ${TOKEN_ENV} if set; prefer the variable, "
                        "which other users cannot read from the process list)")
    p.add_argument("--max-body-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
                   help=f"largest HTTP request body or WebSocket message (default {DEFAULT_MAX_BODY_BYTES})")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also accept this name in the Host header (IP addresses, localhost and --host always pass)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="also accept calls from web pages of this origin, e.g. http://lab.example.org:3000 (* for "
                        "any); pages on localhost always pass")
    p.add_argument("--env-kwargs", default=None, metavar="JSON",
                   help='env constructor options as JSON, e.g. \'{"catalog_size": 2000, "max_turns": 20}\'')
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from shopsim.app.commands.eval import _parse_env_kwargs
    from shopsim.errors import ShopsimError

    try:
        from shopsim.integrations.openenv import ServePolicy, prepare_server
        from shopsim.integrations.serve_guard import TOKEN_ENV, is_loopback
    except ModuleNotFoundError as exc:
        raise ShopsimError(f"shopsim serve needs openenv-core ({exc.name} is missing); "
                           "pip install 'shopsim[openenv]'") from None
    env_kwargs = _parse_env_kwargs(args.env_kwargs) or {}
    token = args.token if args.token is not None else (os.environ.get(TOKEN_ENV) or None)
    policy = ServePolicy(max_sessions=args.max_sessions, sessions_per_client=args.sessions_per_client,
                         idle_timeout_s=args.idle_timeout, token=token, max_body_bytes=args.max_body_bytes,
                         bind_host=args.host, allowed_hosts=tuple(args.allow_host),
                         allowed_origins=tuple(args.allow_origin))
    # every check (env id, options, port, one env built) happens here, before the line that says it serves
    server, sock = prepare_server(args.env, host=args.host, port=args.port, policy=policy, log_level=args.log_level,
                                  **env_kwargs)
    port = sock.getsockname()[1]
    print(f"serving {args.env} on http://{args.host}:{port} (OpenEnv; WebSocket /ws, up to {policy.max_sessions} "
          f"sessions, {policy.per_client} per client, idle ones closed after {policy.idle_timeout_s:g} s"
          f"{', token required' if token else ''}); Ctrl-C stops", flush=True)
    if token is None and not is_loopback(args.host):
        print(f"note: --host {args.host} without a token: anyone who can reach this machine can use the server; "
              f"set {TOKEN_ENV} (docs/clients.md)", flush=True)
    server.run(sockets=[sock])
    return 0
