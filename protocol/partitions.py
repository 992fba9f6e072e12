"""Which partition a user is in: the rule every node and every routing client shares.

A cluster (``tidal serve --cluster``) splits users into ``P`` partitions, fixed when
the cluster is created; each partition is served by one node at a time, its sequencer.
The rule is fixed forever, since it decides where a user's state is kept, and simple,
so that a client in any language can compute it::

    partition = fmix64(user_id) % P

``fmix64`` is MurmurHash3's 64-bit finalizer over the user id as an unsigned 64-bit
integer, every product taken modulo 2**64. It mixes every bit of the id into every bit
of the result, so sequential ids spread evenly.
"""

from __future__ import annotations

from typing import Final

#: the rule's name, as ``partition_map`` reports it
HASH: Final = "fmix64"
#: the default number of partitions of a new cluster: far more than nodes foreseen, so
#: that nodes take whole partitions and no user is ever hashed again
DEFAULT_PARTITIONS: Final = 256
#: the partition whose node serves every consumer group (methods routed ``groups``)
GROUPS: Final = 0
MAX_PARTITIONS: Final = 65_536
_MASK: Final = (1 << 64) - 1


def fmix64(key: int) -> int:
    key ^= key >> 33
    key = (key * 0xFF51AFD7ED558CCD) & _MASK
    key ^= key >> 33
    key = (key * 0xC4CEB9FE1A85EC53) & _MASK
    return key ^ (key >> 33)


def partition(user_id: int, partitions: int) -> int:
    """The partition of ``user_id`` (0 to 2**64 - 1) among ``partitions``: ``fmix64``,
    worked out in 32-bit halves and products of 16-bit pieces. Compiled, each value is
    then a machine word (mypyc multiplies words only below 2**30), not an allocated big
    integer: this is on every request of a cluster node, where ``fmix64`` as written cost
    2.7% of a signal's CPU (py-spy). tests/test_partitions.py holds the two equal."""
    high, low = user_id >> 32, user_id & _LOW
    low ^= high >> 1  # key ^= key >> 33
    high, low = _times(high, low, 0xFF51, 0xAFD7, 0xED55, 0x8CCD)
    low ^= high >> 1
    high, low = _times(high, low, 0xC4CE, 0xB9FE, 0x1A85, 0xEC53)
    low ^= high >> 1
    return ((high % partitions) * (_HALF % partitions) + low) % partitions


_LOW: Final = (1 << 32) - 1
_HALF: Final = 1 << 32


def _times(high: int, low: int, c3: int, c2: int, c1: int, c0: int) -> tuple[int, int]:
    """``(high * 2**32 + low) * c mod 2**64``, as its 32-bit halves; ``c`` given as four
    16-bit pieces, the highest first."""
    a1, a0 = low >> 16, low & 0xFFFF
    middle = a0 * c1 + a1 * c0
    bottom = a0 * c0 + ((middle & 0xFFFF) << 16)
    carry = (bottom >> 32) + (middle >> 16) + a1 * c1  # low * (c mod 2**32), its high half
    high = (carry + _low_times(high, c1, c0) + _low_times(low, c3, c2)) & _LOW
    return high, bottom & _LOW


def _low_times(a: int, b1: int, b0: int) -> int:
    """``a * (b1 * 2**16 + b0) mod 2**32``, for ``a`` below 2**32."""
    a1, a0 = a >> 16, a & 0xFFFF
    return (a0 * b0 + (((a0 * b1 + a1 * b0) & 0xFFFF) << 16)) & _LOW
