"""``tidal serve`` and ``tidal call``: the one console script."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from .config import Config


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be an integer, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {port}")
    return port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidal", description="tidal: a signal server with an instant, durable leave switch."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument(
        "--host",
        default=_env("TIDAL_HOST", "127.0.0.1"),
        help="address to listen on (env TIDAL_HOST; default 127.0.0.1)",
    )
    serve.add_argument(
        "--port",
        type=_port,
        default=_env("TIDAL_PORT", "7411"),
        help="TCP port, 0 for any free one (env TIDAL_PORT; default 7411)",
    )
    serve.add_argument(
        "--db",
        default=_env("TIDAL_DB", "./tidal.db"),
        help="SQLite database file (env TIDAL_DB; default ./tidal.db)",
    )
    serve.add_argument(
        "--durability",
        choices=("full", "normal"),
        default=_env("TIDAL_DURABILITY", "full"),
        help="full: fsync every group commit, survives power loss; normal: survives a crash"
        " of the process, not of the machine (env TIDAL_DURABILITY; default full)",
    )
    serve.add_argument(
        "--log-level",
        default=_env("TIDAL_LOG_LEVEL", "info"),
        choices=("debug", "info", "warning", "error"),
        help="(env TIDAL_LOG_LEVEL; default info)",
    )

    call = commands.add_parser(
        "call",
        help="call one method and print its result as JSON",
        description='Arguments are read as JSON where they parse (42, true, [1], {"a": 1}),'
        " as strings otherwise. Exit status 1 on an error reply, 2 on a connection failure.",
    )
    call.add_argument("method")
    call.add_argument("args", nargs="*")
    call.add_argument("--host", default=_env("TIDAL_HOST", "127.0.0.1"), help="(env TIDAL_HOST)")
    call.add_argument(
        "--port", type=_port, default=_env("TIDAL_PORT", "7411"), help="(env TIDAL_PORT)"
    )
    call.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return _call(args)


def _serve(args: argparse.Namespace) -> int:
    from .app import run

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    run(Config(host=args.host, port=args.port, db=args.db, durability=args.durability))
    return 0


def _arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _call(args: argparse.Namespace) -> int:
    from tidal.client import Client, ServerError, TidalError

    async def go() -> Any:
        async with await Client.connect(args.host, args.port, timeout=args.timeout) as client:
            return await client.call(args.method, *[_arg(a) for a in args.args])

    try:
        result = asyncio.run(go())
    except ServerError as exc:
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except (TidalError, OSError) as exc:
        print(f"cannot reach tidal at {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, default=_json_default))
    return 0


def _json_default(value: object) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


if __name__ == "__main__":
    sys.exit(main())
