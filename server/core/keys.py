"""Idempotency keys: a retried signal is answered with its first acknowledgement.

Key -> (seq, forwarded, ts_ns) of the signal that first used it, oldest first,
bounded by the window and by ``max_keys``. Kept in memory (the check is a dict
lookup on the signal path) and in the ``signal_keys`` table, pruned at checkpoints.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple, TypeAlias

from .batch import Batch

#: what a key maps to: the first signal's seq, whether it was forwarded, when it came, and
#: (cluster mode) whose it was: a node taking the user's partition over replaces it
Ack: TypeAlias = tuple[int, bool, int, int | None]


class Keys:
    def __init__(self, loaded: OrderedDict[str, Ack], window_ns: int, max_keys: int) -> None:
        self._keys = loaded
        self._window_ns = window_ns
        self._max_keys = max_keys
        #: users being erased -> the seq their erase reaches below: their keys are
        #: forgotten from when the erase is read, though found only once it commits
        self._erasing: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def seen(self, key: str, now_ns: int, user_id: int) -> Ack | None:
        """The first use of ``key``, if it is within the window and not erased."""
        ack = self._keys.get(key)
        if ack is None or ack[2] < now_ns - self._window_ns:
            return None
        if self._erasing and ack[0] < self._erasing.get(user_id, -1):
            return None  # a retry of an erased signal: its key is forgotten
        return ack

    def adopt(self, ours: Callable[[int], bool], loaded: OrderedDict[str, Ack]) -> None:
        """Cluster mode: the keys of partitions taken over, as the database holds them,
        replace what this node knew of them from when it last served them (another node
        may have erased their signals since, and the keys with them)."""
        stale = [k for k, ack in self._keys.items() if ack[3] is not None and ours(ack[3])]
        for key in stale:
            del self._keys[key]
        for key, ack in loaded.items():
            known = self._keys.get(key)
            if known is None or known[2] <= ack[2]:
                self._keys[key] = ack

    def erasing(self, batch: Batch, user_id: int, before_seq: int) -> None:
        batch.undo.append(_Erasing(self._erasing, user_id, self._erasing.get(user_id)))
        self._erasing[user_id] = before_seq

    def erasing_since(self, user_id: int, before_seq: int) -> None:
        """At boot: an erase whose rows are not all deleted yet (``core.rewrites``)."""
        self._erasing[user_id] = before_seq

    def forget(self, keys: list[tuple[str, int]]) -> None:
        """``keys`` (with the seq each acknowledged) are gone from the table, with the rows
        an erase deleted; they go from memory too, unless a later signal has taken one."""
        for key, seq in keys:
            ack = self._keys.get(key)
            if ack is not None and ack[0] == seq:
                del self._keys[key]

    def erased(self, user_id: int, before_seq: int) -> None:
        """The user's rows below ``before_seq`` are all deleted, and their keys with them."""
        if self._erasing.get(user_id, before_seq + 1) <= before_seq:
            del self._erasing[user_id]

    def remember(self, batch: Batch, key: str, ack: Ack) -> None:
        keys = self._keys
        batch.undo.append(_Put(self._keys, key, keys.pop(key, None)))
        keys[key] = ack  # at the end: the dict stays oldest first
        batch.keys[key] = ack
        if len(keys) > self._max_keys:
            # O(1) in an OrderedDict; a dict's first key is found past every slot
            # deleted before it, so evicting that way slows with every eviction
            keys.popitem(last=False)

    def forget_old(self, batch: Batch, now_ns: int) -> None:
        """Drop keys past the window, from memory now and from the table with ``batch``."""
        cutoff = now_ns - self._window_ns
        keys = self._keys
        while keys:
            oldest = next(iter(keys))
            if keys[oldest][2] >= cutoff:
                break
            keys.popitem(last=False)
        batch.forget_keys_before = cutoff


class _Put(NamedTuple):
    keys: OrderedDict[str, Ack]
    key: str
    prior: Ack | None

    def undo(self) -> None:
        self.keys.pop(self.key, None)
        if self.prior is not None:
            self.keys[self.key] = self.prior


class _Erasing(NamedTuple):
    erasing: dict[int, int]
    user_id: int
    prior: int | None

    def undo(self) -> None:
        if self.prior is None:
            self.erasing.pop(self.user_id, None)
        else:
            self.erasing[self.user_id] = self.prior
