"""``tidal cluster status``: a cluster's nodes, partitions and commit log, read from its
database, so that it answers while nodes are down, which is when it is wanted most."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from typing import Any

from .settings import Settings


def add(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], settings: Settings
) -> argparse.ArgumentParser:
    cluster = commands.add_parser(
        "cluster",
        help="what a cluster's database says of its nodes (cluster status)",
        description="tidal cluster status --db postgresql://...: each node (live or not), the"
        " partitions and epochs it holds, how far it has applied the commit log (its lag),"
        " its newest checkpoint; the log's rows kept. It reads the database the nodes"
        " share, so it answers while nodes are down. Exit status 1 when a partition has no"
        " live node, 2 when the database cannot be read or holds no cluster.",
    )
    cluster.add_argument("action", choices=("status",))
    settings.add(cluster, "--db", "TIDAL_DB", None, "the cluster's PostgreSQL URL")
    settings.add(
        cluster, "--db-password-file", "TIDAL_DB_PASSWORD_FILE", None,
        "a file holding the PostgreSQL password",
    )  # fmt: skip
    cluster.add_argument("--json", action="store_true", help="print one JSON object")
    return cluster


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if not args.db or not args.db.startswith(("postgresql://", "postgres://")):
        parser.error("cluster status: --db (or TIDAL_DB) must be the cluster's postgresql:// URL")
    try:
        found = asyncio.run(_read(args.db, args.db_password_file))
    except Exception as exc:  # one line, never a traceback: the database is the operator's
        print(f"tidal cluster status: {exc}", file=sys.stderr)
        return 2
    if found is None:
        print("tidal cluster status: the database holds no cluster", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(found)))
    else:
        print(_table(found, time.time_ns()))
    return 1 if found.unserved else 0


async def _read(url: str, password_file: str | None) -> Any:
    import asyncpg

    from tidal.server.config import redact
    from tidal.server.storage.postgres import status
    from tidal.server.storage.postgres.session import read_password, why

    options: dict[str, Any] = {"timeout": 10, "server_settings": {"application_name": "tidal"}}
    if password_file:
        options["password"] = read_password(password_file)
    try:
        conn = await asyncpg.connect(url, **options)
    except Exception as exc:
        raise RuntimeError(f"{redact(url)}: cannot connect: {why(exc)}") from None
    try:
        return await status.read(conn)
    except asyncpg.PostgresError as exc:
        raise RuntimeError(f"{redact(url)}: {why(exc)}") from None
    finally:
        await conn.close()


def _table(s: Any, now_ns: int) -> str:
    kept = "none" if s.log_first is None else f"from id {s.log_first}"
    lines = [
        f"cluster {s.name}: {s.partitions} partitions, {len(s.nodes)} nodes"
        f" ({sum(n.live for n in s.nodes)} live); log head {s.head}, {s.log_rows} rows"
        f" kept ({kept}); last event {s.events}",
        f"{'node':<24} {'live':<5} {'parts':>5} {'epochs':>11} {'applied':>9} {'lag':>7}"
        "  checkpoint",
    ]
    for n in s.nodes:
        epochs = "-" if n.epochs is None else f"{n.epochs[0]}..{n.epochs[1]}"
        if n.checkpoint is None:
            checkpoint = "-"
        else:
            age = max(0.0, (now_ns - n.checkpoint[1]) / 1e9)
            checkpoint = f"log id {n.checkpoint[0]}, {age:.0f} s ago"
        lag = s.head - n.applied if n.live else "-"
        lines.append(
            f"{n.node:<24} {'yes' if n.live else 'no':<5} {n.partitions:>5} {epochs:>11}"
            f" {n.applied:>9} {lag:>7}  {checkpoint}"
        )
    if s.unserved:
        lines.append(f"{s.unserved} partitions have no live node: their users are not served")
    return "\n".join(lines)
