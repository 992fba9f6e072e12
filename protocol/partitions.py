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
    worked out in 32-bit halves and 16-bit pieces, so that no value it makes reaches
    2**62. Compiled, each is then a machine word, not an allocated big integer: this is
    on every request of a cluster node, where ``fmix64`` as written cost 2.7% of a
    signal's CPU (py-spy). tests/test_partitions.py holds the two equal."""
    high, low = user_id >> 32, user_id & _LOW
    low ^= high >> 1  # key ^= key >> 33
    high, low = _times(high, low, 0xFF51AFD7, 0xED558CCD)
    low ^= high >> 1
    high, low = _times(high, low, 0xC4CEB9FE, 0x1A85EC53)
    low ^= high >> 1
    return ((high % partitions) * (_HALF % partitions) + low) % partitions


_LOW: Final = (1 << 32) - 1
_HALF: Final = 1 << 32


def _low_times(a: int, b: int) -> int:
    """``a * b mod 2**32``, for ``a`` and ``b`` below 2**32."""
    return ((a & 0xFFFF) * b + (((a >> 16) * b) & 0xFFFF) * 0x10000) & _LOW


def _times(high: int, low: int, c_high: int, c_low: int) -> tuple[int, int]:
    """``(high * 2**32 + low) * (c_high * 2**32 + c_low) mod 2**64``, as its halves."""
    low0 = (low & 0xFFFF) * c_low  # below 2**48
    low1 = (low >> 16) * c_low
    sum_ = low0 + (low1 & 0xFFFF) * 0x10000  # below 2**49
    carry = (sum_ >> 32) + (low1 >> 16)
    high = (carry + _low_times(high, c_low) + _low_times(low, c_high)) & _LOW
    return high, sum_ & _LOW
