"""The tidal server. Its rooms, each importing only those below it (docs/DESIGN.md):
``main`` and ``app`` (the process, the server's life), ``net`` (the asyncio shell),
``engine`` (requests applied, group commit), ``storage`` (the interface, then the
SQLite and PostgreSQL backends), ``config`` and ``metrics``, ``core`` (sans-I/O:
the rules and the state), and ``errors``, ``logs``, ``version`` at the bottom."""

from .app import Server
from .config import Config
from .errors import ProtectedMode, StartupError
from .main import run
from .version import VERSION

__all__ = ["VERSION", "Config", "ProtectedMode", "Server", "StartupError", "run"]
