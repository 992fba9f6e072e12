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
    """The partition of ``user_id`` (0 to 2**64 - 1) among ``partitions``."""
    return fmix64(user_id) % partitions
