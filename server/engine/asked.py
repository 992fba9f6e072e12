"""A withdrawal read and not yet in a batch (``surveys``): what it adds to the batch it
joins, the reads that wait for it, and the group of them one survey reads together.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Final

from tidal.protocol import ErrorCode
from tidal.server.core.batch import Batch
from tidal.server.core.past import Withdrawal
from tidal.server.core.replies import Later, Replier

#: withdrawals one survey reads together: the blocks of ``ledger_users`` are read once
SURVEY_GROUP: Final = 100


@dataclass(slots=True, eq=False)
class Asked:
    """A withdrawal read, not yet in a batch: what it adds to the batch it joins, and the
    reads that wait for it."""

    w: Withdrawal
    conn: Replier
    msgid: int | None
    reply: Later
    asked_in: Batch  # the open batch when it was read
    saved: str  # what was written as it was read, kept if the withdrawal is refused
    deferred: list[Callable[[], None]] = field(default_factory=list)

    def refuse(self, message: str, code: int = ErrorCode.UNAVAILABLE) -> None:
        self.conn.reply_error(self.msgid, code, message)
        self.conn.flush()
        self.go_on()

    def go_on(self) -> None:
        """It is answered, or its answer is placed: what its connection sent after it
        (held by ``Surveys.defer``) goes on. Every way out of the surveys' queue ends
        here: else that connection would apply nothing more, for ever."""
        for request in self.deferred:
            request()


def first_group(asked: Iterable[Asked], joined: Container[int]) -> list[Asked]:
    """The withdrawals read first, up to ``SURVEY_GROUP`` of them, that one survey may
    read together: of distinct users, none with a withdrawal not yet committed
    (``joined``)."""
    group: list[Asked] = []
    users: set[int] = set()
    for a in asked:
        user = a.w.user_id
        if user in users or user in joined or len(group) == SURVEY_GROUP:
            break  # in order: a later one joins no batch before this one
        users.add(user)
        group.append(a)
    return group
