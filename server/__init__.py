"""The tidal server: asyncio shell, engine, SQLite storage."""

from .app import Server, run
from .config import Config

__all__ = ["Config", "Server", "run"]
