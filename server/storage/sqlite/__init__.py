"""The SQLite backend, the embedded default: one writer on aiosqlite's thread,
the schema and its migrations, the lock on the file, and online backup."""
