"""Idempotency keys: a retried signal is answered with its first acknowledgement.

Key -> (seq, forwarded, ts_ns) of the signal that first used it, oldest first,
bounded by the window and by ``max_keys``. Kept in memory (the check is a dict
lookup on the signal path) and in the ``signal_keys`` table, pruned at checkpoints.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple, TypeAlias

from .batch import Batch

#: what a key maps to: the first signal's seq, whether it was forwarded, when it came
Ack: TypeAlias = tuple[int, bool, int]


class Keys:
    def __init__(self, loaded: OrderedDict[str, Ack], window_ns: int, max_keys: int) -> None:
        self._keys = loaded
        self._window_ns = window_ns
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._keys)

    def seen(self, key: str, now_ns: int) -> Ack | None:
        """The first use of ``key``, if it is within the window."""
        ack = self._keys.get(key)
        return ack if ack is not None and ack[2] >= now_ns - self._window_ns else None

    def remember(self, batch: Batch, key: str, ack: Ack) -> None:
        keys = self._keys
        batch.undo.append(_Put(self._keys, key, keys.pop(key, None)))
        keys[key] = ack  # at the end: the dict stays oldest first
        batch.keys.append((key, *ack))
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
