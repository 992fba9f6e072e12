"""``tidal serve`` and ``tidal call``: the one console script."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NamedTuple, NoReturn, TypeVar

from .config import Config
from .version import VERSION

T = TypeVar("T")


class _Setting(NamedTuple):
    dest: str
    flag: str
    env: str
    default: str | None
    convert: Callable[[str], Any]
    choices: tuple[str, ...] | None


class _Settings:
    """Flags whose defaults come from ``TIDAL_*`` variables.

    argparse checks a flag's value, but a default taken from the environment would
    reach the program unchecked (a bad choice), or be blamed on the flag (a bad
    number). So a flag's default stays unset, and ``resolve`` fills it from the
    environment afterwards, naming the variable when its value breaks the rule.
    """

    def __init__(self) -> None:
        self.by_command: dict[str, list[_Setting]] = {}

    def add(
        self,
        parser: argparse.ArgumentParser,
        flag: str,
        env: str,
        default: str | None,
        text: str,
        *,
        type: Callable[[str], Any] = str,
        choices: tuple[str, ...] | None = None,
    ) -> None:
        shown = "off" if default is None else default
        convert = _lower if choices else type
        action = parser.add_argument(
            flag,
            default=argparse.SUPPRESS,
            type=convert,
            choices=choices,
            help=f"{text} (env {env}; default {shown})",
        )
        spec = _Setting(action.dest, flag, env, default, convert, choices)
        self.by_command.setdefault(parser.prog.split()[-1], []).append(spec)

    def resolve(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        for spec in self.by_command.get(args.command, ()):
            if hasattr(args, spec.dest):
                continue
            raw = os.environ.get(spec.env)
            if raw is None:
                value = None if spec.default is None else spec.convert(spec.default)
            else:
                try:
                    value = spec.convert(raw)
                except (ValueError, argparse.ArgumentTypeError) as exc:
                    _refuse(parser, f"{spec.env}={raw!r}: {_rule(exc)}")
                if spec.choices is not None and value not in spec.choices:
                    _refuse(parser, f"{spec.env}={raw!r}: must be one of {', '.join(spec.choices)}")
            setattr(args, spec.dest, value)


def _refuse(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """One line and exit 2: a bad environment variable or file is not a usage mistake."""
    parser.exit(2, f"{parser.prog}: {message}\n")


def _lower(value: str) -> str:
    return value.lower()


def _rule(exc: Exception) -> str:
    if isinstance(exc, argparse.ArgumentTypeError):
        return str(exc)
    return "must be a number" if "float" in str(exc) else "must be an integer"


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be an integer, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {port}")
    return port


def _parser() -> tuple[argparse.ArgumentParser, _Settings]:
    parser = argparse.ArgumentParser(
        prog="tidal", description="tidal: a signal server with an instant, durable leave switch."
    )
    parser.add_argument("--version", action="version", version=f"tidal {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True)
    settings = _Settings()

    serve = commands.add_parser("serve", help="run the server")
    setting = functools.partial(settings.add, serve)
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
    _token_options(settings, serve, "require auth(token) as each connection's first request")
    setting("--tls-cert", "TIDAL_TLS_CERT", None, "PEM certificate (chain): serve TLS only")
    setting("--tls-key", "TIDAL_TLS_KEY", None, "PEM key")
    serve.add_argument(
        "--insecure",
        action="store_true",
        default=os.environ.get("TIDAL_INSECURE", "") not in ("", "0"),
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
        "--message-timeout",
        "TIDAL_MESSAGE_TIMEOUT",
        "30",
        "seconds a message may take to arrive whole before its connection is closed",
        type=float,
    )
    setting(
        "--backlog",
        "TIDAL_BACKLOG",
        "4096",
        "connections the kernel queues before they are accepted",
        type=int,
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
    levels = ("debug", "info", "warning", "error")
    setting("--log-level", "TIDAL_LOG_LEVEL", "info", "how much tidal logs", choices=levels)
    setting(
        "--log-libraries",
        "TIDAL_LOG_LIBRARIES",
        "warning",
        "how much the libraries under tidal log (aiosqlite logs every statement at debug)",
        choices=levels,
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
        description='Each argument is read as JSON where it parses (42, true, [1], {"a": 1},'
        ' "17"), as a string otherwise; one that starts like JSON ({, [ or ") must parse.'
        """ To send digits as a string, quote them as JSON: '"17"'."""
        " Exit status 1 on an error reply; 2 when the server cannot be reached or an"
        " argument cannot be sent.",
    )
    call.add_argument("method")
    call.add_argument("args", nargs="*")
    _client_options(settings, call)

    backup = commands.add_parser(
        "backup",
        help="copy the database, consistently, while the server runs",
        description="Takes a consistent snapshot with SQLite's backup API while the server keeps"
        " serving and writing; run it where the database file is (e.g. docker compose exec tidal"
        " tidal backup /data/backup.db). Restore: stop the server, put the copy in place of the"
        " database (removing its -wal and -shm files), start the server.",
    )
    backup.add_argument("dest", help="the file to create (never overwritten)")
    settings.add(backup, "--db", "TIDAL_DB", "./tidal.db", "the database to copy")

    for name, text in (("status", "a user's membership"), ("stats", "the server's figures")):
        sub = commands.add_parser(name, help=f"print {text}, readably")
        if name == "status":
            sub.add_argument("user_id", type=int)
        _client_options(settings, sub)
    health = commands.add_parser(
        "health",
        help="exit 0 if the server is ready and its storage takes writes, 1 otherwise",
        description="For health checks (Docker's HEALTHCHECK, Kubernetes' exec probes): prints"
        " ok, starting (the database is still loading) or failing (and why), and exits 0 only"
        " for ok. A server that cannot be reached, or does not answer within --timeout, is"
        " unhealthy too (exit 1).",
    )
    _client_options(settings, health)

    bench = commands.add_parser(
        "bench",
        help="measure throughput and latency against a running server",
        description="Like redis-benchmark: CLIENTS connections each keep PIPELINE requests in"
        " flight until REQUESTS have been answered. Run it against a fresh database:"
        " --left-fraction makes users 0..USERS*F leave first.",
    )
    _client_options(settings, bench, tls=False)
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
    return parser, settings


def _token_options(settings: _Settings, parser: argparse.ArgumentParser, text: str) -> None:
    settings.add(
        parser,
        "--token",
        "TIDAL_TOKEN",
        None,
        f"{text}; on the command line it is visible to every user of the machine (ps)",
    )
    settings.add(parser, "--token-file", "TIDAL_TOKEN_FILE", None, "read the token from this file")


def _client_options(
    settings: _Settings, parser: argparse.ArgumentParser, *, tls: bool = True
) -> None:
    """Where the server is and how to reach it: the same for every client command."""
    settings.add(parser, "--host", "TIDAL_HOST", "127.0.0.1", "the server's address")
    settings.add(parser, "--port", "TIDAL_PORT", "7411", "the server's port", type=_port)
    _token_options(settings, parser, "send auth(token) first")
    if tls:  # bench makes its own connections: it takes no --timeout and no TLS
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
        settings.add(
            parser, "--tls-ca", "TIDAL_TLS_CA", None, "connect with TLS, trusting this CA file"
        )
        parser.add_argument("--tls", action="store_true", help="connect with TLS, system CAs")


def _token(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]) -> None:
    """``args.token`` from --token, --token-file, TIDAL_TOKEN or TIDAL_TOKEN_FILE (as the
    official database images take ``*_FILE``): never two of them at once."""
    if "token" not in args:
        return
    given = [name for name in ("token", "token_file") if _on_command_line(argv, name)]
    if len(given) == 2:
        _refuse(parser, "--token and --token-file: give one of them")
    if not given and os.environ.get("TIDAL_TOKEN") and os.environ.get("TIDAL_TOKEN_FILE"):
        _refuse(parser, "TIDAL_TOKEN and TIDAL_TOKEN_FILE are both set: set one of them")
    args.token_in_argv = "token" in given
    if args.token_in_argv and args.command != "serve":  # serve says it in its log
        print(f"warning: {_TOKEN_SEEN}", file=sys.stderr)
    if args.token_file is not None and (not args.token or "token_file" in given):
        source = "--token-file" if "token_file" in given else "TIDAL_TOKEN_FILE"
        try:
            with open(args.token_file, encoding="utf-8") as f:
                args.token = f.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            _refuse(parser, f"{source} {args.token_file}: {getattr(exc, 'strerror', None) or exc}")
        if not args.token:
            _refuse(parser, f"{source} {args.token_file}: the file is empty")
    args.token = args.token or None


_TOKEN_SEEN = (
    "a token given with --token can be read by any user of this machine (ps, /proc);"
    " prefer TIDAL_TOKEN or TIDAL_TOKEN_FILE"
)


def _on_command_line(argv: Sequence[str], dest: str) -> bool:
    flag = "--" + dest.replace("_", "-")
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, settings = _parser()
    args = parser.parse_args(argv)
    settings.resolve(parser, args)
    _token(parser, args, argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "backup":
        return _backup(args)
    if args.command in ("status", "stats"):
        return _readable(args)
    if args.command == "health":
        return _health(args)
    return _call(args)


def _serve(args: argparse.Namespace) -> int:
    from .app import run
    from .errors import StartupError
    from .logs import configure as configure_logs

    configure_logs(args.log_level, args.log_format, args.log_libraries)
    if args.token_in_argv:
        logging.getLogger("tidal.server").warning("%s", _TOKEN_SEEN)
    config = Config(
        host=args.host,
        port=args.port,
        db=args.db,
        durability=args.durability,
        token=args.token,
        insecure=args.insecure,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        message_timeout=args.message_timeout,
        backlog=args.backlog,
        max_inflight=args.max_inflight,
        max_message_size=args.max_message_size,
        max_output_buffer=args.max_output_buffer,
        metrics_port=args.metrics_port,
        tls_cert=args.tls_cert or None,
        tls_key=args.tls_key or None,
    )
    try:
        run(config)
    except StartupError as exc:
        logging.getLogger("tidal.server").critical("%s", exc)
        return 2
    return 0


class _BadArgument(Exception):
    pass


def _arg(position: int, text: str) -> Any:
    """JSON where it parses, else the text; what starts like JSON must be JSON."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip()[:1] in ("{", "[", '"'):
            raise _BadArgument(
                f"argument {position} is not valid JSON: {exc.msg} at column {exc.colno}"
                f" ({text[max(0, exc.pos - 10) : exc.pos + 10]!r} around it)"
            ) from None
        return text
    if not _fits(value):
        raise _BadArgument(
            f"argument {position} holds an integer outside -2**63..2**64-1, which MessagePack"
            " cannot carry"
        )
    return value


def _fits(value: Any) -> bool:
    if type(value) is int:
        return -(2**63) <= value < 2**64
    if type(value) is list:
        return all(_fits(v) for v in value)
    if type(value) is dict:
        return all(_fits(v) for v in value.values())
    return True


def _remote(args: argparse.Namespace, method: str, params: list[Any]) -> tuple[int, Any]:
    """One call as the CLI makes it: (exit status, result); errors are printed here."""
    from tidal.client import ClientError, ServerError, SyncClient, TidalError

    try:
        tls = ssl.create_default_context(cafile=args.tls_ca) if args.tls or args.tls_ca else None
    except OSError as exc:
        print(
            f"tidal {args.command}: --tls-ca {args.tls_ca}: {exc.strerror or exc}", file=sys.stderr
        )
        return 2, None
    try:
        with SyncClient(
            args.host, args.port, timeout=args.timeout, token=args.token, ssl=tls, reconnect=0
        ) as client:
            return 0, client.call(method, *params)
    except ServerError as exc:
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        return 1, None
    except ClientError as exc:
        print(f"tidal {args.command}: cannot send {method}: {exc}", file=sys.stderr)
        return 2, None
    except TidalError as exc:
        print(f"cannot reach tidal at {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2, None


def _call(args: argparse.Namespace) -> int:
    try:
        params = [_arg(i, a) for i, a in enumerate(args.args, 1)]
    except _BadArgument as exc:
        print(f"tidal call: {exc}", file=sys.stderr)
        return 2
    status, result = _remote(args, args.method, params)
    if status == 0:
        print(json.dumps(result, default=_json_default))
    return status


def _health(args: argparse.Namespace) -> int:
    """0 healthy, 1 anything else: Docker reserves exit status 2 in health checks."""
    status, result = _remote(args, "health", [])
    if status != 0:
        return 1
    if result.get("status") == "ok":
        print("ok")
        return 0
    detail = result.get("error") or f"storage {result.get('storage')}"
    print(f"{result.get('status')}: {detail}")
    return 1


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
    from .errors import BackupFailed

    try:
        info = backup(args.db, args.dest)
    except BackupFailed as exc:
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
