"""The backend ``--db`` names, imported only once chosen: a server on SQLite never
loads asyncpg, and neither backend knows the other exists."""

from __future__ import annotations

from collections.abc import Callable

from tidal.server.config import Config

from .interface import Storage, is_url


async def open_storage(config: Config, standby: Callable[[str], None] | None) -> Storage:
    """The backend ``--db`` names: a PostgreSQL URL, or else a SQLite file. ``standby``:
    told who serves the database, if another tidal does and this one is to wait for it."""
    db, durability = config.db, config.durability
    if is_url(db):
        from tidal.server.storage.postgres.pg_storage import PgStorage

        return await PgStorage.open(
            db,
            durability,
            config.db_password_file,
            idle_timeout=config.db_idle_timeout,
            standby=standby,
            node=config.advertise if config.cluster else None,
        )
    from tidal.server.storage.sqlite.sqlite_storage import SqliteStorage

    return await SqliteStorage.open(db, durability)
