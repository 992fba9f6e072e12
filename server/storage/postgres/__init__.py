"""The PostgreSQL backend (``--db postgresql://...``), on asyncpg: the storage
(``runner``), the writer's session that holds the lock and is fenced (``writer``),
the advisory lock that fences a second server, and the schema."""
