"""The dispatch table, built from the method table (``tidal.protocol.methods``): a method
the table declares and no handler serves, or the reverse, stops the server at its start,
so the two never drift apart."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from tidal.protocol.methods import BY_NAME
from tidal.protocol.openrpc import document
from tidal.server.core.edge import Edge, edges
from tidal.server.core.replies import Replier
from tidal.server.version import VERSION

Handler = Callable[[Replier, int | None, list[Any]], None]

#: what the connection answers itself, before any handler (``net.auth``)
CONNECTION_METHODS = frozenset({"auth"})


def dispatch(served: dict[str, Handler]) -> dict[str, tuple[Handler, int, int, Edge | None]]:
    """Each handler with the least and the most params its method takes, and its edge: the
    rules its params are checked and parsed by before it runs (None: it reads them as sent,
    or takes none)."""
    declared = set(BY_NAME) - CONNECTION_METHODS
    if set(served) != declared:
        raise RuntimeError(
            f"the method table and the handlers differ: declared, no handler:"
            f" {sorted(declared - set(served))}; handled, not declared:"
            f" {sorted(set(served) - declared)}"
        )
    edge = edges()
    return {
        name: (h, BY_NAME[name].least, BY_NAME[name].most, edge.get(name))
        for name, h in served.items()
    }


@cache
def openrpc() -> dict[str, Any]:
    return document(VERSION)


def discover(conn: Replier, msgid: int | None, args: list[Any]) -> None:
    """``rpc.discover``: the OpenRPC document of every method (``protocol.openrpc``)."""
    conn.reply(msgid, openrpc())
