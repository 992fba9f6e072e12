"""The consumer groups' requests: made and dropped, joined by ``subscribe``, acknowledged,
given back, their dead letters listed and sent back; and the receipts of opt-outs.

Each is checked whole before it changes anything: an ack naming one id not out to this
connection changes nothing of the others. What it changes is applied in memory at once,
recorded in the open batch with its undo, and answered once that batch has committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from tidal.protocol.refusals import InvalidParams
from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.core.group_batch import Undone
from tidal.server.core.group_params import Settings
from tidal.server.core.group_parts import DEAD, Entry, Spec
from tidal.server.core.groups import Group
from tidal.server.core.owners import Router
from tidal.server.core.replies import Replier
from tidal.server.storage import groups_sql
from tidal.server.storage.sqlbulk import Dialect, Plan

from .committer import Committer
from .consumers import Groups
from .group_consumer import Link, address, consumer_of, lost_message
from .group_figures import describe
from .publisher import Feed
from .receipts import receipt_plan, unconfirmed_plan

Beside = Callable[[Replier, int | None, Callable[[Dialect], Plan[Any]]], None]


class GroupCalls:
    def __init__(
        self,
        groups: Groups,
        feed: Feed,
        committer: Committer,
        clock: Callable[[], int],
        beside: Beside,
        router: Router,
    ) -> None:
        self._groups = groups
        self._feed = feed
        self._committer = committer
        self._clock = clock
        self._beside = beside
        #: cluster mode: partition 0's node serves the groups, each write fenced by its
        #: epoch (``group_lead``); the others answer ``moved``
        self._lead = router.check_lead

    def _writable(self) -> Batch:
        batch = self._committer.writable()
        self._lead(batch)
        return batch

    def _group(self, name: str, where: str) -> Group:
        self._lead()
        group = self._groups.groups.get(name)
        if group is None:
            known = ", ".join(repr(n) for n in sorted(self._groups.groups)[:5]) or "none"
            raise InvalidParams(f"{where}: no group named {name!r} (groups: {known})")
        return group

    # -- the feed's two requests, for a group's consumers ---------------------------

    def subscribe(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        _, names, name = args[0]
        if conn.listener is not None:
            raise InvalidParams("subscribe: this connection is subscribed already; unsubscribe")
        if name is None:
            self._feed.subscribe(conn, msgid, args)
            return
        group = self._group(name, "options.group")
        kinds = None if names is None else frozenset(feed.KINDS[n] for n in names)
        if kinds is not None and kinds != group.spec.kinds:
            raise InvalidParams(
                f"options.events: group {name!r} takes the events group_create gave it;"
                " leave events out"
            )
        if group.lost is not None:
            raise InvalidParams(lost_message(name, group.lost))
        consumer = group.join(conn, address(getattr(conn, "peer", None)))
        conn.listener = Link(self._groups, group, consumer)
        conn.reply(msgid, {"last_id": self._feed.last_id, "group": name, "cursor": group.cursor()})
        self._groups.due()

    def unsubscribe(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        joined = consumer_of(conn)
        if joined is None:
            self._feed.unsubscribe(conn, msgid, args)
            return
        self._groups.leave(*joined)
        conn.reply(msgid, True)

    # -- groups -------------------------------------------------------------------------

    def group_create(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        name, settings = args
        assert isinstance(settings, Settings)  # parsed at the edge (``group_params``)
        batch = self._writable()
        if name in self._groups.groups:
            raise InvalidParams(f"name: a group named {name!r} exists already")
        last = self._feed.last_id
        start = last if settings.start is None else settings.start
        if start > last:
            raise InvalidParams(f"options.from: {start} is past the last event id, {last}")
        kinds = (
            None if settings.events is None else frozenset(feed.KINDS[n] for n in settings.events)
        )
        spec = Spec(
            name,
            start,
            int(settings.ack_wait_s * 1e9),
            settings.max_deliveries,
            settings.wait,
            kinds,
            self._clock(),
        )
        group = self._groups.groups[name] = Group(spec, start, saved=start)
        batch.group_writes().created[name] = groups_sql.spec_row(spec, start)
        batch.undo.append(Undone(lambda: self._forget(group)))
        self._committer.ack(conn, msgid, {"name": name, "cursor": start})
        self._groups.due()

    def _forget(self, group: Group) -> None:
        if self._groups.groups.get(group.name) is group:
            del self._groups.groups[group.name]
        dropped = [int(InvalidParams.code), f"group {group.name!r} was dropped"]
        for consumer in list(group.consumers.values()):
            self._groups.leave(group, consumer)
            consumer.conn.end(msgpack.packb([2, "error", dropped]))

    def group_drop(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        name: str = args[0]
        batch = self._writable()
        group = self._group(name, "name")
        w = batch.group_writes()
        w.created.pop(name, None)
        w.forget(name)
        w.cursors.pop(name, None)
        w.reset.pop(name, None)
        w.lost.pop(name, None)
        w.dropped.append(name)
        self._forget(group)
        batch.undo.append(Undone(lambda: self._groups.groups.setdefault(name, group)))
        self._committer.ack(conn, msgid, True)

    def group_reset(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        name, start = args
        batch = self._writable()
        group = self._group(name, "name")
        last = self._feed.last_id
        cursor = last if start is None else start
        if cursor > last:
            raise InvalidParams(f"options.from: {cursor} is past the last event id, {last}")
        before = (dict(group.window), group.read_to, group.lost, dict(group.recorded))
        group.reset(cursor)
        w = batch.group_writes()
        w.forget(name, keep=lambda e: e.state == DEAD)
        w.reset[name] = cursor
        w.lost[name] = None
        w.cursors[name] = (cursor, cursor)  # the reset's deletes did the rest
        group.saved = cursor
        batch.undo.append(Undone(lambda: group.restore(*before)))
        self._committer.ack(conn, msgid, {"cursor": cursor})
        self._groups.due()

    def groups(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        self._lead()
        now = self._clock()
        self._committer.answer(
            conn,
            msgid,
            [
                describe(group, self._feed.last_id, now)
                for _, group in sorted(self._groups.groups.items())
            ],
        )

    # -- acknowledgements ------------------------------------------------------------

    def _out(self, conn: Replier, ids: list[int], method: str) -> tuple[Group, list[Entry]]:
        """The events ``ids`` names, each out to this connection's consumer; else an error
        naming the first that is not, and nothing changed."""
        self._lead()
        joined = consumer_of(conn)
        if joined is None:
            raise InvalidParams(
                f"{method}: this connection consumes no group; subscribe with options.group"
            )
        group, consumer = joined
        if self._groups.groups.get(group.name) is not group:
            raise InvalidParams(f"{method}: group {group.name!r} was dropped")
        entries = []
        for i, event_id in enumerate(ids):
            entry = group.find(event_id)
            if entry is None:
                raise InvalidParams(
                    f"ids[{i}]: event {event_id} is not pending in group {group.name!r}"
                    " (acknowledged already, a dead letter, or never delivered to it)"
                )
            if entry.consumer is not consumer:
                whose = "another consumer" if entry.consumer else "no consumer now"
                raise InvalidParams(
                    f"ids[{i}]: event {event_id} is out to {whose}, not this connection"
                    " (its ack_wait passed, or it was given back): it is sent again"
                )
            entries.append(entry)
        return group, entries

    def ack(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        group, entries = self._out(conn, args[0], "ack")
        batch = self._writable()
        w = batch.group_writes()
        now = self._clock()
        for entry in entries:
            group.ack(entry, now)
            w.record(group, entry)
        batch.undo.append(Undone.each(group.unack, entries))
        self._committer.ack(conn, msgid, {"acked": len(entries), "cursor": group.cursor()})
        self._groups.due()

    def nack(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        ids, (delay, dead, reason) = args
        group, entries = self._out(conn, ids, "nack")
        batch = self._writable()
        now = self._clock()
        killed = []
        for entry in entries:
            entry.reason = reason or entry.reason
            if dead:
                group.kill(entry, now, reason or "given back as dead by its consumer")
                killed.append(entry)
            elif group.back(entry, now, "given back", int(delay * 1e9)):
                killed.append(entry)
        self._groups.killed(batch, group, killed)
        self._committer.ack(conn, msgid, {"nacked": len(entries), "dead": len(killed)})
        self._groups.due()

    # -- dead letters ------------------------------------------------------------------

    def dead_letters(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        name, (after, limit) = args
        group = self._group(name, "group")
        ids = sorted(i for i in group.dead if i > after)
        page = [
            {
                "id": e.id,
                "event": msgpack.unpackb(e.data),
                "user_id": e.user,
                "deliveries": e.deliveries,
                "reason": e.reason,
                "at_ns": e.done_ns,
            }
            for e in (group.dead[i] for i in ids[:limit])
        ]
        more = ids[limit - 1] if len(ids) > limit else None
        self._committer.answer(conn, msgid, {"dead_letters": page, "more": more})

    def redeliver(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        name, ids = args
        group = self._group(name, "group")
        for i, event_id in enumerate(ids):
            if event_id not in group.dead:
                raise InvalidParams(f"ids[{i}]: event {event_id} is no dead letter of {name!r}")
        batch = self._writable()
        w = batch.group_writes()
        entries = [group.dead[i] for i in ids]
        for entry in entries:
            group.revive(entry)
            w.record(group, entry, True)
        now = self._clock()
        batch.undo.append(Undone.each(lambda e: group.kill(e, now, e.reason), entries))
        self._committer.ack(conn, msgid, {"redelivered": len(entries)})
        self._groups.due()

    # -- receipts ------------------------------------------------------------------------

    def receipt(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        user_id: int = args[0]
        self._beside(conn, msgid, receipt_plan(user_id, self._kinds()))

    def unconfirmed(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        name, older_s, after, limit = args[0]
        if name is not None:
            self._group(name, "options.group")
        before = self._clock() - int(older_s * 1e9)
        self._beside(conn, msgid, unconfirmed_plan(name, before, after, limit, self._kinds()))

    def _kinds(self) -> dict[str, frozenset[int] | None]:
        self._lead()
        return {name: g.spec.kinds for name, g in self._groups.groups.items()}
