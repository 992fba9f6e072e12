"""The tidal server: asyncio shell, engine, SQLite storage."""

from .app import ProtectedMode, Server, run
from .config import Config

__all__ = ["Config", "ProtectedMode", "Server", "run"]
