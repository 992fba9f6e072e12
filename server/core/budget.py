"""The memory budget: how much memory the board's aggregates may take (``--memory-budget``).

Aggregates are what grows with data in memory: one per (layer, key, kind, entity) a
signal reaches, about ``TALLY_BYTES`` each, and ``ENTITY_BYTES`` per entity for its
index (docs/DESIGN.md, "Memory"). One
request can ask for 250,000 of them, so the budget is checked before a write is
applied, as Redis checks ``maxmemory`` before a command: a process that grew until
the kernel's OOM killer ended it would take every client's writes in flight with it.

Past the budget, a write that would create aggregates is refused whole (error 2,
``full:``); writes that only add to aggregates already held, reads, leaves, rejoins,
purges and erasures go on, and a purge or an erasure makes room. ``pending`` counts
what the batches not yet on the board add (each batch the aggregates it creates, once:
``grows``): a write is judged against what is held and what is on its way, so a burst of
pipelined requests cannot pass it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Final

from tidal.server.errors import Full

from .board import Board, Key

#: resident bytes, as measured (docs/DESIGN.md, "Memory"; tests/test_memory_budget.py
#: checks them): per aggregate, its tally with its counts, windows and one trend, and
#: its entry in its scope; per entity, its name and its entry in the board's index
TALLY_BYTES: Final = 480
ENTITY_BYTES: Final = 128


def used(board: Board) -> int:
    """What the board takes, in bytes, as the budget counts it."""
    return board.tallies * TALLY_BYTES + len(board.by_entity) * ENTITY_BYTES


class Budget:
    """The board may not take more than ``limit`` bytes; ``setting`` is how the operator
    said it."""

    __slots__ = ("board", "freeing", "limit", "pending", "refused", "replies", "setting")

    def __init__(self, board: Board, budget_bytes: int, setting: str = "") -> None:
        self.board = board
        self.limit = budget_bytes or sys.maxsize  # 0: no budget
        self.setting = setting or f"{budget_bytes} bytes"
        #: bytes the batches read but not yet on the board add
        self.pending = 0
        #: bytes the last committed batch's withdrawals took off the board, not yet room
        #: (``freed``)
        self.freeing = 0
        self.refused = 0  # writes refused, since start
        #: bytes held for replies being built (``engine.room``): reads count too
        self.replies = 0

    def used(self) -> int:
        return used(self.board)

    def room(self) -> int:
        """Bytes left, once the batches on their way are on the board."""
        return self.limit - self.pending - self.freeing - self.replies - used(self.board)

    def freed(self, bytes_: int) -> None:
        """A batch is on the board, and its withdrawals (a purge, an erase, a cohort
        dropped) took ``bytes_`` off it. The batch after it read its signals against the
        board as it was before, and counted as held what the withdrawals took off; on the
        board, it adds them back. So what they freed is room only once that batch too is
        on the board (or refused): the next call. Without this, the aggregates went a few
        KiB past the budget under purges (the fault-history checker saw it)."""
        self.freeing = max(0, bytes_)

    def full(self) -> bool:
        """Less than 1% of the budget is left: what ``health`` and the metrics call full
        (a write refused for wanting more than is left says so itself)."""
        return self.room() + self.replies <= self.limit // 100  # reads pass; aggregates stay

    def check(self, reached: Iterable[tuple[str, str, tuple[Key, ...]]]) -> None:
        """Refuse a write whose signals reach these (entity, kind, keys), if the aggregates
        it would create do not fit."""
        tallies, entities = creating(self.board, reached)
        new = tallies * TALLY_BYTES + entities * ENTITY_BYTES
        held = used(self.board) + self.pending + self.freeing
        if new and held + new > self.limit:
            self.refused += 1
            raise Full(
                f"full: this write would pass the memory budget (--memory-budget"
                f" {self.setting}, {_mib(self.limit)}): aggregates take {_mib(held)} of it,"
                f" and it would create {tallies} more ({_mib(new)}). Nothing of it was"
                " applied. Writes to aggregates already held, reads, leaves, rejoins, purges"
                " and erasures go on; purge or erase to make room, or raise the budget"
            )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def creating(board: Board, reached: Iterable[tuple[str, str, tuple[Key, ...]]]) -> tuple[int, int]:
    """How many aggregates, and entities, signals reaching these (entity, kind, keys)
    would add to the board: those it does not hold, each once (``Board.add`` keys them
    so)."""
    new: set[tuple[str, str, Key]] = set()
    for entity, kind, keys in reached:
        new.update((entity, kind, key) for key in keys if board.find(entity, kind, key) is None)
    return len(new), len({entity for entity, _, _ in new if entity not in board.by_entity})


def grows(board: Board, creating: set[tuple[str, str, Key]], entity: str, kind: str,
          keys: Iterable[Key]) -> int:  # fmt: skip
    """The bytes a signal reaching these aggregates adds to the board, counted once per
    batch (``creating``: what the batch creates so far): on the signal path, a lookup per
    aggregate, and more only for those not held (rare once the board is warm)."""
    held = entity in board.by_entity
    scopes = board.keyed.get(kind)
    added = 0
    for key in keys:
        scope = None if scopes is None else scopes.get(key)
        if scope is not None and entity in scope.tallies:
            continue
        aggregate = (entity, kind, key)
        if aggregate not in creating:
            creating.add(aggregate)
            added += TALLY_BYTES if held or added else TALLY_BYTES + ENTITY_BYTES
    return added


def most(signals: int, slots: int) -> int:
    """The bytes that ``signals`` reaching ``slots`` aggregates in all may add, at most."""
    return slots * TALLY_BYTES + signals * ENTITY_BYTES
