"""The PostgreSQL backend (``--db postgresql://...``), on asyncpg: the writer's
session, the advisory lock that fences a second server, and the schema."""
