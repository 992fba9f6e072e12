"""``tidal serve`` and ``tidal call``: the one console script."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import sqlite3
import ssl
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from .config import Config

T = TypeVar("T")


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
    setting = functools.partial(_setting, serve)
    setting("--host", "TIDAL_HOST", "127.0.0.1", "address to listen on")
    setting("--port", "TIDAL_PORT", "7411", "TCP port, 0 for any free one", type=_port)
    setting("--db", "TIDAL_DB", "./tidal.db", "SQLite database file")
    setting(
        "--durability",
        "TIDAL_DURABILITY",
        "full",
        "full: fsync every group commit, survives power loss; normal: survives a crash of"
        " the process, not of the machine",
        choices=("full", "normal"),
    )
    setting(
        "--token", "TIDAL_TOKEN", None, "require auth(token) as each connection's first request"
    )
    setting("--tls-cert", "TIDAL_TLS_CERT", None, "PEM certificate (chain): serve TLS only")
    setting("--tls-key", "TIDAL_TLS_KEY", None, "PEM key")
    serve.add_argument(
        "--insecure",
        action="store_true",
        default=_env("TIDAL_INSECURE", "") not in ("", "0"),
        help="allow listening beyond loopback without a token (env TIDAL_INSECURE=1)",
    )
    setting(
        "--max-connections",
        "TIDAL_MAX_CONNECTIONS",
        "10000",
        "connections past this are told so and closed",
        type=int,
    )
    setting(
        "--idle-timeout",
        "TIDAL_IDLE_TIMEOUT",
        "300",
        "seconds before a silent connection with nothing in flight is closed",
        type=float,
    )
    setting(
        "--max-inflight",
        "TIDAL_MAX_INFLIGHT",
        "4096",
        "requests read but unanswered per connection before reading pauses",
        type=int,
    )
    setting(
        "--max-message-size",
        "TIDAL_MAX_MESSAGE_SIZE",
        str(8 * 1024 * 1024),
        "bytes; a larger message gets error 3 and its connection is closed",
        type=int,
    )
    setting(
        "--max-output-buffer",
        "TIDAL_MAX_OUTPUT_BUFFER",
        str(16 * 1024 * 1024),
        "bytes of unread replies before a client is disconnected",
        type=int,
    )
    setting(
        "--metrics-port",
        "TIDAL_METRICS_PORT",
        None,
        "serve Prometheus metrics at http://HOST:PORT/metrics",
        type=_port,
    )
    setting(
        "--log-level",
        "TIDAL_LOG_LEVEL",
        "info",
        "how much to log",
        choices=("debug", "info", "warning", "error"),
    )
    setting(
        "--log-format",
        "TIDAL_LOG_FORMAT",
        "text",
        "json: one object per line",
        choices=("text", "json"),
    )

    call = commands.add_parser(
        "call",
        help="call one method and print its result as JSON",
        description='Arguments are read as JSON where they parse (42, true, [1], {"a": 1}),'
        " as strings otherwise. Exit status 1 on an error reply, 2 on a connection failure.",
    )
    call.add_argument("method")
    call.add_argument("args", nargs="*")
    _client_options(call)

    backup = commands.add_parser(
        "backup",
        help="copy the database, consistently, while the server runs",
        description="Takes a consistent snapshot with SQLite's backup API while the server keeps"
        " serving and writing; run it where the database file is (e.g. docker compose exec tidal"
        " tidal backup /data/backup.db). Restore: stop the server, put the copy in place of the"
        " database (removing its -wal and -shm files), start the server.",
    )
    backup.add_argument("dest", help="the file to create (never overwritten)")
    backup.add_argument(
        "--db", default=_env("TIDAL_DB", "./tidal.db"), help="(env TIDAL_DB; default ./tidal.db)"
    )

    for name, text in (("status", "a user's membership"), ("stats", "the server's figures")):
        sub = commands.add_parser(name, help=f"print {text}, readably")
        if name == "status":
            sub.add_argument("user_id", type=int)
        _client_options(sub)

    bench = commands.add_parser(
        "bench",
        help="measure throughput and latency against a running server",
        description="Like redis-benchmark: CLIENTS connections each keep PIPELINE requests in"
        " flight until REQUESTS have been answered. Run it against a fresh database:"
        " --left-fraction makes users 0..USERS*F leave first.",
    )
    _client_options(bench, tls=False)
    bench.add_argument("--clients", "-c", type=int, default=50, help="connections (default 50)")
    bench.add_argument(
        "--pipeline", "-P", type=int, default=1, help="requests in flight per connection (1)"
    )
    bench.add_argument("--requests", "-n", type=int, default=100_000, help="total (100000)")
    bench.add_argument(
        "--workload",
        choices=("signal", "batch", "leave", "status", "mixed", "counts"),
        default="signal",
        help="mixed: 95%% signal, 4%% status, 1%% leave/rejoin (default signal)",
    )
    bench.add_argument("--batch-size", type=int, default=1000, help="signals per batch (1000)")
    bench.add_argument("--users", type=int, default=100_000, help="distinct users (100000)")
    bench.add_argument("--entities", type=int, default=1000, help="distinct entities (1000)")
    bench.add_argument(
        "--left-fraction", type=float, default=0.0, help="share of users who leave first (0)"
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _setting(
    parser: argparse.ArgumentParser,
    flag: str,
    env: str,
    default: str | None,
    text: str,
    **options: Any,
) -> None:
    """A flag whose default comes from ``env``; its help says both, so --help stays true."""
    shown = "off" if default is None else default
    parser.add_argument(
        flag,
        default=os.environ.get(env, default),
        help=f"{text} (env {env}; default {shown})",
        **options,
    )


def _client_options(parser: argparse.ArgumentParser, *, tls: bool = True) -> None:
    # bench makes its own connections: it takes no --timeout and no TLS
    """Where the server is and how to reach it: the same for every client command."""
    parser.add_argument("--host", default=_env("TIDAL_HOST", "127.0.0.1"), help="(env TIDAL_HOST)")
    parser.add_argument(
        "--port", type=_port, default=_env("TIDAL_PORT", "7411"), help="(env TIDAL_PORT)"
    )
    parser.add_argument("--token", default=os.environ.get("TIDAL_TOKEN"), help="(env TIDAL_TOKEN)")
    if tls:
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
        parser.add_argument(
            "--tls-ca",
            default=os.environ.get("TIDAL_TLS_CA"),
            help="connect with TLS, trusting this CA file (env TIDAL_TLS_CA)",
        )
        parser.add_argument("--tls", action="store_true", help="connect with TLS, system CAs")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "backup":
        return _backup(args)
    if args.command in ("status", "stats"):
        return _readable(args)
    return _call(args)


def _serve(args: argparse.Namespace) -> int:
    from .app import ProtectedMode, run
    from .logs import configure as configure_logs
    from .storage import CorruptDatabase

    configure_logs(args.log_level, args.log_format)
    config = Config(
        host=args.host,
        port=args.port,
        db=args.db,
        durability=args.durability,
        token=args.token or None,
        insecure=args.insecure,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        max_inflight=args.max_inflight,
        max_message_size=args.max_message_size,
        max_output_buffer=args.max_output_buffer,
        metrics_port=args.metrics_port,
        tls_cert=args.tls_cert or None,
        tls_key=args.tls_key or None,
    )
    try:
        run(config)
    except (ProtectedMode, CorruptDatabase, ValueError, OSError) as exc:
        logging.getLogger("tidal.server").critical("%s", exc)
        return 2
    return 0


def _arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _remote(args: argparse.Namespace, method: str, params: list[Any]) -> tuple[int, Any]:
    """One call as the CLI makes it: (exit status, result); errors are printed here."""
    from tidal.client import ServerError, SyncClient, TidalError

    tls = ssl.create_default_context(cafile=args.tls_ca) if args.tls or args.tls_ca else None
    try:
        with SyncClient(
            args.host, args.port, timeout=args.timeout, token=args.token, ssl=tls, reconnect=0
        ) as client:
            return 0, client.call(method, *params)
    except ServerError as exc:
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        return 1, None
    except (TidalError, OSError) as exc:
        print(f"cannot reach tidal at {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2, None


def _call(args: argparse.Namespace) -> int:
    status, result = _remote(args, args.method, [_arg(a) for a in args.args])
    if status == 0:
        print(json.dumps(result, default=_json_default))
    return status


def _readable(args: argparse.Namespace) -> int:
    if args.command == "status":
        status, result = _remote(args, "status", [args.user_id])
        if status == 0:
            at = result["left_at_ns"]
            when = "never left" if at is None else f"left at {_iso(at)} ({at} ns)"
            print(f"user {result['user_id']}: {result['status']}, {when}")
        return status
    status, result = _remote(args, "stats", [])
    if status == 0:
        width = max(len(k) for k in result)
        for key, value in result.items():
            print(
                f"{key:<{width}}  {value:,}"
                if isinstance(value, int)
                else f"{key:<{width}}  {value}"
            )
    return status


def _iso(ns: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds")


def _backup(args: argparse.Namespace) -> int:
    from .backup import backup

    try:
        info = backup(args.db, args.dest)
    except (OSError, RuntimeError, sqlite3.Error) as exc:
        print(f"tidal backup: {exc}", file=sys.stderr)
        return 2
    print(
        f"backed up {info.ledger_rows:,} ledger rows and {info.leave_records:,} leave records"
        f" to {info.dest} ({info.bytes:,} bytes) in {info.seconds:.2f}s"
    )
    return 0


def _bench(args: argparse.Namespace) -> int:
    from tidal.client import bench

    cfg = bench.BenchConfig(
        host=args.host,
        port=args.port,
        clients=args.clients,
        pipeline=args.pipeline,
        requests=args.requests,
        workload=args.workload,
        batch_size=args.batch_size,
        users=args.users,
        left_fraction=args.left_fraction,
        entities=args.entities,
        token=args.token,
    )
    progress = bench.progress_bar if sys.stderr.isatty() and not args.json else None
    try:
        result = _uvloop_run(bench.run(cfg, progress))
    except (OSError, ValueError) as exc:
        print(f"tidal bench: {exc}", file=sys.stderr)
        return 2
    print(bench.format_result(result, args.json))
    return 1 if result.errors else 0


def _uvloop_run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


def _json_default(value: object) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


if __name__ == "__main__":
    sys.exit(main())
