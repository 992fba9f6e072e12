"""The seed's eight cases, over TCP, plus the zero window."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from tidal.client import Client, Tally
from tidal.server import Server

from .rawrpc import RawPeer

pytestmark = pytest.mark.both_backends

DE = {"country": "DE"}


@pytest.mark.through_cluster
async def test_leave_stops_cohort_fanout_but_not_the_ledger(client: Client) -> None:
    assert await client.define_cohort("germany", DE)
    first = await client.signal(7, "song", "view", attrs=DE)
    await client.leave(7)
    second = await client.signal(7, "song", "view", attrs=DE)
    assert (first.forwarded, second.forwarded) == (True, False)
    counts = await client.counts("song")
    assert counts.ledger == {"view": Tally(2, 2.0)}
    assert counts.cohorts == {"germany": {"view": Tally(1, 1.0)}}


@pytest.mark.through_cluster
async def test_rejoin_resumes_cohort_fanout(client: Client) -> None:
    await client.define_cohort("germany", DE)
    await client.leave(7)
    assert not (await client.signal(7, "song", "view", attrs=DE)).forwarded
    await client.rejoin(7)
    assert (await client.signal(7, "song", "view", 2.5, attrs=DE)).forwarded
    counts = await client.counts("song")
    assert counts.cohorts == {"germany": {"view": Tally(1, 2.5)}}
    assert counts.ledger == {"view": Tally(2, 3.5)}


@pytest.mark.through_cluster
async def test_leave_is_idempotent_with_strictly_increasing_time(client: Client) -> None:
    first = await client.leave(9)
    second = await client.leave(9)
    assert first.left and second.left
    assert first.left_at_ns is not None and second.left_at_ns is not None
    assert second.left_at_ns > first.left_at_ns
    assert (await client.status(9)).left_at_ns == second.left_at_ns


@pytest.mark.through_cluster
async def test_status_lifecycle_active_left_active(client: Client) -> None:
    assert (await client.status(3)).status == "active"
    assert (await client.leave(3)).status == "left"
    assert (await client.status(3)).status == "left"
    assert (await client.rejoin(3)).status == "active"
    assert (await client.status(3)).status == "active"


@pytest.mark.through_cluster
async def test_left_at_is_kept_on_rejoin(client: Client) -> None:
    left = await client.leave(4)
    rejoined = await client.rejoin(4)
    assert rejoined.left_at_ns == left.left_at_ns
    assert (await client.status(4)).left_at_ns == left.left_at_ns
    # leaving again after a rejoin moves the boundary forward
    again = await client.leave(4)
    assert again.left_at_ns is not None and left.left_at_ns is not None
    assert again.left_at_ns > left.left_at_ns


async def test_state_survives_a_restart_of_the_server_process(process) -> None:  # type: ignore[no-untyped-def]
    await process.start()
    async with await process.connect() as c:
        await c.define_cohort("germany", DE)
        left = await c.leave(11)
        await c.leave(12)
        await c.rejoin(12)
        top = [await c.leave(2**64 - 1), await c.leave(2**63)]  # stored as negative integers
        await c.rejoin(2**63)
        await c.signal(13, "song", "like", attrs=DE, communities=["jazz"])
    assert await process.stop() == 0
    await process.start()
    async with await process.connect() as c:
        assert await c.status(11) == left
        assert await c.status(2**64 - 1) == top[0]
        high = await c.status(2**63)
        assert (high.status, high.left_at_ns) == ("active", top[1].left_at_ns)
        twelve = await c.status(12)
        assert twelve.status == "active" and twelve.left_at_ns is not None
        assert await c.cohorts() == {"germany": DE}
        assert not (await c.signal(11, "song", "like", attrs=DE, communities=["jazz"])).forwarded
        counts = await c.counts("song")
        assert counts.cohorts == {"germany": {"like": Tally(1, 1.0)}}
        assert counts.communities == {"jazz": {"like": Tally(1, 1.0)}}
        assert counts.ledger == {"like": Tally(2, 2.0)}


@pytest.mark.through_cluster
async def test_unknown_user_defaults_to_active(client: Client) -> None:
    status = await client.status(123456)
    assert (status.user_id, status.status, status.left_at_ns) == (123456, "active", None)
    rejoined = await client.rejoin(123456)
    assert (rejoined.status, rejoined.left_at_ns) == ("active", None)


@pytest.mark.through_cluster
async def test_leave_stops_community_forwarding(client: Client) -> None:
    await client.signal(5, "post", "like", communities=["chess", "go"])
    await client.leave(5)
    await client.signal(5, "post", "like", communities=["chess"])
    await client.signal(6, "post", "like", communities=["chess"])
    counts = await client.counts("post")
    assert counts.communities == {
        "chess": {"like": Tally(2, 2.0)},
        "go": {"like": Tally(1, 1.0)},
    }
    assert counts.ledger == {"like": Tally(3, 3.0)}


async def test_zero_window_pipelined_signal_leave_signal(server: Server) -> None:
    """All three in one write: the leave is applied before the second signal is read."""
    peer = await RawPeer.open(server.address)
    context = {"communities": ["c"]}
    peer.send_raw(
        msgpack.packb([0, 1, "signal", [77, "e", "view", 1.0, context]])
        + msgpack.packb([0, 2, "leave", [77]])
        + msgpack.packb([0, 3, "signal", [77, "e", "view", 1.0, context]])
    )
    replies = {r[1]: r[3] for r in [await peer.receive() for _ in range(3)]}
    peer.close()
    assert replies[1]["forwarded"] is True
    assert replies[3]["forwarded"] is False
    assert replies[3]["seq"] > replies[1]["seq"]


async def test_zero_window_holds_under_concurrent_load(server: Server) -> None:
    """Many users' [signal, leave, signal] in one write while other clients signal too:
    every first signal is forwarded and every second one gated."""
    host, port = server.address

    async def noise(c: Client) -> None:
        for i in range(200):
            await c.signal(10_000 + i, "e", "view", communities=["c"])

    async with await Client.connect(host, port) as other:
        noisy = asyncio.create_task(noise(other))
        peer = await RawPeer.open(server.address)
        context = {"communities": ["c"]}
        payload = b"".join(
            msgpack.packb([0, 3 * u, "signal", [u, "e", "view", 1.0, context]])
            + msgpack.packb([0, 3 * u + 1, "leave", [u]])
            + msgpack.packb([0, 3 * u + 2, "signal", [u, "e", "view", 1.0, context]])
            for u in range(100)
        )
        peer.send_raw(payload)
        replies = {r[1]: r[3] for r in [await peer.receive() for _ in range(300)]}
        peer.close()
        await noisy
        for u in range(100):
            assert replies[3 * u]["forwarded"] is True
            assert replies[3 * u + 2]["forwarded"] is False
        counts = await other.counts("e")
        assert counts.communities == {"c": {"view": Tally(300, 300.0)}}
        assert counts.ledger == {"view": Tally(400, 400.0)}
