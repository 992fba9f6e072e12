"""The change feed's ids and bounds without a server (``engine.publisher``,
``engine.logged_feed``, ``engine.event_retention``): each batch's events take the next
ids as the writer takes it, a refused batch gives its ids back, cluster mode's replay
leaves what this node has not applied to live delivery, and retention never reaches an
event a replay still has to read. Over a real SQLite storage, opened and closed here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidal.server.config import Config
from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.core.board import Board
from tidal.server.core.budget import Budget
from tidal.server.core.feed import Change
from tidal.server.core.owners import Router
from tidal.server.engine.committer import Committer
from tidal.server.engine.cycle import Cycle
from tidal.server.engine.event_retention import EventRetention
from tidal.server.engine.logged_feed import LoggedFeed
from tidal.server.engine.publisher import Feed
from tidal.server.engine.room import ReplyRoom
from tidal.server.storage.backends import open_storage

NOW = 1_700_000_000 * 10**9


@pytest.fixture
async def committer(tmp_path: Path) -> AsyncIterator[Committer]:
    storage = await open_storage(Config(db=str(tmp_path / "tidal.db")), None)
    room = ReplyRoom(Budget(Board([], NOW), 0))
    try:
        yield Committer(storage, lambda: 1, Cycle(), room=room, router=Router())
    finally:
        await storage.close()


def leaves(*users: int) -> Batch:
    batch = Batch(1)
    batch.changes = [Change(feed.LEAVE, NOW, user, NOW) for user in users]
    return batch


async def test_each_batch_s_events_take_the_next_ids_and_a_refused_one_gives_them_back(
    committer: Committer,
) -> None:
    publisher = Feed(41, committer, lambda: NOW)
    first, refused = leaves(1, 2), leaves(3)
    publisher.prepare(first)
    publisher.prepare(refused)
    assert [c.id for c in first.changes + refused.changes] == [42, 43, 44]
    publisher.failed(refused, Batch(2), unknown=False)
    again = leaves(5, 6)
    publisher.prepare(again)
    assert [c.id for c in again.changes] == [44, 45]  # no gap where the refused one was


async def test_cluster_mode_s_ids_come_from_the_log_and_its_replay_stops_at_what_it_applied(
    committer: Committer,
) -> None:
    logged = LoggedFeed(10, committer, lambda: NOW)
    batch = leaves(1)
    logged.prepare(batch)
    assert batch.changes[0].id == 0  # given in the transaction, from the log's row
    rows = [(i, feed.LEAVE, b"") for i in range(8, 14)]  # 11..13: other nodes', not applied
    seen, last = logged._seen(rows)
    assert ([r[0] for r in seen], last) == ([8, 9, 10], True)
    assert logged._seen(rows[:3]) == (rows[:3], True)  # a short page is the last anyway


async def test_retention_s_chunk_is_bounded_by_the_feed_and_only_when_a_pass_is_due(
    committer: Committer,
) -> None:
    """The bound is the last event committed: no reader, replay or group, holds
    retention back (a replay cut off by it: ``test_feed_restarts``, end to end)."""
    publisher = Feed(100, committer, lambda: NOW)
    retention = EventRetention(10.0, publisher, committer, lambda: NOW)
    assert not retention.writes(Batch(1))  # no pass due: no transaction for it
    batch = Batch(1)
    batch.retire_events = (NOW - 10 * 10**9, 0)
    retention.prepare(batch)
    assert batch.retire_events == (NOW - 10 * 10**9, publisher.last_id) == (NOW - 10 * 10**9, 100)
    assert retention.writes(batch)
