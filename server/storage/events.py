"""The SQL of the change feed: its events written with the changes they record, a page
read for a subscriber's replay, the oldest cut off by retention, the last id at boot."""

from __future__ import annotations

from typing import Final

from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.core.feed import FeedRead

from .sqlbulk import SET_META, Bulk, Changed, Exec, Plan, Put, Rows

EVENTS: Final = Bulk(
    "INSERT INTO events (id, at_ns, kind, data)", ("bigint", "bigint", "smallint", "bytea")
)
_PAGE: Final = "SELECT id, kind, data FROM events WHERE id > ? ORDER BY id LIMIT ?"
# the oldest events, in id order, that are old enough and that no replay still needs
# (times follow ids: each event's time is later than the one before)
_RETIRE: Final = """
    DELETE FROM events WHERE id IN (
        SELECT id FROM events WHERE id <= ? ORDER BY id LIMIT ?) AND at_ns < ?"""


def read(page: FeedRead) -> Plan[None]:
    """Before the batch's writes: what committed before it."""
    page.rows = yield Rows(_PAGE, (page.after, feed.PAGE))
    ((page.oldest,),) = yield Rows("SELECT MIN(id) FROM events")


def write(batch: Batch) -> Plan[None]:
    """After the batch's withdrawals, whose counts its events carry. The last id is kept
    apart from the rows, which retention may delete all of: an id is never given twice."""
    if batch.changes:
        yield Put(EVENTS, [change.encode() for change in batch.changes])
        if batch.log is None:  # cluster mode: the commit log's row counts them
            yield Exec(SET_META, ("last_event_id", batch.changes[-1].id))


def retire(batch: Batch) -> Plan[int]:
    """Retention's chunk: how many old events it deleted."""
    if batch.retire_events is None:
        return 0
    before_ns, through = batch.retire_events
    retired: int = yield Changed(_RETIRE, (through, feed.RETIRE_EVENTS, before_ns))
    return retired


def last(meta_last: int) -> Plan[tuple[int, int]]:
    """At boot: the last event id given, and the latest event time (0 if none)."""
    rows = yield Rows("SELECT id, at_ns FROM events ORDER BY id DESC LIMIT 1")
    if not rows:
        return meta_last, 0
    last_id, at_ns = rows[0]
    return max(int(last_id), meta_last), int(at_ns)
