"""Cluster mode, sans-I/O: which node serves a user, from a ``partition_map`` answer.

The rule is the server's (``tidal.protocol.partitions``); a node's ``moved`` error
corrects one partition at a time until the next full map is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidal.protocol.partitions import HASH, partition

from .errors import InvalidArgument


def address(text: str) -> tuple[str, int]:
    """``host:port`` as a node advertises it; IPv6 hosts in brackets."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgument(f"a node's address: host:port, got {text!r}")
    return host.strip("[]"), int(port)


class Router:
    def __init__(self, wire: dict[str, Any]) -> None:
        if wire.get("hash") != HASH:
            raise InvalidArgument(
                f"partition_map: the cluster hashes users with {wire.get('hash')!r}; this"
                f" client knows {HASH!r}"
            )
        self.cluster: str | None = wire.get("cluster")
        self.partitions: int = wire["partitions"]
        self.owners: list[str | None] = [owner for owner, _ in wire["owners"]]
        self.epochs: list[int] = [epoch for _, epoch in wire["owners"]]

    @property
    def clustered(self) -> bool:
        """False for a server not in cluster mode: it serves every user itself."""
        return self.cluster is not None

    def owner(self, user_id: int) -> str | None:
        """The node serving ``user_id``, or None when none is known (then: any node)."""
        if not self.clustered:
            return None
        return self.owners[partition(user_id, self.partitions)]

    def moved(self, user_id: int, owner: str | None) -> None:
        """A node said the user's partition is served by ``owner`` (None: by no node yet)."""
        if self.clustered:
            self.owners[partition(user_id, self.partitions)] = owner

    def split(self, user_ids: Sequence[int]) -> dict[str | None, list[int]]:
        """The indexes of ``user_ids``, by the node serving each, in their order."""
        groups: dict[str | None, list[int]] = {}
        for i, user_id in enumerate(user_ids):
            groups.setdefault(self.owner(user_id), []).append(i)
        return groups
