"""The backend ``--db`` names, imported only once chosen: a server on SQLite never
loads asyncpg, and neither backend knows the other exists."""

from __future__ import annotations

from tidal.server.config import Durability

from .interface import Storage, is_url


async def open_storage(db: str, durability: Durability, password_file: str | None) -> Storage:
    """The backend ``db`` names: a PostgreSQL URL, or else a SQLite file."""
    if is_url(db):
        from tidal.server.storage.postgres.runner import PgStorage

        return await PgStorage.open(db, durability, password_file)
    from tidal.server.storage.sqlite.runner import SqliteStorage

    return await SqliteStorage.open(db, durability)
