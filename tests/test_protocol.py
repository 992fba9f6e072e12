"""The sans-I/O protocol, without sockets: bytes in, events out."""

from __future__ import annotations

import tracemalloc
from typing import Any

import msgpack
import pytest

from tidal.protocol import (
    DECODING,
    NEED_DATA,
    BadRequest,
    Connection,
    ErrorCode,
    LocalProtocolError,
    Notification,
    RemoteProtocolError,
    Request,
    Response,
    error_data,
    notification_head,
)
from tidal.server.engine.health import Booting, Standby


def events(conn: Connection, data: bytes) -> list[object]:
    conn.receive_data(data)
    out: list[object] = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(event)
    return out


def test_request_notification_and_response_decode() -> None:
    conn = Connection()
    data = (
        msgpack.packb([0, 1, "leave", [5]])
        + msgpack.packb([2, "signal", [1, "e", "k"]])
        + msgpack.packb([1, 9, None, "pong"])
    )
    assert events(conn, data) == [
        Request(1, "leave", [5]),
        Notification("signal", [1, "e", "k"]),
        Response(9, None, "pong"),
    ]


@pytest.mark.parametrize("method", ["event", "heartbeat", "x" * 40])
def test_a_notification_head_and_an_argument_packed_apart_are_one_notification(
    method: str,
) -> None:
    """The change feed encodes an event once and sends it behind this head, to every
    subscriber: the bytes must be exactly ``[2, method, [event]]``."""
    event = {"id": 2**63 - 1, "event": "leave", "user_id": 2**64 - 1, "name": "ü" * 40}
    data = notification_head(method) + msgpack.packb(event)
    assert data == msgpack.packb([2, method, [event]])
    assert events(Connection(), data * 2) == [Notification(method, [event])] * 2


def test_a_message_split_at_every_byte_decodes_once() -> None:
    conn = Connection()
    data = msgpack.packb([0, 2**64 - 1, "status", [2**64 - 1]])
    seen = []
    for i in range(len(data)):
        seen += events(conn, data[i : i + 1])
    assert seen == [Request(2**64 - 1, "status", [2**64 - 1])]


def test_bin_method_names_are_accepted() -> None:
    conn = Connection()
    data = msgpack.packb([0, 3, b"ping", []], use_bin_type=True)
    assert events(conn, data) == [Request(3, "ping", [])]


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ([0, 1, "ping"], "got 3 elements"),
        ([0, 1, 42, []], "method"),
        ([0, 1, b"\xff\xfe", []], "method"),
        ([0, 1, "ping", {"a": 1}], "params"),
        ([0, 1, "ping", None], "params"),
    ],
)
def test_a_misshapen_request_with_a_msgid_is_answered_not_fatal(
    message: list[object], fragment: str
) -> None:
    conn = Connection()
    data = msgpack.packb(message, use_bin_type=True) + msgpack.packb([0, 2, "ping", []])
    first, second = events(conn, data)
    assert isinstance(first, BadRequest)
    assert first.msgid == 1 and first.code == ErrorCode.INVALID_REQUEST
    assert fragment in first.message
    assert second == Request(2, "ping", [])  # the stream goes on


def _map_keyed_by(key: bytes) -> bytes:
    """A one-entry map whose key is ``key``'s encoding: msgpack-python refuses to pack it."""
    return b"\x81" + key + b"\x01"


@pytest.mark.parametrize("key", [msgpack.packb([1, 2]), msgpack.packb({"a": 1})])
def test_a_map_key_that_is_an_array_or_a_map_is_answered_in_our_words(key: bytes) -> None:
    """Python cannot hash it: it was -32700 quoting a TypeError, and the connection closed.
    The frame is whole, so the request is answered and the stream goes on, after a
    notification with the same key too (nobody to tell), and a large message's slices."""
    conn = Connection(decode_slice=16)
    bad = b"\x94\x00\x01\xa4ping\x91" + _map_keyed_by(key)  # [0, 1, "ping", [{key: 1}]]
    quiet = b"\x93\x02\xa4ping\x91" + _map_keyed_by(key)  # [2, "ping", [{key: 1}]]
    padded = b"\x94\x00\x03\xa4ping\x92" + msgpack.packb("x" * 100) + _map_keyed_by(key)
    data = bad + quiet + msgpack.packb([0, 2, "ping", []]) + padded
    data += msgpack.packb([0, 4, "ping", []])
    first, second, third, fourth = events(conn, data)
    assert isinstance(first, BadRequest) and first.msgid == 1
    assert first.code == ErrorCode.INVALID_REQUEST
    assert first.message.startswith("a map key must be a string")
    assert "TypeError" not in first.message
    assert second == Request(2, "ping", [])
    assert isinstance(third, BadRequest) and third.msgid == 3
    assert fourth == Request(4, "ping", [])


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb(42),
        msgpack.packb({"a": 1}),
        msgpack.packb([]),
        msgpack.packb([7, 1, "x", []]),
        msgpack.packb([0, "1", "ping", []]),
        msgpack.packb([0, True, "ping", []]),
        msgpack.packb([2, "only-two"]),
        msgpack.packb([1, 1, None]),
        b"\xc1",
        b"\x91" * 2000,  # nesting far deeper than 1024
    ],
)
def test_what_cannot_be_answered_breaks_the_connection(data: bytes) -> None:
    conn = Connection()
    with pytest.raises(RemoteProtocolError):
        events(conn, data)
    # and it stays broken: an Unpacker is never reused after a decode error
    with pytest.raises(RemoteProtocolError):
        conn.receive_data(msgpack.packb([0, 1, "ping", []]))


