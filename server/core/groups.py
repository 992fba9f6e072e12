"""A consumer group, sans-I/O: which of the feed's events it holds, which consumer each is
out to, and what is settled (acknowledged or dead-lettered).

It reads the feed in id order into a bounded window of the events it has not settled
(``WINDOW``); its cursor is the event before the lowest one unsettled. Each event is out
to one consumer at most, and a user's events to one consumer, in order: the consumer
with one of the user's events out takes the next ones; a user with none out is placed by
rendezvous hashing (users spread; a consumer that joins takes a share). One pass
(``assign``) walks the window in id order, and the first event of a user it cannot send
(a full consumer, a delay, a dead letter ahead when the order waits) holds back that
user's later ones: per-user order is the walk's order. An event out past ``ack_wait``, or
whose consumer goes, is sent again; past ``max_deliveries`` it is a dead letter, kept
with its own copy of the event until ``redeliver`` sends it back.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from .group_parts import ACKED, DEAD, INFLIGHT, PENDING, WINDOW, Consumer, Entry, Recorded, Spec
from .replies import Replier


@dataclass(slots=True, eq=False)
class Group:
    spec: Spec
    read_to: int  # the last event taken (or passed over)
    lost: tuple[int, int] | None = None  # events retention deleted before it read them
    window: dict[int, Entry] = field(default_factory=dict)  # unsettled, in id order
    revived: dict[int, Entry] = field(default_factory=dict)  # dead letters sent back
    dead: dict[int, Entry] = field(default_factory=dict)
    dead_users: dict[int | None, int] = field(default_factory=dict)
    consumers: dict[Replier, Consumer] = field(default_factory=dict)
    owner: dict[int | None, Consumer] = field(default_factory=dict)
    recorded: dict[int, Recorded] = field(default_factory=dict)  # boot's, till read
    #: what is to be sent (not out, not settled), in id order once ``unsorted`` is cleared:
    #: a pass walks these only, not what is out
    ready: dict[int, Entry] = field(default_factory=dict)
    unsorted: bool = False  # an event went back among later ones
    #: (sent at, id, event) of each send, the earliest first; a send since made stale (its
    #: event acknowledged, or sent again) is dropped as it comes to the top
    expiry: list[tuple[int, int, Entry]] = field(default_factory=list)
    next_key: int = 0
    saved: int = -1  # the cursor last recorded (-1: to record)
    epoch: int = 0  # raised by a reset: what was read before it is let go of
    acked: int = 0  # since boot
    redelivered: int = 0
    dead_lettered: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def cursor(self) -> int:
        """Every event up to here is acknowledged or a dead letter."""
        for first in self.window:
            return first - 1
        return self.read_to

    def room(self) -> int:
        return WINDOW - len(self.window)

    def take(self, entry: Entry) -> None:
        """An event read from the feed, in id order; one stored as acknowledged (out of
        order, before a restart) passes, and one sent before keeps its count."""
        self.read_to = entry.id
        if not self.spec.takes(entry.kind) or entry.id in self.dead or entry.id in self.revived:
            return  # not its kind, or a dead letter (sent back or not) it holds already
        known = self.recorded.pop(entry.id, None) if self.recorded else None
        if known is not None:
            if known.state != PENDING:
                return
            entry.deliveries, entry.first_ns = known.deliveries, known.first_ns
        self.window[entry.id] = entry
        self.ready[entry.id] = entry  # the newest: in order

    def untake(self, ids: list[int], read_to: int) -> None:
        """Events taken from a batch whose commit failed: their ids are given again."""
        for i in ids:
            self.window.pop(i, None)
            self.ready.pop(i, None)
        self.read_to = read_to

    def pending(self) -> Iterator[Entry]:
        yield from self.revived.values()
        yield from self.window.values()

    def find(self, event_id: int) -> Entry | None:
        return self.window.get(event_id) or self.revived.get(event_id)

    # -- consumers -----------------------------------------------------------

    def join(self, conn: Replier, peer: str) -> Consumer:
        consumer = Consumer(conn, self.next_key, peer)
        self.next_key += 1
        self.consumers[conn] = consumer
        return consumer

    def leave(self, consumer: Consumer, now: int) -> list[Entry]:
        """``consumer`` is gone: what it had out is sent to the others; those past their
        deliveries are dead letters (returned, to be stored)."""
        self.consumers.pop(consumer.conn, None)
        dead = []
        for entry in sorted(consumer.out.values(), key=lambda e: e.id):
            if self.back(entry, now, "its consumer's connection ended"):
                dead.append(entry)
        return dead

    def _choose(self, user: int | None) -> Consumer | None:
        owner = self.owner.get(user)
        if owner is not None:
            return owner
        best: Consumer | None = None
        top = -1
        for consumer in self.consumers.values():
            score = hash((user, consumer.key)) & 0xFFFFFFFFFFFF
            if score > top:
                best, top = consumer, score
        return best

    def assign(self, now: int) -> list[tuple[Entry, int, int]]:
        """The events to send now, each marked out to its consumer, in id order per user;
        with when each was first and last sent before (to put back if refused). The walk
        ends once no consumer has room: a full window costs a pass no more than that."""
        room = sum(len(c.out) < INFLIGHT and not c.conn.blocked() for c in self.consumers.values())
        sent: list[tuple[Entry, int, int]] = []
        held: set[int | None] = set()
        wait = self.spec.wait
        if self.unsorted:
            self.ready, self.unsorted = dict(sorted(self.ready.items())), False
        for entry in list(self.ready.values()):
            if not room:
                break
            user = entry.user
            if user in held:
                continue
            if entry.not_before > now or (wait and user in self.dead_users):
                held.add(user)
                continue
            consumer = self._choose(user)
            if consumer is None or len(consumer.out) >= INFLIGHT or consumer.conn.blocked():
                held.add(user)
                continue
            sent.append((entry, entry.first_ns, entry.sent_ns))
            self._send(entry, consumer, now)
            room -= len(consumer.out) >= INFLIGHT
        return sent

    def _send(self, entry: Entry, consumer: Consumer, now: int) -> None:
        if entry.deliveries:
            self.redelivered += 1
        entry.deliveries += 1
        entry.first_ns = entry.first_ns or now
        entry.sent_ns = now
        entry.consumer = consumer
        del self.ready[entry.id]
        heapq.heappush(self.expiry, (now, entry.id, entry))
        consumer.out[entry.id] = entry
        user = entry.user
        consumer.users[user] = consumer.users.get(user, 0) + 1
        self.owner[user] = consumer

    def unsend(self, entry: Entry, deliveries: int, first_ns: int, sent_ns: int) -> None:
        """A send whose commit failed: as it was before."""
        self._release(entry)
        entry.deliveries, entry.first_ns, entry.sent_ns = deliveries, first_ns, sent_ns
        self._ready(entry)

    def _ready(self, entry: Entry) -> None:
        self.ready[entry.id] = entry
        self.unsorted = True

    def _release(self, entry: Entry) -> None:
        consumer = entry.consumer
        if consumer is None:
            return
        entry.consumer = None
        consumer.out.pop(entry.id, None)
        user = entry.user
        left = consumer.users.get(user, 1) - 1
        if left:
            consumer.users[user] = left
        else:
            consumer.users.pop(user, None)
            if self.owner.get(user) is consumer:
                del self.owner[user]

    def back(self, entry: Entry, now: int, reason: str, delay_ns: int = 0) -> bool:
        """An event out is to be sent again (after ``delay_ns``); True if it has had its
        deliveries and is a dead letter instead."""
        self._release(entry)
        entry.not_before = now + delay_ns if delay_ns else 0
        if entry.deliveries >= self.spec.max_deliveries:
            self.kill(entry, now, entry.reason or f"{reason}; delivered {entry.deliveries} times")
            return True
        self._ready(entry)
        return False

    def expired(self, now: int) -> tuple[list[Entry], list[Entry]]:
        """Events out past ``ack_wait``: (those to send again, those now dead letters)."""
        limit = now - self.spec.ack_wait_ns
        late: dict[int, Entry] = {}  # an event sent twice at one time is in the heap twice
        while self.expiry and self.expiry[0][0] <= limit:
            sent_ns, _, entry = heapq.heappop(self.expiry)
            if entry.consumer is not None and entry.sent_ns == sent_ns:
                late[entry.id] = entry
        again: list[Entry] = []
        dead: list[Entry] = []
        for entry in sorted(late.values(), key=lambda e: e.id):
            died = self.back(entry, now, "not acknowledged within ack_wait")
            (dead if died else again).append(entry)
        return again, dead

    def next_expiry(self) -> int | None:
        """When the first event out passes ``ack_wait`` (ns), if any is out."""
        expiry = self.expiry
        while expiry and (expiry[0][2].consumer is None or expiry[0][2].sent_ns != expiry[0][0]):
            heapq.heappop(expiry)  # stale: acknowledged, or sent again since
        return expiry[0][0] + self.spec.ack_wait_ns if expiry else None

    def ack(self, entry: Entry, now: int) -> None:
        self._release(entry)
        self.ready.pop(entry.id, None)
        self.window.pop(entry.id, None)
        self.revived.pop(entry.id, None)
        entry.state, entry.done_ns = ACKED, now
        self.acked += 1

    def unack(self, entry: Entry) -> None:
        """An acknowledgement whose commit failed: the event is to be sent again."""
        entry.state, entry.done_ns = PENDING, 0
        self.acked -= 1
        self._put_back(entry)

    def kill(self, entry: Entry, now: int, reason: str) -> None:
        """A dead letter: settled for the cursor, kept with its data until sent back."""
        self._release(entry)
        self.ready.pop(entry.id, None)
        self.window.pop(entry.id, None)
        self.revived.pop(entry.id, None)
        entry.state, entry.done_ns, entry.reason = DEAD, now, reason
        self.dead[entry.id] = entry
        self.dead_users[entry.user] = self.dead_users.get(entry.user, 0) + 1
        self.dead_lettered += 1

    def revive(self, entry: Entry) -> None:
        """A dead letter sent back: delivered afresh, before the user's later events."""
        self._undead(entry)
        entry.deliveries, entry.first_ns, entry.revived = 0, 0, True
        self._put_back(entry)

    def unkill(self, entry: Entry) -> None:
        """A dead letter whose commit failed: pending again."""
        if entry.id in self.dead:
            self._undead(entry)
            self.dead_lettered -= 1
            self._put_back(entry)

    def _undead(self, entry: Entry) -> None:
        del self.dead[entry.id]
        left = self.dead_users.pop(entry.user, 1) - 1
        if left:
            self.dead_users[entry.user] = left
        entry.state, entry.done_ns = PENDING, 0

    def _put_back(self, entry: Entry) -> None:
        held = self.revived if entry.revived else self.window
        held[entry.id] = entry
        ordered = dict(sorted(held.items()))
        if entry.revived:
            self.revived = ordered
        else:
            self.window = ordered
        self._ready(entry)

    # -- moved by an operator ------------------------------------------------------

    def reset(self, cursor: int) -> None:
        """Reads on from ``cursor``: what it had out is forgotten, a loss cleared."""
        for consumer in self.consumers.values():
            for entry in list(consumer.out.values()):
                self._release(entry)
        self.window, self.recorded, self.ready = {}, {}, dict(self.revived)
        self.read_to, self.lost = cursor, None
        self.epoch += 1

    def restore(
        self,
        window: dict[int, Entry],
        read_to: int,
        lost: tuple[int, int] | None,
        recorded: dict[int, Recorded],
    ) -> None:
        """A reset whose commit failed: as before it (what it had out, sent again)."""
        self.reset(read_to)
        self.window, self.lost, self.recorded = window, lost, recorded
        self.ready.update((i, e) for i, e in window.items() if e.consumer is None)
        self.unsorted = True
