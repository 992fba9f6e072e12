"""Who has left the community layer: the in-memory state behind the gate.

Two plain dicts of int to int keep it small (a leave record costs about as much
as its dict entry) and make the gate a single membership test: a user is Left
exactly when they are a key of ``_left``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeAlias

from .batch import Batch

#: What a user's record was before a change, so a failed commit can put it back:
#: None (no record), or (is_left, left_at_ns).
Prior: TypeAlias = tuple[bool, int] | None


class Membership(NamedTuple):
    user_id: int
    left: bool
    left_at_ns: int | None

    def wire(self) -> dict[str, object]:
        return {
            "user_id": self.user_id,
            "status": "left" if self.left else "active",
            "left_at_ns": self.left_at_ns,
        }


class Members:
    def __init__(self) -> None:
        self._left: dict[int, int] = {}  # Left users -> when they (last) left
        self._rejoined: dict[int, int] = {}  # Active users who once left -> when

    def is_left(self, user_id: int) -> bool:
        """The gate: a Left user's signals reach the ledger and nothing else."""
        return user_id in self._left

    def __len__(self) -> int:
        """How many users are Left now."""
        return len(self._left)

    def status(self, user_id: int) -> Membership:
        at = self._left.get(user_id)
        if at is not None:
            return Membership(user_id, True, at)
        return Membership(user_id, False, self._rejoined.get(user_id))

    def prior(self, user_id: int) -> Prior:
        at = self._left.get(user_id)
        if at is not None:
            return (True, at)
        at = self._rejoined.get(user_id)
        return None if at is None else (False, at)

    def leave(self, batch: Batch, user_id: int, now_ns: int) -> Membership:
        """Leave again or for the first time; ``left_at_ns`` strictly increases per user,
        even if the wall clock steps back, so each leave is a distinct boundary."""
        prior = self.prior(user_id)
        before = self._left.get(user_id) or self._rejoined.pop(user_id, 0)
        at = max(now_ns, before + 1)
        self._left[user_id] = at
        self._record(batch, user_id, prior, True, at)
        batch.leaves += 1
        return Membership(user_id, True, at)

    def rejoin(self, batch: Batch, user_id: int) -> Membership | None:
        """None when the user is already active: nothing changes, nothing is written."""
        prior = self.prior(user_id)
        at = self._left.pop(user_id, None)
        if at is None:
            return None
        self._rejoined[user_id] = at
        self._record(batch, user_id, prior, False, at)
        batch.rejoins += 1
        return Membership(user_id, False, at)

    def _record(self, batch: Batch, user_id: int, prior: Prior, left: bool, at: int) -> None:
        batch.undo.append(_Restore(self, user_id, prior))
        batch.memberships[user_id] = (left, at)
        batch.writes += 1

    def restore(self, user_id: int, prior: Prior) -> None:
        self._left.pop(user_id, None)
        self._rejoined.pop(user_id, None)
        if prior is not None:
            (self._left if prior[0] else self._rejoined)[user_id] = prior[1]

    @classmethod
    def adopt(cls, left: dict[int, int], rejoined: dict[int, int]) -> Members:
        """Take over the dicts loaded at boot (user_id -> left_at_ns)."""
        members = cls()
        members._left, members._rejoined = left, rejoined
        return members

    def reload(
        self, ours: Callable[[int], bool], left: dict[int, int], rejoined: dict[int, int]
    ) -> None:
        """Cluster mode: partitions taken over. Their users' state as the database holds it
        replaces what this node knew of them (from when it last served them, if ever)."""
        for kept in (self._left, self._rejoined):
            for user_id in [u for u in kept if ours(u)]:
                del kept[user_id]
        self._left.update(left)
        self._rejoined.update(rejoined)


class _Restore(NamedTuple):
    members: Members
    user_id: int
    prior: Prior

    def undo(self) -> None:
        self.members.restore(self.user_id, self.prior)
