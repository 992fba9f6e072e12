"""tidal as a process: serve until SIGINT or SIGTERM, on uvloop, and exit with
the server's status (``Server.serve``)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from .app import Server
from .config import Config

log = logging.getLogger("tidal.server")


def run(config: Config) -> int:
    """Serve until SIGINT or SIGTERM, on uvloop when it is installed; the exit status."""

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        return await Server(config).serve(stop)

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; this is for odd platforms
        log.warning("uvloop is not installed; using asyncio's default event loop")
        return None
    return uvloop.new_event_loop
