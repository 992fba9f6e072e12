"""The client commands: call, status, stats, health, backup and bench (``tables`` prints
the ranked reads: top, catalog)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from . import calls
from .calls import iso
from .remote import remote

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


def call(args: argparse.Namespace) -> int:
    try:
        params = [_arg(i, a) for i, a in enumerate(args.args, 1)]
    except _BadArgument as exc:
        print(f"tidal call: {exc}", file=sys.stderr)
        return 2
    if (wrong := calls.check(args.method, params)) is not None:
        print(f"tidal call: {wrong}", file=sys.stderr)
        return 2
    status, result = remote(args, args.method, calls.sendable(args.method, params))
    if status == 0:
        print(json.dumps(result, default=calls.shown))
    return status


def health(args: argparse.Namespace) -> int:
    """0 healthy, 1 anything else: Docker reserves exit status 2 in health checks."""
    status, result = remote(args, "health", [])
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
        status, result = remote(args, method, params)
        if status == 0:
            print(json.dumps(result, default=calls.shown))
        return status
    if args.command == "status":
        status, result = remote(args, "status", [args.user_id])
        if status == 0:
            at = result["left_at_ns"]
            when = "never left" if at is None else f"left at {iso(at)} ({at} ns)"
            print(f"user {result['user_id']}: {result['status']}, {when}")
        return status
    status, result = remote(args, "stats", [])
    if status == 0:
        width = max(len(k) for k in result)
        for key, value in result.items():
            print(
                f"{key:<{width}}  {value:,}"
                if isinstance(value, int)
                else f"{key:<{width}}  {value}"
            )
    return status


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
    from . import results as shown
    from .cleanup import clean_up
    from .workload import COHORT, BenchConfig, default_requests

    cfg = BenchConfig(
        host=args.host,
        port=args.port,
        clients=args.clients,
        pipeline=args.pipeline,
        requests=args.requests or default_requests(args.workload, args.batch_size),
        workload=args.workload,
        batch_size=args.batch_size,
        users=args.users,
        left_fraction=args.left_fraction,
        entities=args.entities,
        token=args.token,
        redis_sha=args.redis_sha,
        http_port=args.http_port,
        server_pid=args.server_pid,
        own_users=args.own_users,
        allow_data=args.allow_data,
        keep=args.keep,
    )
    progress = shown.progress_bar if sys.stderr.isatty() and not args.json else None
    try:
        result, made = _uvloop_run(load.measure(cfg, progress))
    except (OSError, ValueError) as exc:
        print(f"tidal bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the clock started
        print("tidal bench: interrupted (Ctrl-C); nothing measured", file=sys.stderr)
        return 130
    print(shown.format_result(result, args.json), flush=True)  # at once, before the clean-up
    status = 130 if result.interrupted else 1 if result.errors else 0
    if cfg.redis_sha is None and not cfg.keep:
        print(f"tidal bench: cleaning up {len(made.users):,} users...", file=sys.stderr)
        try:
            bar = shown.progress_bar if sys.stderr.isatty() else None
            said = _uvloop_run(clean_up(cfg, made, bar))
        except KeyboardInterrupt:
            print(
                "\ntidal bench: clean-up interrupted; its users (ids from 2**48) and cohort"
                f" {COHORT} stay",
                file=sys.stderr,
            )
            return 130
        except OSError as exc:
            print(f"tidal bench: clean-up failed: {exc}", file=sys.stderr)
            return 2
        print(f"tidal bench: {said}", file=sys.stderr)
    return status


def _uvloop_run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)
