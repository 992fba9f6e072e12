"""Health that tells the truth: what an orchestrator may route on and restart by.

``ping`` says the process answers (liveness). ``health`` says whether it can do
its job (readiness): ``ok`` only once the database is loaded, storage takes
writes, and the writer thread has just completed a round trip, so a wedged
disk shows as a health check that times out rather than one that passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from tidal.protocol import ErrorCode
from tidal.protocol.methods import BY_NAME
from tidal.protocol.refusals import InvalidParams
from tidal.server.core import params
from tidal.server.core.replies import Later, Replier

from .dispatch import discover

OK: Final = "ok"
STARTING: Final = "starting"
FAILING: Final = "failing"
STANDBY: Final = "standby"
#: a commit this many seconds long: ``health`` answers at once that storage is unavailable,
#: not after a round trip that may never come back (a path to the database gone silent)
STALLED: Final = 2.0


def report(storage: str, error: str | None = None) -> dict[str, Any]:
    """The ``health`` reply. ``storage``: loading, ok, full (writes refused until space
    returns), unavailable (the database cannot be reached; writes refused until it can)
    or failed (writes refused until a restart)."""
    if storage == "loading":
        return {"status": STARTING, "storage": storage}
    if storage == "ok":
        return {"status": OK, "storage": storage}
    return {"status": FAILING, "storage": storage, "error": error or storage}


class HealthCheck(Later):
    """A ``health`` request waiting for its round trip through the writer; answered as
    things are then, even if that commit failed (it reports, it reveals nothing)."""

    __slots__ = ("now",)
    survives_failure = True

    def __init__(self, now: Callable[[], dict[str, Any]]) -> None:
        self.now = now

    def answer(self) -> dict[str, Any]:
        return self.now()


class Booting:
    """Answers requests while the database loads, so that a long boot can be told from a
    dead server. Nothing can be applied yet: leave state is not in memory, and a gate
    that read a half-loaded map would forward a signal it must not."""

    STARTING_MESSAGE: Final = "starting: tidal is loading its database; try again shortly"

    def health(self) -> dict[str, Any]:
        return report("loading")

    def refusal(self) -> str:
        return self.STARTING_MESSAGE

    def handle(self, conn: Replier, msgid: int | None, method: str, args: list[Any]) -> None:
        if msgid is None:
            conn.reply(None, None)  # nothing can be applied yet
            return
        declared = BY_NAME.get(method)
        if declared is None or not declared.while_starting:  # the table says what is answered
            conn.reply_error(msgid, ErrorCode.UNAVAILABLE, self.refusal())
            return
        try:
            params.arity_of(method, args)
        except InvalidParams as exc:
            conn.reply_error(msgid, ErrorCode.INVALID_PARAMS, exc.message)
            return
        if method == "ping":
            conn.reply(msgid, "pong")
        elif method == "health":
            conn.reply(msgid, self.health())
        else:  # rpc.discover (auth is the connection's own)
            discover(conn, msgid, args)


class Standby(Booting):
    """Answers while this tidal waits to take the database over from the one serving it
    (``--standby``): it holds no state and serves nothing, and says who it waits for, so
    that clients given both addresses go to the other."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.holder = "another tidal"

    def health(self) -> dict[str, Any]:
        return {"status": STANDBY, "storage": "waiting", "serving": self.holder}

    def refusal(self) -> str:
        return (
            f"standby: this tidal waits to take over {self.location} from the one serving it"
            f" ({self.holder}); send requests there"
        )
