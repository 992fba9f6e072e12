"""Time in the aggregates: which window a signal's event time falls in, and its decayed weight.

A window is counted in whole buckets, so that it can slide by subtracting a bucket
as it leaves rather than by visiting signals: 1-minute buckets for ``1h`` and
``24h``, 1-hour buckets for ``7d`` and ``30d``. Window ``W`` of ``n`` buckets of
``g`` at time ``now`` holds every signal whose bucket ``floor(at / g)`` is one of
the last ``n``, the current one included: ``floor(at / g) > floor(now / g) - n``.
Its edge is so exact to ``g`` (it reaches back between ``W - g`` and ``W``).
Signals stamped ahead of ``now`` (up to ``AHEAD_NS``) count in every window.

Trend is forward decay (Cormode et al., 2009): each signal adds
``weight * 2**((at - base) / half_life)`` once, for a base fixed per half-life, so
that the order of scores never changes as time passes and nothing is visited to
age them; the score at ``as_of`` is that sum times ``2**((base - as_of) /
half_life)``, which is exactly ``sum(weight * 2**(-(as_of - at) / half_life))``.
The base lies ``BASE_AHEAD`` half-lives past the boot that set it: a fresh signal
then adds about 2**-500, and the sums stay within a double's range for about 1,000
half-lives after it; a boot more than ``STALE_AFTER`` half-lives past the base
moves it (the sums scaled by an exact power of two). So a server must be restarted
within about 1,000 half-lives of a boot (41 days at 1h, 250 at 6h). A signal more
than about 500 half-lives older than the base decays to 0 (below 2**-1000 of a
fresh one).
"""

from __future__ import annotations

import math
from typing import Final

from tidal.protocol.errors import quoted

MINUTE_NS: Final = 60 * 10**9
HOUR_NS: Final = 3600 * 10**9
#: a signal's event time may be at most this far ahead of the server's clock
AHEAD_NS: Final = 5 * MINUTE_NS

#: the windows a read may ask for, in the order tallies keep them: name, bucket, buckets
WINDOWS: Final = (("1h", MINUTE_NS, 60), ("24h", MINUTE_NS, 1440), ("7d", HOUR_NS, 168),
                  ("30d", HOUR_NS, 720))  # fmt: skip
WINDOW_NAMES: Final = ("all", *(name for name, _, _ in WINDOWS))
#: the two tiers of buckets: minutes (kept a day), hours (kept 30 days)
TIERS: Final = ((MINUTE_NS, 1440), (HOUR_NS, 720))
#: ... so the buckets each tier keeps, and the windows read no further back
KEEP: Final = tuple(n for _, n in TIERS)
ALL_WINDOWS: Final = 0b1111
BASE_AHEAD: Final = 500
STALE_AFTER: Final = 100  # half-lives past the base: moved at the next boot
#: the longest half-life, in seconds: a year (a longer one is no trend)
MAX_HALF_LIFE: Final = 365 * 86400


def window_index(name: str) -> int:
    """-1 for ``all``, else the window's place in a tally."""
    return WINDOW_NAMES.index(name) - 1


def mask(at_ns: int, minute: int, hour: int) -> int:
    """The windows (bit i: ``WINDOWS[i]``) that hold a signal at ``at_ns``, when the current
    buckets are ``minute`` and ``hour``."""
    m = at_ns // MINUTE_NS
    if m > minute - 60:
        return ALL_WINDOWS  # the common case: a signal of the last hour, or a fresh one
    bits = 0b0010 if m > minute - 1440 else 0
    h = at_ns // HOUR_NS
    if h > hour - 168:
        bits |= 0b0100
    if h > hour - 720:
        bits |= 0b1000
    return bits


def holds(window: int, bucket: int, current: int) -> bool:
    """Whether ``WINDOWS[window]`` holds the bucket (of its own tier) at ``current``."""
    return bucket > current - WINDOWS[window][2]


def parse_half_life(text: str) -> int:
    """``30m``, ``6h``, ``1d`` or plain seconds: a half-life in whole seconds, > 0."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1)
    # ASCII digits: isdigit() and int() take any script's ("٦h" would be 6h)
    if not (number.isascii() and number.isdigit()) or not 0 < int(number) * unit <= MAX_HALF_LIFE:
        raise ValueError(
            f"{quoted(text)} is not a whole number of s, m, h or d, above 0 and at most 365d"
        )
    return int(number) * unit


def show_half_life(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def first_base(now_ns: int, half_life_s: int) -> int:
    """Where a half-life's forward decay starts: ``BASE_AHEAD`` half-lives from now, in ns."""
    step = half_life_s * 10**9
    return (now_ns // step + BASE_AHEAD) * step


def stale(base_ns: int, now_ns: int, half_life_s: int) -> bool:
    """Whether a base is far enough behind ``now_ns`` to move, at boot (sums grow as
    2**((now - base) / half_life) and stay finite for about 1,000 half-lives past it)."""
    return (now_ns - base_ns) / (half_life_s * 1e9) > STALE_AFTER


def rebase_factor(old_ns: int, new_ns: int, half_life_s: int) -> float:
    """What turns a sum at base ``old_ns`` into one at ``new_ns``: a power of two, exact."""
    return math.ldexp(1.0, -((new_ns - old_ns) // (half_life_s * 10**9)))


def decay_factor(at_ns: int, base_ns: int, half_life_s: int) -> float:
    """What one unit of weight at ``at_ns`` adds to a forward-decayed sum."""
    exponent = (at_ns - base_ns) / (half_life_s * 1e9)
    return 0.0 if exponent < -1070 else float(2.0**exponent)


def score_factor(as_of_ns: int, base_ns: int, half_life_s: int) -> float:
    """What turns a forward-decayed sum into the decayed score at ``as_of_ns``."""
    return float(2.0 ** ((base_ns - as_of_ns) / (half_life_s * 1e9)))
