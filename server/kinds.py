"""The kinds of setting, each parsed by one rule: a count, a duration, a size, a port, an
address, a path. The command line, the ``TIDAL_*`` variables and the client's flags all
parse through these, so that a value is refused the same way wherever it is given.

Each rule takes ASCII digits only (``int`` and ``\\d`` take any script's: Arabic-Indic 512 would be
512), refuses what is not finite (``inf``, ``nan``, ``1e300`` seconds), and holds the value
to a range the code can honour: a number that parses but that a socket, a timer or a
database column cannot take would otherwise start a server that fails on every
connection, in a traceback.
"""

from __future__ import annotations

import math
import re
from typing import Final, NamedTuple

from tidal.protocol.errors import quoted

_COUNT: Final = re.compile(r"\s*\+?([0-9]+)\s*")
_DURATION: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", re.IGNORECASE)
_NUMBER: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DAY: Final = 86400.0
#: the longest duration a setting may have: about a century, and still well within a
#: signed 64-bit count of nanoseconds (292 years), as storage keeps times
MAX_SECONDS: Final = 36500 * DAY


class Range(NamedTuple):
    """A setting's bounds, inclusive; ``above``: the low bound itself is refused (``> 0``)."""

    low: float
    high: float
    above: bool = False

    def holds(self, value: float) -> bool:
        if not math.isfinite(value) or value > self.high:
            return False
        return value > self.low if self.above else value >= self.low

    def words(self, unit: str = "") -> str:
        low, high = _plain(self.low), _plain(self.high)
        if self.above:
            return f"more than {low}{unit} and at most {high}{unit}"
        return f"{low}{unit} to {high}{unit}"


def count(text: str) -> int:
    """A whole number in ASCII digits."""
    match = _COUNT.fullmatch(text)
    if match is None:
        raise ValueError(f"must be a whole number in digits 0-9, got {quoted(text)}")
    return int(match[1])


def number(text: str) -> float:
    """A plain decimal number in ASCII digits (no exponent: nothing that parses as inf)."""
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise ValueError(f"must be a number such as 0.25 in digits 0-9, got {quoted(text)}")
    return float(match[1])


def duration(text: str) -> float:
    """Seconds, from ``30d``, ``12h``, ``90m``, ``45s`` or a plain number of seconds."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(
            f"must be a duration such as 30d, 12h, 90m, 45s, 0.5 or 0, got {quoted(text)}"
        )
    seconds = float(match[1]) * _UNITS[match[2].lower() or "s"]
    if not seconds <= MAX_SECONDS:  # 10**400 parses as inf
        raise ValueError(f"must be at most {_plain(MAX_SECONDS / DAY)}d, got {quoted(text)}")
    return seconds


def port(text: str) -> int:
    try:
        number = count(text)
    except ValueError:
        raise ValueError(f"port must be an integer, got {quoted(text)}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port must be in 0..65535, got {number}")
    return number


def address(text: str) -> str:
    """A host name or an IP address to listen on or connect to. Empty is refused: asyncio
    binds every interface for it, which nobody means by leaving a setting blank."""
    value = text.strip()
    if not value or any(c.isspace() for c in value):
        raise ValueError(
            f"must be a host name or an IP address (0.0.0.0 listens on every interface),"
            f" got {quoted(text)}"
        )
    return value


def endpoint(text: str) -> str:
    """``HOST:PORT`` to listen on (``[::1]:8080`` for IPv6): the host as ``address``
    takes it, the port as ``port``; returned as given, checked."""
    split(text)
    return text.strip()


def split(text: str) -> tuple[str, int]:
    host, colon, number = text.strip().rpartition(":")
    if not colon:
        raise ValueError(f"must be HOST:PORT, such as 127.0.0.1:7480, got {quoted(text)}")
    return address(host.removeprefix("[").removesuffix("]")), port(number)


def path(text: str) -> str:
    if not text.strip() or "\0" in text:
        raise ValueError(f"must be a file's path, got {quoted(text)}")
    return text


def within(value: float, bounds: Range, unit: str = "") -> None:
    """Refuse a parsed value outside ``bounds``, in words that say them."""
    if not bounds.holds(value):
        raise ValueError(f"must be {bounds.words(unit)}, got {_plain(value)}{unit}")


def _plain(number: float) -> str:
    if isinstance(number, float) and number.is_integer():
        return str(int(number))
    return str(number)
