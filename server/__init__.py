"""The tidal server: asyncio shell, engine, SQLite storage."""

from .app import Server, run
from .config import Config
from .errors import ProtectedMode, StartupError
from .version import VERSION

__all__ = ["VERSION", "Config", "ProtectedMode", "Server", "StartupError", "run"]
