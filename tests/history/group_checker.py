"""The checker of a consumer group's history (``groups``), run after each fault once the
load has stopped: it first drains the group (a consumer that acknowledges everything),
then holds the server to every delivery and ack recorded."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from itertools import pairwise
from typing import Any

from tidal.client import Client

from .groups import GROUP, GroupHistory, Session
from .workload import USERS

OPTOUTS = ("leave", "purge", "erase")


async def drain(record: GroupHistory, port: int, c: Client) -> str | None:
    """Everything acknowledged by one consumer: None once the group is at lag 0 with
    nothing pending, or why it never was (stuck)."""
    session = await Session.open(record, port)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ids = []
            while not session.events.empty():
                got = session.events.get_nowait()
                if got is not None:
                    ids.append(got.id)
            if ids:
                await session.ack(sorted(set(ids)))
            [group] = [g for g in await c.groups() if g["name"] == GROUP]
            if group["lag_events"] == 0 and group["pending"] == 0 and not ids:
                return None
            await asyncio.sleep(0.02)  # a poll's pace: the group's state says when
        return f"stuck: {group}"
    finally:
        session.close()


async def check(record: GroupHistory, port: int, c: Client,
                feed: list[tuple[int, str, int | None]]) -> list[tuple[float, str]]:  # fmt: skip
    wrong: list[tuple[float, str]] = []
    stuck = await drain(record, port, c)
    if stuck is not None:
        wrong.append((0, f"group {GROUP} is not drained once the load stopped: {stuck}"))
        return wrong
    delivered: dict[int, list[Any]] = defaultdict(list)
    for d in record.deliveries:
        delivered[d.id].append(d)
    missing = [i for i, _, _ in feed if i not in delivered]
    if missing:
        wrong.append((0, f"group {GROUP}: events never delivered: {missing[:10]}"))
    acked: dict[int, float] = {}
    for ack in record.acks:
        if ack.outcome == "ok":
            for i in ack.ids:
                acked[i] = min(acked.get(i, ack.completed), ack.completed)
    for i, at in acked.items():
        again = [d for d in delivered[i] if d.at > at]
        if again:
            wrong.append((again[0].at, (
                f"group {GROUP}: event {i} delivered again (session {again[0].session},"
                f" deliveries {again[0].deliveries}) after its ack was answered"
            )))  # fmt: skip
    wrong += _order(record)
    wrong += await _receipts(record, c, feed)
    return wrong


def _order(record: GroupHistory) -> list[tuple[float, str]]:
    """Each user's events first received in id order."""
    first: dict[int, Any] = {}
    for d in record.deliveries:
        if d.id not in first:
            first[d.id] = d
    by_user: dict[int, list[Any]] = defaultdict(list)
    for d in sorted(first.values(), key=lambda d: d.at):
        if d.user is not None:
            by_user[d.user].append(d)
    out = []
    for user, seen in by_user.items():
        for before, after in pairwise(seen):
            if after.id < before.id:
                out.append((after.at, (
                    f"group {GROUP}: user {user}'s event {after.id} was first received"
                    f" (session {after.session}) after their later event {before.id}"
                    f" (session {before.session})"
                )))  # fmt: skip
                break
    return out


Feed = list[tuple[int, str, int | None]]


async def _receipts(record: GroupHistory, c: Client, feed: Feed) -> list[tuple[float, str]]:
    latest: dict[tuple[int, str], int] = {}
    for event_id, name, user in feed:
        if user is not None and name in OPTOUTS:
            latest[(user, name)] = event_id
    acked = {i for ack in record.acks if ack.outcome in ("ok", "unknown") for i in ack.ids}
    out: list[tuple[float, str]] = []
    for user in USERS:
        receipt = await c.receipt(user)
        got = {o["event"]: o for o in receipt["optouts"]}
        want = {name: i for (u, name), i in latest.items() if u == user}
        if {name: o["id"] for name, o in got.items()} != want:
            out.append((0, f"receipt({user}) names {got}; the feed's latest opt-outs: {want}"))
            continue
        for name, optout in got.items():
            word = optout["groups"].get(GROUP)
            if word is None or word["state"] != "acknowledged":
                out.append((0, f"receipt({user}): {name} {optout['id']} is {word} once drained"))
            elif optout["id"] not in acked:
                out.append((0, f"receipt({user}): {name} {optout['id']} acknowledged by no ack"))
    waiting = await c.unconfirmed(GROUP)
    if waiting["users"]:
        out.append((0, f"unconfirmed({GROUP}) once drained: {waiting['users'][:5]}"))
    return out
