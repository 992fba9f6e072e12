"""The HTTP edge's sans-I/O parts, without sockets: JSON mapped by the method table's
schemas, requests read from bytes within their bounds, and errors given their status."""

from __future__ import annotations

import base64
import json

import pytest

from tidal.protocol import ErrorCode
from tidal.protocol import http_replies as h
from tidal.protocol.http_requests import MAX_HEAD_BYTES, RemoteHttpError, RequestReader
from tidal.protocol.jsonmap import JsonError, Mapping, loads
from tidal.protocol.methods import BY_NAME


def mapping(name: str) -> Mapping:
    return Mapping(BY_NAME[name])


def test_wide_integers_are_answered_as_strings_and_taken_either_way() -> None:
    status = mapping("status")
    top = 2**64 - 1
    assert status.params({"user_id": str(top)}) == [top]
    assert status.params([top]) == [top]  # a JSON number past 2**53 is parsed exactly
    answer = status.answer({"user_id": top, "status": "left", "left_at_ns": 2**62, "purged": 3})
    assert answer == {"user_id": str(top), "status": "left", "left_at_ns": str(2**62), "purged": 3}
    # a count has no range past 2**53: it stays a number, as does a nil time
    assert status.answer({"user_id": 1, "status": "active", "left_at_ns": None}) == {
        "user_id": "1",
        "status": "active",
        "left_at_ns": None,
    }


def test_a_string_that_is_no_integer_is_left_for_the_edge_to_refuse() -> None:
    # the edge's rule names the param; the mapping never guesses
    assert mapping("status").params(["12x"]) == ["12x"]
    assert mapping("status").params(["1" * 30]) == ["1" * 30]


def test_bins_are_base64_both_ways() -> None:
    batch = mapping("signal_batch")
    bits = bytes([0b101])
    answer = batch.answer({"first_seq": 1, "forwarded": bits, "repeated": []})
    assert answer["forwarded"] == base64.b64encode(bits).decode()
    top = mapping("top")
    cursor = b"\x00\x01\xff"
    options = {"after": base64.b64encode(cursor).decode(), "limit": 5}
    params = top.params(["ledger", None, "view", options])
    assert params[3]["after"] == cursor


def test_params_by_name_take_defaults_for_those_left_out() -> None:
    signal = mapping("signal")
    assert signal.params({"user_id": 1, "entity": "e", "kind": "view"}) == [1, "e", "view"]
    filled = signal.params({"user_id": 1, "entity": "e", "kind": "view", "context": {}})
    assert filled == [1, "e", "view", 1.0, {}]
    with pytest.raises(JsonError, match="entity: required"):
        signal.params({"user_id": 1, "kind": "view"})
    with pytest.raises(JsonError, match="no param 'colour'"):
        signal.params({"user_id": 1, "entity": "e", "kind": "v", "colour": 1})
    with pytest.raises(JsonError, match="takes a JSON array"):
        signal.params("1")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"a": 1, "a": 2}', "given twice"),
        (b"[NaN]", "NaN is not a number"),
        (b"[Infinity]", "Infinity"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"{", "not JSON"),
        (b"\xff\xfe", "not UTF-8|not JSON"),
    ],
)
def test_bodies_json_does_not_allow_are_refused(body: bytes, why: str) -> None:
    with pytest.raises(JsonError, match=why):
        loads(body)


def test_a_duplicate_key_deep_inside_is_refused_too() -> None:
    with pytest.raises(JsonError, match="'x' is given twice"):
        loads(b'[1, {"c": {"x": 1, "x": 1}}]')