def test_a_message_over_the_limit_names_its_msgid() -> None:
    conn = Connection(max_message_size=1024)
    head = msgpack.packb([0, 77, "signal_batch"])[1:]  # without the 3-array header
    data = b"\x94" + head + b"\xdc\x10\x00" + msgpack.packb("x" * 100) * 0x1000
    with pytest.raises(RemoteProtocolError) as info:
        for i in range(0, len(data), 100):
            events(conn, data[i : i + 100])
    assert info.value.code == ErrorCode.TOO_LARGE
    assert info.value.msgid == 77


@pytest.mark.parametrize(
    ("header", "announced"),
    [
        (b"\xdd\xff\xff\xff\xff", "4,294,967,295 elements"),  # array 32
        (b"\xdf\xff\xff\xff\xff", "4,294,967,295 pairs"),  # map 32
        (b"\xdb\x40\x00\x00\x00", "1,073,741,824 bytes"),  # str 32: a gigabyte
        (b"\xc6\x00\x00\x10\x01", "4,097 bytes"),  # bin 32: one byte more than the limit
        (b"\xde\x08\x01", "2,049 pairs"),  # map 16: 4,098 elements
    ],
)
def test_a_header_that_proves_a_message_cannot_fit_is_refused_at_once(
    header: bytes, announced: str
) -> None:
    """Before: held until --message-timeout, as a message that might still come whole."""
    conn = Connection(max_message_size=4096)
    with pytest.raises(RemoteProtocolError) as info:
        events(conn, b"\x94\x00\x05\xa6signal\x93\x01\xa1e" + header)
    assert info.value.code == ErrorCode.TOO_LARGE
    assert info.value.msgid == 5
    assert announced in str(info.value)


def test_a_header_cut_in_two_is_read_once_it_is_whole() -> None:
    conn = Connection(max_message_size=4096)
    assert events(conn, b"\x94\x00\x05\xa4ping\x91\xdd\xff") == []
    with pytest.raises(RemoteProtocolError) as info:
        events(conn, b"\xff\xff\xff")
    assert info.value.code == ErrorCode.TOO_LARGE


def test_an_honest_large_message_in_small_pieces_is_never_refused_early() -> None:
    """Its headers announce what fits: every piece but the last leaves it partial."""
    conn = Connection(max_message_size=80_000)
    attrs = {"a": "x" * 60_000, "b": b"y" * 4_000, "c": list(range(3_000))}
    whole = msgpack.packb([0, 3, "signal", [1, "e", "k", 1.0, {"attrs": attrs}]])
    got: list[object] = []
    for i in range(0, len(whole), 7):
        got += events(conn, whole[i : i + 7])
        assert got == [] or i + 7 >= len(whole)
    assert len(got) == 1
    request = got[0]
    assert isinstance(request, Request)
    assert request.params[4]["attrs"]["a"] == "x" * 60_000


def test_headers_within_the_limit_are_no_proof_the_size_limit_refuses_later() -> None:
    """Two strings of 3,000 bytes each fit alone, not together: the bytes tell, once they
    pass the limit."""
    conn = Connection(max_message_size=4096)
    str_3000 = b"\xda\x0b\xb8"
    assert events(conn, b"\x94\x00\x05\xa4ping\x92" + str_3000 + b"a" * 3000) == []
    assert events(conn, str_3000 + b"a" * 1000) == []  # 4,016 bytes: within the limit
    with pytest.raises(RemoteProtocolError) as info:
        events(conn, b"a" * 1000)
    assert info.value.code == ErrorCode.TOO_LARGE
    assert info.value.msgid == 5


def test_array_headers_cost_no_memory_until_their_elements_arrive() -> None:
    """5 bytes announcing 16,000 elements made msgpack reserve 128 KiB at once: 1 KiB of
    them pinned 13 MB per connection. Memory now follows the bytes received."""
    conn = Connection()
    assert len(events(conn, msgpack.packb([0, 1, "ping", []]))) == 1  # the decoder is made
    headers = b"\xdd\x00\x00\x3e\x80" * 200  # 1,000 bytes, 3.2 million elements announced
    tracemalloc.start()
    try:
        assert events(conn, headers) == []
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 64 * 1024, f"1,000 bytes of headers hold {held} bytes"
    # and a header announcing more than could ever fit is refused as soon as it is read
    small = Connection(max_message_size=1024)
    with pytest.raises(RemoteProtocolError) as info:
        events(small, b"\xdd\xff\xff\xff\xff")
    assert info.value.code == ErrorCode.TOO_LARGE


