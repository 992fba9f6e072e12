"""The PostgreSQL backend (``--db postgresql://...``), on asyncpg: the writer and
reader sessions, the advisory lock that fences a second server, and the schema."""
