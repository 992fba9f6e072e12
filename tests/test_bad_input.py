"""Bad input gets a clear error naming the argument, loses nothing, and harms no one else."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest

from tidal.client import Client, InvalidParams
from tidal.protocol import ErrorCode, error_data
from tidal.server import Server
from tidal.server.logs import configure

from .rawrpc import RawPeer

U64_MAX = 2**64 - 1


@pytest.fixture
async def peer(server: Server) -> AsyncIterator[RawPeer]:
    p = await RawPeer.open(server.address)
    yield p
    p.close()


async def expect_error(peer: RawPeer, code: int, fragment: str, method: Any, *params: Any) -> None:
    reply = await peer.call(method, *params)
    assert reply is not None, "the server closed the connection instead of answering"
    kind, msgid, error, result = reply
    assert (kind, msgid, result) == (1, 1, None)
    assert isinstance(error, list) and len(error) == 3, error
    assert error[0] == code and error[2] == error_data(code, error[1]), error
    assert fragment in error[1], error


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ([], "signal takes 3 to 5 params"),
        ([1, "e", "k", 1.0, {}, "extra"], "signal takes 3 to 5 params"),
        ([-1, "e", "k"], "user_id: must be an integer in 0..2**64-1, got int -1"),
        ([-(2**63), "e", "k"], "user_id"),
        ([True, "e", "k"], "user_id: must be an integer in 0..2**64-1, got bool True"),
        ([1.0, "e", "k"], "got float 1.0"),
        (["1", "e", "k"], "got str"),
        ([None, "e", "k"], "got nil"),
        ([1, "", "k"], "entity: must be 1..256 bytes"),
        ([1, "x" * 257, "k"], "entity: must be 1..256 bytes of UTF-8, got 257"),
        ([1, 5, "k"], "entity: must be a string, got int"),
        ([1, b"\xff", "k"], "entity: must be valid UTF-8"),
        ([1, "e", ""], "kind: must be 1..64 bytes"),
        ([1, "e", "k" * 65], "kind: must be 1..64 bytes"),
        ([1, "e", "k", "heavy"], "weight: must be a number in -1e+12..1e+12, got str"),
        ([1, "e", "k", float("nan")], "weight: must be a number in -1e+12..1e+12"),
        ([1, "e", "k", float("inf")], "weight: must be a number in -1e+12..1e+12"),
        ([1, "e", "k", True], "weight: must be a number in -1e+12..1e+12, got bool"),
        ([1, "e", "k", 1.0, []], "context: must be a map, got list"),
        ([1, "e", "k", 1.0, {"colour": 1}], "context: unknown key 'colour'"),
        ([1, "e", "k", 1.0, {"communities": "jazz"}], "context.communities: must be an array"),
        ([1, "e", "k", 1.0, {"communities": [""]}], "context.communities[0]: must be 1..128"),
        ([1, "e", "k", 1.0, {"communities": ["c"] * 65}], "at most 64 names, got 65"),
        ([1, "e", "k", 1.0, {"attrs": []}], "context.attrs: must be a map"),
        ([1, "e", "k", 1.0, {"attrs": {"a": [1]}}], "must be a str, int, float or bool"),
        ([1, "e", "k", 1.0, {"attrs": {"a": None}}], "context.attrs['a']"),
        ([1, "e", "k", 1.0, {"attrs": {5: "x"}}], "context.attrs key: must be a string"),
        ([1, "e", "k", 1.0, {"attrs": {f"a{i}": 1 for i in range(65)}}], "at most 64"),
    ],
)
async def test_signal_params_are_checked_one_by_one(
    peer: RawPeer, params: list[Any], fragment: str
) -> None:
    await expect_error(peer, ErrorCode.INVALID_PARAMS, fragment, "signal", *params)


@pytest.mark.parametrize("method", ["leave", "rejoin", "status", "purge", "erase", "history"])
@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ([], "params (user_id"),
        ([1, 2, 3, 4], "got 4"),
        ([-1], "user_id"),
        ([float(2**64)], "user_id"),
        (["7"], "user_id"),
        ([False], "user_id"),
        ([7.0], "user_id"),
    ],
)
async def test_user_id_params_are_checked(
    peer: RawPeer, method: str, params: list[Any], fragment: str
) -> None:
    await expect_error(peer, ErrorCode.INVALID_PARAMS, fragment, method, *params)


@pytest.mark.parametrize(
    ("method", "params", "fragment"),
    [
        ("rejoin", [1, 2], "rejoin takes 1 params (user_id), got 2"),
        ("purge", [1, 2], "purge takes 1 params (user_id), got 2"),
        ("erase", [1, 2], "erase takes 1 params (user_id), got 2"),
        ("leave", [1, 2], "options: must be a map, got int 2"),
        ("leave", [1, {"purge": 1}], "options.purge: must be true or false, got int 1"),
        ("leave", [1, {"purge": True, "x": 1}], "options: unknown key 'x'"),
        ("history", [1, 0], "limit: must be an integer in 1..1000, got int 0"),
        ("history", [1, 1001], "limit: must be an integer in 1..1000"),
        ("history", [1, 10, -1], "after_ns: must be a time in ns"),
        ("history", [1, 10, "0"], "after_ns: must be a time in ns since the epoch"),
        ("left_users", [-1], "after: must be an integer in 0..2**64-1, got int -1"),
        ("left_users", [None, 0], "limit: must be an integer in 1..10000"),
        ("left_users", [None, 10, 3], "left_users takes 0 to 2 params"),
    ],
)
async def test_the_past_s_params_are_checked(
    peer: RawPeer, method: str, params: list[Any], fragment: str
) -> None:
    await expect_error(peer, ErrorCode.INVALID_PARAMS, fragment, method, *params)


async def test_u64_bounds_round_trip_exactly(client: Client) -> None:
    for user in (0, 1, 2**63 - 1, 2**63, U64_MAX):
        left = await client.leave(user)
        assert left.user_id == user and left.left
        assert (await client.status(user)).user_id == user
    assert (await client.stats())["users_left"] == 5
    await client.rejoin(U64_MAX)
    assert (await client.status(U64_MAX)).status == "active"
    assert (await client.status(0)).status == "left"


async def test_client_refuses_user_ids_msgpack_cannot_carry(client: Client) -> None:
    for bad in (-1, 2**64, True):
        with pytest.raises(ValueError, match="user_id"):
            await client.leave(bad)
    assert await client.ping() == "pong"


@pytest.mark.parametrize(
    ("method", "params", "fragment"),
    [
        ("signal_batch", [], "signal_batch takes 1 to 2 params (signals, options={})"),
        ("signal_batch", [[]], "signals: must hold 1..10000 signals, got 0"),
        ("signal_batch", [{"a": 1}], "signals: must be an array"),
        ("signal_batch", [[[1, "e", "k"], 5]], "signals[1]: must be an array"),
        ("signal_batch", [[[1, "e", "k"], [1, "e"]]], "signals[1] takes 3 to 5 params"),
        ("signal_batch", [[[1, "e", "k"], [1, "e", "k", "w"]]], "signals[1].weight"),
        ("define_cohort", ["c"], "define_cohort takes 2 params"),
        ("define_cohort", ["", {}], "name: must be 1..128 bytes"),
        ("define_cohort", ["c", []], "predicate: must be a map"),
        ("define_cohort", ["c", {"a": []}], "predicate['a']: an array must hold 1..256"),
        ("define_cohort", ["c", {"a": {"b": 1}}], "predicate['a']: must be a str"),
        ("define_cohort", ["c", {"a": [1, None]}], "predicate['a'][1]"),
        ("drop_cohort", [7], "name: must be a string"),
        ("define_cohort", ["c", {f"a{i}": list(range(200)) for i in range(6)}], "at most 1024"),
        ("counts", [], "counts takes 1 to 2 params"),
        ("counts", [""], "entity: must be 1..256 bytes"),
        ("counts", ["e", []], "page: must be a map"),
        ("counts", ["e", {"from": 1}], "page: unknown key 'from'"),
        ("counts", ["e", {"limit": 0}], "page.limit: must be an integer in 1..32764"),
        ("counts", ["e", {"after": "x"}], "page.after: must be the 'more'"),
        ("counts", ["e", {"after": [1, "x", "k"]}], "page.after: must be the 'more'"),
        ("cohorts", [1], "page: must be a map"),
        ("cohorts", [{}, 2], "cohorts takes 0 to 1 params"),
        ("cohorts", [{"limit": 1001}], "page.limit: must be an integer in 1..1000"),
        ("ping", [1], "ping takes 0 params"),
        ("stats", [None], "stats takes 0 params"),
    ],
)
async def test_other_methods_check_their_params(
    peer: RawPeer, method: str, params: list[Any], fragment: str
) -> None:
    await expect_error(peer, ErrorCode.INVALID_PARAMS, fragment, method, *params)


async def test_a_batch_of_10001_is_refused_whole(peer: RawPeer, client: Client) -> None:
    batch = [[1, "big", "view"]] * 10_001
    await expect_error(
        peer,
        ErrorCode.INVALID_PARAMS,
        "must hold 1..10000 signals, got 10001",
        "signal_batch",
        batch,
    )
    assert (await client.counts("big")).ledger == {}


async def test_a_batch_with_one_bad_item_applies_nothing(peer: RawPeer, client: Client) -> None:
    batch = [[1, "atomic", "view"]] * 50 + [[1, "atomic", "view", "x"]]
    await expect_error(peer, ErrorCode.INVALID_PARAMS, "signals[50].weight", "signal_batch", batch)
    assert (await client.counts("atomic")).ledger == {}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"ack": "tiny"}, "options.ack: must be 'compact' or 'full', got str"),
        ({"ack": True}, "options.ack: must be 'compact' or 'full', got bool"),
        ({"acks": "compact"}, "options: unknown key 'acks'; the only key is 'ack'"),
        (["compact"], "options: must be a map, got list"),
    ],
)
async def test_a_batch_with_bad_options_applies_nothing(
    peer: RawPeer, client: Client, options: object, fragment: str
) -> None:
    batch = [[1, "optioned", "view"]] * 3
    await expect_error(peer, ErrorCode.INVALID_PARAMS, fragment, "signal_batch", batch, options)
    assert (await client.counts("optioned")).ledger == {}


async def test_unknown_method_is_named(peer: RawPeer) -> None:
    await expect_error(peer, ErrorCode.METHOD_NOT_FOUND, "'launch'", "launch")


async def test_bin_method_names_and_strings_work(peer: RawPeer) -> None:
    reply = await peer.call(b"signal", 3, b"entity", b"view", 1, {b"communities": [b"c"]})
    assert reply[2] is None and reply[3]["forwarded"] is True
    reply = await peer.call(b"counts", b"entity")
    assert reply[3]["communities"] == {"c": {"view": {"count": 1, "weight": 1.0}}}


async def test_a_bin_of_utf8_is_a_string_in_every_position_that_takes_one_word(
    peer: RawPeer,
) -> None:
    """Five string params took no bin, though PROTOCOL.md says any string param may be one:
    ``signal_batch``'s options.ack, ``counts``' page.window, ``top``'s by, window and
    half_life (and ``top``'s layer took a bin of bad UTF-8 as U+FFFD)."""
    batch = [[3, "binned", "view"]]
    reply = await peer.call("signal_batch", batch, {b"ack": b"compact"}, msgid=1)
    assert reply[2] is None, reply
    reply = await peer.call("counts", "binned", {b"window": b"1h"}, msgid=2)
    assert reply[2] is None and reply[3]["ledger"]["view"]["count"] == 1, reply
    for options in ({b"by": b"weight"}, {b"window": b"24h"}, {"by": "trend", b"half_life": b"6h"}):
        reply = await peer.call("top", b"ledger", None, b"view", options, msgid=3)
        assert reply[2] is None and reply[3]["entities"][0]["entity"] == "binned", (options, reply)
    reply = await peer.call("top", b"ledger\xff", None, "view", msgid=4)
    assert reply[2][0] == ErrorCode.INVALID_PARAMS and "layer" in reply[2][1]


async def test_any_integer_msgid_is_echoed(peer: RawPeer) -> None:
    for msgid in (0, -1, 2**32 + 5, 2**64 - 1, -(2**63)):
        assert await peer.call("ping", msgid=msgid) == [1, msgid, None, "pong"]


async def test_notifications_are_applied_and_never_answered(peer: RawPeer, client: Client) -> None:
    peer.send([2, "leave", [31]])
    peer.send([2, "no_such_method", []])
    peer.send([1, 99, None, "a stray response"])
    peer.send([2, "signal", [-5, "e", "k"]])  # invalid: dropped silently
    # a request after them is the first thing answered on this connection
    assert await peer.call("status", 31, msgid=5) == [
        1,
        5,
        None,
        {"user_id": 31, "status": "left", "left_at_ns": (await client.status(31)).left_at_ns},
    ]


async def test_misshapen_request_is_answered_and_the_connection_lives(peer: RawPeer) -> None:
    peer.send([0, 4, "ping"])
    kind, msgid, error, _ = await peer.receive()
    assert (kind, msgid, error[0]) == (1, 4, ErrorCode.INVALID_REQUEST)
    peer.send([0, 5, "ping", "not an array"])
    assert (await peer.receive())[2][0] == ErrorCode.INVALID_REQUEST
    assert await peer.call("ping", msgid=6) == [1, 6, None, "pong"]


async def test_a_map_keyed_by_an_array_is_answered_and_the_connection_lives(
    peer: RawPeer,
) -> None:
    """It was -32700 quoting Python's TypeError, and the connection closed."""
    peer.send_raw(b"\x94\x00\x07\xa6signal\x94\x01\xa1e\xa1k\x81\x91\x01\x01")
    kind, msgid, error, _ = await peer.receive()
    assert (kind, msgid, error[0]) == (1, 7, ErrorCode.INVALID_REQUEST)
    assert error[1].startswith("a map key must be a string") and "TypeError" not in error[1]
    assert await peer.call("ping", msgid=8) == [1, 8, None, "pong"]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("x" * 1_000_000, []),
        ("cohorts", [{"\x01\x02" * 500_000: 1}]),
        ("signal", [1, "e", "k", 1.0, {"\x00" * 1_000_000: 1}]),
        ("signal", [1, "e", "k", 1.0, {"attrs": {"a" * 1_000_000: 1}}]),
        ("top", ["cohort", "n" * 1_000_000, "view"]),
    ],
    ids=["method", "page-key", "signal-options", "attr-key", "top-name"],
)
async def test_an_error_quotes_a_short_prefix_of_a_long_input(
    peer: RawPeer, method: str, params: list[object]
) -> None:
    """A 1 MB method name came back as a 4 MB error message, and went to the log whole."""
    reply = await peer.call(method, *params, msgid=9)
    code, message = reply[2][0], reply[2][1]
    assert code in (ErrorCode.METHOD_NOT_FOUND, ErrorCode.INVALID_PARAMS), reply[2]
    assert len(message) <= 400, f"{len(message)} characters: {message[:300]}"
    assert await peer.call("ping", msgid=10) == [1, 10, None, "pong"]


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",
        msgpack.packb("just a string"),
        msgpack.packb([0, "msgid", "ping", []]),
        b"\x91" * 1100,
        msgpack.packb({1: 2}),
    ],
    ids=["0xc1", "string", "str-msgid", "deep", "map"],
)
async def test_garbage_closes_only_its_own_connection(
    server: Server, client: Client, data: bytes
) -> None:
    bad = await RawPeer.open(server.address)
    bad.send_raw(data)
    assert await bad.closed()
    bad.close()
    assert await client.ping() == "pong"
    assert (await client.signal(1, "e", "k")).forwarded


