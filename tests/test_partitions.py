"""Cluster mode's rules without a socket: which partition a user is in (fixed forever, so
its values are pinned here as docs/PROTOCOL.md gives them), how nodes share partitions,
and how a client routes by a partition map."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.client.errors import ConnectionLost, InvalidParams, Moved, Unavailable
from tidal.client.routing import MOVES, Router, Step, address
from tidal.protocol.partitions import HASH, fmix64, partition
from tidal.server.core import shares


@pytest.mark.parametrize(
    ("user_id", "hashed", "part"),
    [
        (0, 0, 0),
        (1, 12994781566227106604, 44),
        (42, 9297814886316923340, 204),
        (2**63, 10338021812380738707, 147),
        (2**64 - 1, 7256831767414464289, 33),
    ],
)
def test_the_hash_is_the_documented_one(user_id: int, hashed: int, part: int) -> None:
    assert fmix64(user_id) == hashed
    assert partition(user_id, 256) == part


@given(st.integers(0, 2**64 - 1), st.integers(1, 65_536))
def test_the_fast_partition_is_the_documented_rule(user_id: int, partitions: int) -> None:
    assert partition(user_id, partitions) == fmix64(user_id) % partitions


def test_sequential_users_spread_evenly() -> None:
    spread = Counter(partition(u, 256) for u in range(256_000))
    assert len(spread) == 256
    # as a uniform random choice would (binomial: 1,000 +- 32): within 5 deviations
    assert min(spread.values()) > 840 and max(spread.values()) < 1160, spread


def test_nodes_take_fair_shares_from_an_empty_table_and_a_dead_node() -> None:
    nodes = ["a:1", "b:1", "c:1"]
    holders: list[str | None] = [None] * 256
    take, give = shares.plan(nodes, "b:1", holders, set())
    assert len(take) == 85 and not give  # a:1 takes 86, the first in name order
    assert shares.plan(nodes, "a:1", holders, set())[0] != take  # they start apart
    # c:1 is dead: its partitions are free to the two alive, up to 128 each
    dead: list[str | None] = [*["a:1"] * 86, *["b:1"] * 85, *["c:1"] * 85]
    take, give = shares.plan(nodes[:2], "b:1", dead, set(range(86, 171)))
    assert len(take) == 43 and set(take) <= set(range(171, 256)) and not give


def test_a_node_past_its_share_hands_over_only_what_a_short_node_cannot_find_free() -> None:
    holders: list[str | None] = [*["a:1"] * 128, *["b:1"] * 128]
    # c:1 joined: a and b each give exactly their excess, the highest partitions first
    take, give = shares.plan(["a:1", "b:1", "c:1"], "a:1", holders, set(range(128)))
    assert not take and give == list(range(86, 128))
    take, give = shares.plan(["a:1", "b:1", "c:1"], "b:1", holders, set(range(128, 256)))
    assert not take and len(give) == 43
    # at its share, with nobody short: nothing moves
    assert shares.plan(["a:1", "b:1"], "a:1", holders, set(range(128))) == ([], [])
    # rows a previous run of this node left: handed back at once when it has its share
    left: list[str | None] = [*["a:1"] * 130, *["b:1"] * 126]
    take, give = shares.plan(["a:1", "b:1"], "a:1", left, set(range(128)))
    assert give[:2] == [128, 129]


def test_a_router_splits_by_owner_and_follows_moved() -> None:
    owners = [["n1:1", 1] if p % 2 else ["n2:2", 1] for p in range(256)]
    router = Router({"cluster": "x", "partitions": 256, "hash": HASH, "owners": owners})
    groups = router.split([0, 1, 42, 2**64 - 1])  # partitions 0, 44, 204, 33
    assert groups == {"n2:2": [0, 1, 2], "n1:1": [3]}
    router.moved(router.part(1), "n3:3")
    assert router.owner(1) == "n3:3" and router.owner(0) == "n2:2"
    assert address("[::1]:7411") == ("::1", 7411)
    one = Router({"cluster": None, "partitions": 1, "hash": HASH, "owners": [[None, 0]]})
    assert one.owner(5) is None and not one.clustered
    with pytest.raises(ValueError, match="hashes users with 'crc32'"):
        Router({"cluster": "x", "partitions": 1, "hash": "crc32", "owners": [[None, 0]]})


def test_a_router_says_what_to_do_after_each_failure() -> None:
    owners = [["n1:1", 1] for _ in range(256)]
    router = Router({"cluster": "x", "partitions": 256, "hash": HASH, "owners": owners})
    named = Moved("moved: user 1 is in partition 44, served by n2:2")
    assert router.after(named, 44, 0, sent=True) == Step(0.0, False, False)
    assert router.owner(1) == "n2:2"
    nobody = Moved("moved: user 1 is in partition 44, served by unknown")
    assert router.after(nobody, 44, 2, sent=True) == Step(0.30000000000000004, True, False)
    assert router.after(named, None, 0, sent=True) == Step(0.0, True, False)  # a batch part
    assert router.after(named, 44, MOVES - 1, sent=True) is None  # the caller's, at last
    loading = Unavailable("starting: partition 44 (user 1) is loading on this node; retry")
    assert router.after(loading, 44, 0, sent=True) == Step(0.1, False, False)
    assert router.after(Unavailable("storage unavailable: disk full"), 1, 0, sent=True) is None
    # a node not reached: tried elsewhere; lost with the request sent: the caller's
    assert router.after(ConnectionLost("refused"), 1, 0, sent=False) == Step(0.1, True, True)
    assert router.after(ConnectionLost("reset"), 1, 0, sent=True) is None
    assert router.after(InvalidParams("weight: must be finite"), 1, 0, sent=True) is None
