"""Large messages: decoded a slice at a time, and let go of a slice at a time.

A message's objects are freed when its last reference goes, all in that one call: the
8 MiB of empty arrays a client may send took 0.26 s to free, holding the loop. Handed
here instead, a message is taken apart from the loop a slice of objects at a time.
Only containers nobody else holds are emptied: what the engine kept stays whole. Only
a message of over 256 KiB comes here: walking a smaller one costs more than freeing it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Final

#: Objects let go of per turn of the loop (a few milliseconds' worth).
SLICE: Final = 20_000
#: A larger message is decoded this many bytes' worth at a time, the connection going on
#: with other work in between (``tidal.protocol``'s ``decode_slice``).
DECODE_SLICE: Final = 64 * 1024
#: One whose decoding stopped between slices more times than this (one of over 256 KiB)
#: is taken apart here. A smaller one goes at once: at most about 10 ms even if it is all
#: empty arrays (40 ns a byte here), 0.14 ms for a batch of 1,000 signals (76 KB), whose
#: walk here took 3.6 ms (a fifth of the batch path's CPU).
LARGE_SLICES: Final = 3


class Disposer:
    def __init__(self) -> None:
        self._stack: list[Any] = []
        self._scheduled = False

    def add(self, obj: Any) -> None:
        """Take ``obj`` apart, and free it, over the next turns of the loop."""
        self._stack.append(obj)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._work)

    def _work(self) -> None:
        stack = self._stack
        budget = SLICE
        while stack and budget:
            budget -= 1
            top = stack[-1]
            kind = type(top)
            # held by the stack, by ``top`` and by getrefcount's argument: by nobody else
            if (kind is list or kind is dict) and top and sys.getrefcount(top) <= 3:
                stack.append(top.pop() if kind is list else top.popitem()[1])
            else:
                del top
                stack.pop()  # a leaf, an emptied container, or one still held elsewhere
        if stack:
            asyncio.get_running_loop().call_soon(self._work)
        else:
            self._scheduled = False