async def test_a_9_mib_message_gets_error_3_then_close(server: Server, client: Client) -> None:
    bad = await RawPeer.open(server.address)
    bad.send([0, 42, "signal", [1, "e", "k", 1.0, {"attrs": {"blob": "x" * (9 << 20)}}]])
    kind, msgid, error, result = await bad.receive()
    assert (kind, msgid, result) == (1, 42, None)
    assert error[0] == ErrorCode.TOO_LARGE and "8388608" in error[1]
    assert await bad.closed()
    bad.close()
    assert await client.ping() == "pong"


async def test_malformed_bytes_inside_a_request_are_answered_before_close(
    server: Server,
) -> None:
    bad = await RawPeer.open(server.address)
    bad.send_raw(b"\x94\x00\x09\xa4ping\xc1")
    reply = await bad.receive()
    assert reply is not None and reply[:2] == [1, 9] and reply[2][0] == ErrorCode.PARSE_ERROR
    assert await bad.closed()
    bad.close()


async def test_the_number_of_cohorts_is_capped(client: Client) -> None:
    from tidal.protocol.limits import MAX_COHORTS

    for i in range(MAX_COHORTS):
        await client.define_cohort(f"c{i}", {"n": i})
    with pytest.raises(InvalidParams, match="at most 1000 cohorts"):
        await client.define_cohort("one-more", {"n": -1})
    assert await client.define_cohort("c0", {"n": "replaced"})  # replacing is not adding
    assert await client.drop_cohort("c1")
    assert await client.define_cohort("one-more", {"n": -1})


def test_a_log_line_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    """Whoever logs what a client sent, the line stays short: the throttle let one 4 MB
    line a code through every 10 s."""
    root = logging.getLogger()
    kept = root.handlers[:], root.level, logging.getLogger("tidal").level
    try:
        configure("info", "text")
        logging.getLogger("tidal.connection").warning("said %s", "\x00" * 1_000_000)
        configure("info", "json")
        logging.getLogger("tidal.connection").warning("said %s", "y" * 1_000_000)
    finally:
        root.handlers[:], level, tidal_level = kept
        root.setLevel(level)
        logging.getLogger("tidal").setLevel(tidal_level)
    text, json_line = capsys.readouterr().err.splitlines()
    assert len(text) < 4200 and text.endswith("(cut: 1000005 characters)"), text[-80:]
    assert len(json_line) < 4300 and "(cut: 1000005 characters)" in json_line
