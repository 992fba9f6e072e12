"""The gate's state without a server (``core.members``): who is Left, since when, what a
leave and a rejoin record in their batch, and how a refused batch puts it all back; and
what a purge or an erase takes off of what a user's rows added (``core.past``)."""

from __future__ import annotations

from tidal.server.core import ledger
from tidal.server.core.batch import Batch
from tidal.server.core.members import Members
from tidal.server.core.past import PastRow, withdrawn
from tidal.server.core.rewrites import NO_RULE, Rule


def refused(batch: Batch) -> None:
    """What the committer does with a batch the disk refused: its undo, newest first."""
    for change in reversed(batch.undo):
        change.undo()


def test_a_leave_gates_at_once_and_a_rejoin_keeps_when_they_left() -> None:
    members, batch = Members(), Batch(1)
    assert not members.is_left(7)
    left = members.leave(batch, 7, 1_000)
    assert members.is_left(7) and len(members) == 1
    assert left.wire() == {"user_id": 7, "status": "left", "left_at_ns": 1_000}
    back = members.rejoin(batch, 7)
    assert back is not None and not members.is_left(7) and len(members) == 0
    assert members.status(7).wire() == {"user_id": 7, "status": "active", "left_at_ns": 1_000}
    # both are in the batch, the last state of the user once, and counted
    assert batch.memberships == {7: (False, 1_000)}
    assert (batch.leaves, batch.rejoins, batch.writes) == (1, 1, 2)


def test_each_leave_of_a_user_is_later_than_the_one_before_even_if_the_clock_steps_back() -> None:
    members, batch = Members(), Batch(1)
    members.leave(batch, 7, 5_000)
    members.rejoin(batch, 7)
    again = members.leave(batch, 7, 4_000)  # the wall clock stepped back
    assert again.left_at_ns == 5_001
    assert members.leave(batch, 7, 4_000).left_at_ns == 5_002  # leaving while Left, too


def test_a_rejoin_of_an_active_user_writes_nothing() -> None:
    members, batch = Members(), Batch(1)
    assert members.rejoin(batch, 7) is None
    assert batch.memberships == {} and batch.writes == 0 and batch.undo == []


def test_a_refused_batch_puts_the_gate_back_as_it_was() -> None:
    members = Members.adopt({1: 100}, {2: 200})  # as loaded at boot: 1 Left, 2 rejoined
    before = {u: members.status(u) for u in (1, 2, 3)}
    batch = Batch(1)
    members.rejoin(batch, 1)
    members.leave(batch, 2, 300)
    members.leave(batch, 3, 400)
    members.rejoin(batch, 3)
    assert not members.is_left(1) and members.is_left(2)
    refused(batch)
    assert {u: members.status(u) for u in (1, 2, 3)} == before
    assert members.is_left(1) and not members.is_left(2) and not members.is_left(3)
    assert len(members) == 1


# -- what a withdrawal takes off (``core.past.withdrawn``), read through the user's rule


def rows() -> list[PastRow]:
    """A user's rows, seq 1..4: forwarded to community "c" and cohort 9, but for seq 2,
    which was gated (the user was Left)."""
    packed = ledger.context(["c"], {}, (9,))
    assert packed is not None
    forwarded = bytes(packed)  # as a row is read back
    return [
        (seq, "e", "view", 2.0, 0 if seq == 2 else 1, forwarded, 1_000 + seq) for seq in range(1, 5)
    ]


def test_a_purge_takes_off_what_forwarded_rows_added_to_cohorts_and_communities() -> None:
    seqs, taken = withdrawn(rows(), NO_RULE, erase=False)
    assert seqs == [1, 3, 4]  # the gated row added nothing there: nothing to take off
    assert taken[0] == ("e", "view", -1, -2.0, 1_001, [9], ["c"], False)  # not the ledger's


def test_an_erase_takes_off_every_row_and_the_ledger_s_count_too() -> None:
    seqs, taken = withdrawn(rows(), NO_RULE, erase=True)
    assert seqs == [1, 2, 3, 4]
    assert taken[1] == ("e", "view", -1, -2.0, 1_002, (), (), True)  # gated: the ledger's only
    assert all(t[-1] for t in taken)


def test_rows_an_earlier_withdrawal_reached_are_not_taken_off_twice() -> None:
    # a purge below seq 3 and an erase below seq 2, not all rewritten yet: seq 1 is gone,
    # seq 2 and its neighbour count as not forwarded, whatever the rows still say
    rule = Rule(purge_before=3, erase_before=2)
    assert withdrawn(rows(), rule, erase=False)[0] == [3, 4]
    assert withdrawn(rows(), rule, erase=True)[0] == [2, 3, 4]
