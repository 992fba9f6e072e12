"""Where the servers are: one address, or several (an active tidal and its standbys).

With several, a client connects to the one whose ``health`` is ``ok``, and moves on
when a connection drops or a server says it is a standby. Shared by both clients; no
I/O here: the dialling is theirs, the choosing is this module's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .errors import ConnectFailed, InvalidArgument

Address = tuple[str, int]
#: what a client may be given: "host", "h1,h2:7412", or [("h1", 7411), ("h2", 7411)]
Hosts = str | Sequence[Address]


def parse(hosts: Hosts, port: int) -> list[Address]:
    """``hosts`` as (host, port) pairs; ``port`` for those that name none. A name with a
    port is ``h:7412``; an IPv6 address with one, ``[::1]:7412``."""
    if isinstance(hosts, str):
        found = [_one(part.strip(), port) for part in hosts.split(",")]
    else:
        found = []
        for item in hosts:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise InvalidArgument(f"hosts: (host, port) pairs, got {item!r}")
            found.append((item[0], _port(item[1], f"{item[0]}:{item[1]}")))
    if not found:
        raise InvalidArgument("hosts: at least one address")
    return found


def _one(text: str, port: int) -> Address:
    if not text:
        raise InvalidArgument("hosts: an empty address in the list")
    if text.startswith("["):  # [v6]:port or [v6]
        host, _, rest = text[1:].partition("]")
        return (host, _port(rest[1:], text) if rest.startswith(":") else port)
    if text.count(":") == 1:
        host, given = text.split(":")
        return (host, _port(given, text))
    return (text, port)  # a name, an IPv4 address, or a bare IPv6 address


def _port(value: object, text: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise InvalidArgument(f"hosts: {text!r}: the port must be a number") from None
    if not 0 < number < 65536:
        raise InvalidArgument(f"hosts: {text!r}: the port must be 1 to 65535")
    return number


class Addresses:
    """The servers a client may use, tried from the last that served it."""

    def __init__(self, hosts: Hosts, port: int) -> None:
        self.all = parse(hosts, port)
        self._first = 0

    @property
    def several(self) -> bool:
        return len(self.all) > 1

    def rotation(self) -> Iterator[Address]:
        """Each address once, the one that served last first."""
        for i in range(len(self.all)):
            yield self.all[(self._first + i) % len(self.all)]

    def served(self, address: Address) -> None:
        self._first = self.all.index(address)

    def __str__(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.all)


class Choice:
    """One round of dialling: which of the servers that answered to keep. One whose
    ``health`` is ok, at once; failing that, the first that is starting or failing (its
    requests say why, and a starting one is asked again); a standby never: it serves
    nothing."""

    def __init__(self, addresses: Addresses) -> None:
        self._addresses = addresses
        self._held = False
        self._why: list[str] = []

    def answered(self, address: Address, health: Mapping[str, Any]) -> str:
        """ "use": keep this connection, and stop; "hold": keep it in case none is ok;
        "drop": close it."""
        status = health.get("status") if isinstance(health, Mapping) else None
        if status == "ok":
            self._addresses.served(address)
            return "use"
        self._why.append(f"{address[0]}:{address[1]} is {status}")
        if self._held or status in ("standby", None):
            return "drop"
        self._held = True
        self._addresses.served(address)
        return "hold"

    def failed(self, address: Address, exc: Exception) -> None:
        self._why.append(f"{address[0]}:{address[1]}: {exc}")

    def none(self) -> ConnectFailed:
        return ConnectFailed(f"no tidal of {self._addresses} is serving ({'; '.join(self._why)})")
