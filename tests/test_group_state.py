"""A consumer group's rules without a socket (``core.groups``): random events, consumers
that join, go, acknowledge, give back and let ack_wait pass, in any order, and after each
step what a group promises: an event out to one consumer at most, a user's events out to
one consumer at most, each user's events first sent in id order, and a cursor below
every event unsettled; and once everyone acknowledges everything, nothing left."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.server.core import feed
from tidal.server.core.group_parts import Entry, Spec
from tidal.server.core.groups import Group

ACK_WAIT = 10


class Conn:
    """A consumer's connection, as a group sees it: whether its transport is full."""

    listener: Any = None

    def __init__(self, full: bool = False) -> None:
        self.full = full

    def blocked(self) -> bool:
        return self.full


step = st.one_of(
    st.tuples(st.just("event"), st.integers(0, 4)),
    st.tuples(st.just("join"), st.booleans()),
    st.tuples(st.just("leave"), st.integers(0, 5)),
    st.tuples(st.just("ack"), st.integers(0, 5), st.integers(1, 3)),
    st.tuples(st.just("nack"), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("time"), st.integers(1, 15)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=80), st.booleans())
def test_a_group_keeps_its_promises_whatever_happens(steps: list[Any], wait: bool) -> None:
    spec = Spec("g", 0, ACK_WAIT, 3, wait, None, 0)
    group = Group(spec, 0)
    now, last = 0, 0
    first_sent: dict[int, list[int]] = {}
    for s in steps:
        kind = s[0]
        if kind == "event":
            last += 1
            group.take(Entry(last, feed.LEAVE, s[1], now, b""))
        elif kind == "join":
            group.join(Conn(s[1]), "peer")  # type: ignore[arg-type]
        elif kind == "leave" and group.consumers:
            consumers = list(group.consumers.values())
            group.leave(consumers[s[1] % len(consumers)], now)
        elif kind in ("ack", "nack") and group.consumers:
            consumers = list(group.consumers.values())
            out = list(consumers[s[1] % len(consumers)].out.values())
            for entry in out[: s[2] if kind == "ack" else 1]:
                if kind == "ack":
                    group.ack(entry, now)
                elif s[2]:
                    group.kill(entry, now, "given back dead")
                else:
                    group.back(entry, now, "given back")
        elif kind == "time":
            now += s[1]
            group.expired(now)
        for entry, _, _ in group.assign(now):
            if entry.deliveries == 1:
                first_sent.setdefault(entry.user or 0, []).append(entry.id)
        check(group, first_sent)
    for conn in [c for c in group.consumers.values() if c.conn.blocked()]:
        group.leave(conn, now)
    if not group.consumers:
        group.join(Conn(), "peer")  # type: ignore[arg-type]
    for entry in list(group.dead.values()):
        group.revive(entry)
    for _ in range(last + 5):  # everyone acknowledges everything, a round at a time
        group.assign(now)
        for consumer in list(group.consumers.values()):
            for entry in list(consumer.out.values()):
                group.ack(entry, now)
        if not group.window and not group.revived:
            break
    assert not group.window and not group.revived and group.cursor() == last


def check(group: Group, first_sent: dict[int, list[int]]) -> None:
    users: dict[int | None, object] = {}
    for consumer in group.consumers.values():
        for event_id, entry in consumer.out.items():
            assert entry.consumer is consumer and entry.id == event_id
            assert users.setdefault(entry.user, consumer) is consumer, "a user on two"
    for entry in group.pending():
        if entry.consumer is not None:
            assert entry.id in entry.consumer.out
    for user, ids in first_sent.items():
        assert ids == sorted(ids), f"user {user}'s events first sent out of order: {ids}"
    cursor = group.cursor()
    assert all(i > cursor for i in group.window)


def test_a_refused_batch_gives_its_events_back_and_leaves_nothing_to_send() -> None:
    """Events taken from a batch whose commit failed were never committed: their ids are
    given to later events, so nothing of them may be sent (the checker's disk-full runs
    found them sent with no data, cutting a consumer's stream)."""
    group = Group(Spec("g", 0, ACK_WAIT, 3, True, None, 0), 0)
    group.join(Conn(), "peer")  # type: ignore[arg-type]
    group.take(Entry(1, feed.LEAVE, 7, 0, b""))
    [(entry, first, sent)] = group.assign(0)
    group.unsend(entry, 0, first, sent)  # the send, undone
    group.untake([1], 0)  # the event, given back
    assert group.assign(0) == [] and group.cursor() == 0 and not group.ready


def test_an_event_sent_twice_at_one_time_dies_once() -> None:
    """Sent, its consumer gone, and sent again at the same time: when ack_wait passes, it is
    back once (a dead letter once), and sent back it is sent again (hypothesis found it
    killed twice, its user then held behind a dead letter that was no longer there)."""
    group = Group(Spec("g", 0, ACK_WAIT, 3, True, None, 0), 0)
    first = group.join(Conn(), "a")  # type: ignore[arg-type]
    group.join(Conn(), "b")  # type: ignore[arg-type]
    group.take(Entry(1, feed.LEAVE, 0, 0, b""))
    group.assign(0)
    group.expired(10)
    group.assign(10)  # its second send, at 10
    group.leave(first, 10)
    group.assign(10)  # its third, at 10 too: one consumer has it
    again, dead = group.expired(20)
    assert (again, [e.id for e in dead], group.dead_lettered) == ([], [1], 1)
    group.revive(group.dead[1])
    assert [e.id for e, _, _ in group.assign(20)] == [1]
