"""Cluster mode: the whole board as one blob, a node's checkpoint (``cluster``), written
with the log id it covers: a booting node loads the newest and replays only the log past
it, and the log below it can go (``storage.postgres.cluster.prune``).

The blob holds the board as one tidal's checkpoint writes it (``chunks.everything``):
the chunks of tally records and each bucket's part, so a boot rebuilds it the same way
(``restore.rebuild``), decayed sums moved exactly to the booting node's bases.
"""

from __future__ import annotations

from typing import Any

import msgpack

from . import chunks
from .board import Board
from .chunks import Shelf
from .restore import BoardRows


def pack(board: Board, shelf: Shelf, now_ns: int) -> bytes:
    """The board as it holds now. ``shelf`` gives tallies their ids; nothing is noted as
    written in it (cluster mode writes no chunks of its own)."""
    written = chunks.everything(board, shelf, now_ns)
    parts = [(tier, bucket, entries) for tier, bucket, _, entries, _ in written.parts]
    blob: bytes = msgpack.packb((shelf.next_id, written.chunks, parts), use_bin_type=True)
    return blob


def rows(blob: bytes, decay: list[tuple[int, int]]) -> BoardRows:
    """What ``pack`` wrote, as boot rebuilds a board from (``decay``: the booting node's
    bases)."""
    next_id, chunk_rows, parts = msgpack.unpackb(blob, raw=False)
    newest_first: list[Any] = sorted((tuple(c) for c in chunk_rows), reverse=True)
    return BoardRows(decay, next_id, newest_first, [tuple(p) for p in parts])
