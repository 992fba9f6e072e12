"""Log setup: plain text for people, one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime

#: a log line's message is cut past this many characters: what a client sent may be in it
LINE_MOST = 4000


class Bounded(logging.Filter):
    """Every line of bounded length, whoever wrote it: a megabyte a request must not
    become a megabyte a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > LINE_MOST:
            record.msg = f"{message[:LINE_MOST]}... (cut: {len(message)} characters)"
            record.args = None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str, form: str, libraries: str = "warning") -> None:
    """``level`` for tidal's own loggers, ``libraries`` for everyone else's: at debug,
    aiosqlite logs every statement, which would bury tidal's own lines."""
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(Bounded())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(libraries.upper())
    logging.getLogger("tidal").setLevel(level.upper())


class Throttle:
    """A line that can repeat many times a second (a refused batch, an error reply, while
    a database is away): logged at once, then at most once per ``interval`` for each key,
    saying how many like it were held back since the last one."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._log = logger
        self._interval = interval
        self._next: dict[object, float] = {}  # key -> when it may be logged again
        self._held: dict[object, int] = {}

    def __call__(self, key: object, level: int, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next.get(key, 0.0):
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._next[key] = now + self._interval
        held = self._held.pop(key, 0)
        if held:
            message += f" (and {held} more like it in the last {self._interval:.0f} s)"
        self._log.log(level, message, *args)
