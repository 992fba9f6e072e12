"""tidal with one promise broken on purpose: it acknowledges writes before committing them.

Only the crash test runs it, to show that its checks catch a server that does
this. It patches the storage layer of an otherwise ordinary ``tidal serve``.
"""

from __future__ import annotations

import asyncio
import sys

from tidal.cli import main
from tidal.server.core.replies import Later
from tidal.server.engine.cycle import Transaction
from tidal.server.storage.postgres.pg_storage import PgStorage
from tidal.server.storage.sqlite.sqlite_storage import SqliteStorage


def acks_first(storage: type[SqliteStorage] | type[PgStorage]) -> None:
    commit = storage.commit

    async def ack_first(self: SqliteStorage | PgStorage, transaction: Transaction) -> None:
        batch = transaction.batch
        early = [r for r in batch.replies if not isinstance(r[2], Later)]
        batch.replies = [r for r in batch.replies if isinstance(r[2], Later)]
        for conn, msgid, result in early:
            conn.reply(msgid, result)
        for conn in {r[0] for r in early}:
            conn.flush()
        await asyncio.sleep(0.005)  # the window a crash can fall into
        await commit(self, transaction)  # type: ignore[arg-type]

    storage.commit = ack_first  # type: ignore[method-assign, assignment]


acks_first(SqliteStorage)
acks_first(PgStorage)

if __name__ == "__main__":
    sys.exit(main())
