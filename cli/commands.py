"""The client commands: call, status, stats, top, health, backup and bench."""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from . import calls

T = TypeVar("T")


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


def call(args: argparse.Namespace) -> int:
    try:
        params = [_arg(i, a) for i, a in enumerate(args.args, 1)]
    except _BadArgument as exc:
        print(f"tidal call: {exc}", file=sys.stderr)
        return 2
    if (wrong := calls.check(args.method, params)) is not None:
        print(f"tidal call: {wrong}", file=sys.stderr)
        return 2
    status, result = _remote(args, args.method, calls.sendable(args.method, params))
    if status == 0:
        print(json.dumps(result, default=calls.shown))
    return status


def top(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """A ranking as a table a person reads (or, with --json, the reply as it came)."""
    want = 1 if args.layer == "ledger" else 2
    if len(args.name_and_kind) != want:
        parser.error(
            "top ledger KIND takes no name" if want == 1 else f"top {args.layer} NAME KIND"
        )
    name = None if want == 1 else args.name_and_kind[0]
    options: dict[str, Any] = {"limit": args.limit}
    if args.by != "count":
        options["by"] = args.by
    if args.window is not None:
        options["window"] = args.window
    if args.half_life is not None:
        options["half_life"] = args.half_life
    if args.after is not None:
        options["after"] = args.after  # base64, as --json printed it
    params = calls.sendable("top", [args.layer, name, args.name_and_kind[-1], options])
    status, result = _remote(args, "top", params)
    if status != 0:
        return status
    if args.json:  # the cursor is bytes: shown in base64, as --after takes it
        print(json.dumps(result, default=calls.shown))
        return 0
    rows = [("rank", "entity", "count", "weight", "score")]
    for rank, e in enumerate(result["entities"], 1):
        score = f"{e['score']:,.0f}" if args.by == "count" else f"{e['score']:,.6g}"
        rows.append((str(rank), e["entity"], f"{e['count']:,}", f"{e['weight']:,.6g}", score))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) if i == 1 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))))  # fmt: skip
    if len(rows) == 1 and args.after is None:
        where = "the ledger" if name is None else f"{args.layer} {name!r}"
        within = f" in the last {args.window}" if args.window not in (None, "all") else ""
        print(f"(nothing counted in {where} under kind {args.name_and_kind[-1]!r}{within})")
    print(f"as of {_iso(result['as_of_ns'])}" + (", more after these" if result["next"] else ""))
    return 0


def health(args: argparse.Namespace) -> int:
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


def readable(args: argparse.Namespace) -> int:
    method, params = ("status", [args.user_id]) if args.command == "status" else ("stats", [])
    if args.json:
        status, result = _remote(args, method, params)
        if status == 0:
            print(json.dumps(result, default=calls.shown))
        return status
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


def backup(args: argparse.Namespace) -> int:
    from tidal.server.errors import BackupFailed
    from tidal.server.storage.sqlite.backup import backup as copy

    try:
        info = copy(args.db, args.dest)
    except BackupFailed as exc:
        print(f"tidal backup: {exc}", file=sys.stderr)
        return 2
    print(
        f"backed up {info.ledger_rows:,} ledger rows and {info.leave_records:,} leave records"
        f" to {info.dest} ({info.bytes:,} bytes) in {info.seconds:.2f}s"
    )
    return 0


def bench(args: argparse.Namespace) -> int:
    from . import bench as load
    from .workload import BenchConfig

    cfg = BenchConfig(
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
        redis_sha=args.redis_sha,
        server_pid=args.server_pid,
        own_users=args.own_users,
        allow_data=args.allow_data,
        keep=args.keep,
    )
    progress = load.progress_bar if sys.stderr.isatty() and not args.json else None
    try:
        result = _uvloop_run(load.run(cfg, progress))
    except (OSError, ValueError) as exc:
        print(f"tidal bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the clock started, or while cleaning up after it
        print("tidal bench: interrupted (Ctrl-C); nothing measured", file=sys.stderr)
        return 130
    print(load.format_result(result, args.json))
    return 130 if result.interrupted else 1 if result.errors else 0


def _uvloop_run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)