def test_pipelined_requests_come_out_whole_and_in_order() -> None:
    reader = RequestReader(1000)
    data = (
        b"POST /v1/ping HTTP/1.1\r\nHost: a\r\n\r\n"
        b"POST /v1/status HTTP/1.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 3\r\n\r\n[1]"
        b"GET /health?x=1 HTTP/1.1\r\nConnection: close\r\n\r\n"
    )
    got = []
    for i in range(0, len(data), 7):  # in pieces, as a network delivers them
        got.extend(reader.receive_data(data[i : i + 7]))
    assert [(r.method, r.path, r.query, r.body) for r in got] == [
        ("POST", "/v1/ping", "", b""),
        ("POST", "/v1/status", "", b"[1]"),
        ("GET", "/health", "x=1", b""),
    ]
    assert [r.keep_alive for r in got] == [True, True, False]
    assert got[1].headers["content-type"] == "application/json"
    assert reader.pending == 0


def test_a_chunked_body_is_joined_and_bounded() -> None:
    reader = RequestReader(10)
    head = b"POST /v1/ping HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    (req,) = reader.receive_data(head + b"3\r\n[1]\r\n0\r\n\r\n")
    assert req.body == b"[1]"
    with pytest.raises(RemoteHttpError) as caught:
        reader.receive_data(head + b"8\r\n12345678\r\n8\r\n12345678\r\n")
    assert caught.value.status == 413


def test_a_declared_length_over_the_limit_is_refused_before_its_body() -> None:
    reader = RequestReader(100)
    with pytest.raises(RemoteHttpError) as caught:
        reader.receive_data(b"POST /v1/ping HTTP/1.1\r\nContent-Length: 101\r\n\r\n")
    assert caught.value.status == 413 and "101 bytes" in str(caught.value)


def test_headers_past_the_bound_are_refused_as_they_arrive() -> None:
    reader = RequestReader(100)
    reader.receive_data(b"GET / HTTP/1.1\r\n")
    with pytest.raises(RemoteHttpError) as caught:
        for _ in range(MAX_HEAD_BYTES // 1000 + 2):
            reader.receive_data(b"X-Pad: " + b"a" * 1000 + b"\r\n")
    assert caught.value.status == 431


@pytest.mark.parametrize(
    "data",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
    ],
)
def test_broken_http_is_a_400(data: bytes) -> None:
    with pytest.raises(RemoteHttpError) as caught:
        RequestReader(100).receive_data(data)
    assert caught.value.status == 400


def test_a_repeated_authorization_header_is_refused() -> None:
    with pytest.raises(RemoteHttpError, match="authorization given twice"):
        RequestReader(100).receive_data(
            b"GET / HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n"
        )


@pytest.mark.parametrize(
    ("code", "message", "status", "header"),
    [
        (ErrorCode.INVALID_PARAMS, "user_id: ...", 400, None),
        (ErrorCode.PARSE_ERROR, "body: not JSON", 400, None),
        (ErrorCode.UNAUTHORIZED, "unauthorized", 401, "www-authenticate"),
        (ErrorCode.METHOD_NOT_FOUND, "method not found", 404, None),
        (ErrorCode.TOO_LARGE, "body: over", 413, None),
        (ErrorCode.UNAVAILABLE, "starting: loading", 503, "retry-after"),
        (ErrorCode.UNAVAILABLE, "standby: waits", 503, "retry-after"),
        (ErrorCode.UNAVAILABLE, "storage unavailable: gone", 503, "retry-after"),
        (ErrorCode.UNAVAILABLE, "full: the memory budget", 507, None),
        (
            ErrorCode.MOVED,
            "moved: user 7 is in partition 3, served by 10.0.0.2:7411",
            421,
            "tidal-owner",
        ),
        (ErrorCode.INTERNAL_ERROR, "internal error in x", 500, None),
    ],
)
def test_each_error_has_its_status(
    code: int, message: str, status: int, header: str | None
) -> None:
    got, body, more = h.error_body(code, message)
    assert got == status
    error = json.loads(body)["error"]
    assert error["code"] == code and error["message"] == message
    if header is not None:
        assert header in dict(more)
    if code == ErrorCode.MOVED:
        assert dict(more)["tidal-owner"] == "10.0.0.2:7411"
        assert error["data"] == {"owner": "10.0.0.2:7411", "user_id": "7", "partition": 3}