def test_pending_counts_the_bytes_of_a_partial_message() -> None:
    conn = Connection()
    whole = msgpack.packb([0, 1, "ping", []])
    partial = msgpack.packb([0, 2, "signal", [1, "e", "view"]])[:-3]
    assert len(events(conn, whole + partial)) == 1
    assert conn.offset == len(whole)
    assert conn.pending == len(partial)


def holds_a_decoder(conn: Connection) -> bool:
    framing = conn._framing
    return framing._scanner is not None and framing._unpacker is not None


def test_a_resting_connection_lets_go_of_its_decoder_and_goes_on() -> None:
    conn = Connection()
    ping = msgpack.packb([0, 1, "ping", []])
    assert len(events(conn, ping)) == 1
    conn.rest()
    assert not holds_a_decoder(conn)
    half = msgpack.packb([0, 2, "status", [7]])
    assert events(conn, ping + half[:5]) != [] and conn.pending == 5
    conn.rest()  # a message is pending: the decoder stays
    assert holds_a_decoder(conn)
    (event,) = events(conn, half[5:])
    assert event == Request(2, "status", [7]) and conn.offset == len(ping) * 2 + len(half)


def test_a_large_message_is_decoded_a_slice_at_a_time() -> None:
    message = msgpack.packb([0, 9, "signal_batch", [[[i, "e", "view"] for i in range(20_000)]]])
    conn = Connection(decode_slice=4096)
    conn.receive_data(message + msgpack.packb([0, 10, "ping", []]))
    slices = 0
    while (event := conn.next_event()) is DECODING:
        slices += 1
    assert slices >= len(message) // 4096 - 1
    assert event == Request(9, "signal_batch", [[[i, "e", "view"] for i in range(20_000)]])
    assert conn.next_event() == Request(10, "ping", [])


def test_many_small_messages_in_one_chunk_are_not_too_large() -> None:
    conn = Connection(max_message_size=1024)
    data = msgpack.packb([0, 1, "ping", []]) * 10_000
    assert len(events(conn, data)) == 10_000


def test_send_round_trips_through_a_peer() -> None:
    server, client = Connection(), Connection()
    request = Request(2**63, "signal", [1, "e", "k", 1.5, {"attrs": {"a": True}}])
    assert events(server, client.send(request)) == [request]
    reply = server.send_responses([[1, 2**63, [2, "unavailable"], None]])
    assert events(client, reply) == [Response(2**63, [2, "unavailable"], None)]


@pytest.mark.parametrize("count", [0, 1, 15, 16, 65535, 65536])
def test_many_responses_encode_as_a_plain_stream(count: int) -> None:
    replies = [[1, i, None, {"seq": i, "forwarded": i % 2 == 0}] for i in range(count)]
    data = Connection().send_responses(replies)
    assert data == b"".join(msgpack.packb(r) for r in replies)


@pytest.mark.parametrize("msgid", [-(2**63) - 1, 2**64, True, "1"])
def test_send_refuses_a_msgid_msgpack_cannot_carry(msgid: object) -> None:
    with pytest.raises(LocalProtocolError):
        Connection().send(Request(msgid, "ping", []))  # type: ignore[arg-type]


def test_send_refuses_what_msgpack_cannot_encode() -> None:
    conn = Connection()
    with pytest.raises(LocalProtocolError):
        conn.send(Request(1, "leave", [object()]))
    # the packer is still usable afterwards
    assert events(Connection(), conn.send(Request(2, "ping", []))) == [Request(2, "ping", [])]


@pytest.mark.parametrize(
    ("code", "message", "data"),
    [
        (2, Booting.STARTING_MESSAGE, {"kind": "starting"}),
        (2, Standby("postgresql://db").refusal(), {"kind": "standby"}),
        (2, "retry: another node changed the cohorts after this request's signals were"
            " matched, several times; nothing of it was applied", {"kind": "retry"}),
        (2, "full: this write would create aggregates past --memory-budget", {"kind": "full"}),
        (2, "stopping: this node is shutting down", {"kind": "stopping"}),
        (2, "storage unavailable: database is locked; nothing was saved", {"kind": "unavailable"}),
        (4, "moved: user 42 is in partition 204, served by 10.0.0.2:7411",
            {"owner": "10.0.0.2:7411", "user_id": 42, "partition": 204}),
        (4, "moved: user 7 is in partition 3, served by unknown",
            {"owner": None, "user_id": 7, "partition": 3}),
        (4, "moved: partitions {3} lost while this request was being committed; nothing of it"
            " was saved; served by unknown", {"owner": None}),
        (-32602, "options.from: the events after 5 are no longer kept (kept); the oldest kept"
                 " is 812: rebuild from the current state", {"oldest": 812}),
        (-32602, "user_id: must be an integer in 0..2**64-1, got int -1", {}),
        (1, "unauthorized: wrong token", {}),
    ],
)  # fmt: skip
def test_an_error_s_data_says_what_its_message_says(code: int, message: str, data: Any) -> None:
    """The third element of ``[code, message, data]``: what a client in any language reads
    instead of the message (PROTOCOL.md), for each form of message tidal writes."""
    assert error_data(code, message) == data
