"""`shopsim serve`: expose an env through an OpenEnv (``openenv-core``) server (`shopsim.integrations.openenv`)."""

from __future__ import annotations

import argparse

from shopsim.commands import positive_int


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve an env to OpenEnv clients over HTTP/WebSocket",
                       description="Run an OpenEnv server for the env: each WebSocket session (/ws) gets its own "
                                   "env; clients send typed reset/step/state messages "
                                   "(shopsim.integrations.openenv.ShoppingClient). Needs shopsim[openenv].")
    p.add_argument("--env", default="shopsim/Shopping-v0", help="env id (shopsim/Shopping-v0)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    p.add_argument("--port", type=_port, default=8000, help="TCP port")
    p.add_argument("--max-sessions", type=positive_int, default=8, help="concurrent sessions (one env each)")
    p.add_argument("--env-kwargs", default=None, metavar="JSON",
                   help='env constructor options as JSON, e.g. \'{"catalog_size": 2000, "max_turns": 20}\'')
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shopsim.commands.eval import _parse_env_kwargs
    from shopsim.errors import ShopsimError

    try:
        from shopsim.integrations.openenv import serve
    except ModuleNotFoundError as exc:
        raise ShopsimError(f"shopsim serve needs openenv-core ({exc.name} is missing); "
                           "pip install 'shopsim[openenv]'") from None
    env_kwargs = _parse_env_kwargs(args.env_kwargs) or {}
    print(f"serving {args.env} on http://{args.host}:{args.port} (OpenEnv; WebSocket /ws, up to "
          f"{args.max_sessions} sessions); Ctrl-C stops", flush=True)
    serve(args.env, host=args.host, port=args.port, max_concurrent_envs=args.max_sessions,
          log_level=args.log_level, **env_kwargs)
    return 0
