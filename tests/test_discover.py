"""``rpc.discover`` both ways, against a real server: params generated from each method's
declared schemas are taken, every reply validates against the declared result (jsonschema),
and a value just past each declared limit is refused with -32602.

The params are drawn by ``strategy`` below, from the subset of JSON Schema the table uses:
hypothesis-jsonschema 0.23.1, the newest, fails inside hypothesis 6.170 on any object
schema (``'many' object has no attribute 'more'``).

The fifth round of hostile input found eight disagreements: ``counts``' ``more`` declared
as three strings (it is [layer, key, kind]), its declared ``page.after`` refused,
``subscribe {"events": []}`` declared valid and refused, and four limits enforced but not
declared. What a schema cannot say (a cohort must exist, a half-life must be one the server
ranks by, a cursor must be one it made) is named below, with why.
"""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import jsonschema
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidal.cli.child import listening_port
from tidal.protocol import ErrorCode
from tidal.protocol.methods import TABLE

from .test_openrpc import as_json

#: methods whose params are not generated: they change the connection (auth, the feed)
NOT_GENERATED = {"auth", "subscribe", "unsubscribe"}
#: refusals of declared-valid params that depend on the server's state or settings, which
#: a schema cannot declare: (method, the refusal's words)
STATEFUL = [
    ("top", "no cohort named"),  # a cohort's name, as it is defined now
    ("drop_cohort", "no cohort named"),
    ("top", "options.half_life: must be one the server ranks trends by"),  # --trend-half-lives
    ("top", "options.after: must be the 'next'"),  # a cursor the server made
    ("counts", "page.after"),  # ... and a counts page's, of a cohort that may be gone
    ("signal", "at_ns"),  # at most 5 minutes ahead of the server's clock
    ("signal_batch", "at_ns"),
    ("define_cohort", "is changing already"),
    # consumer groups: a group must exist (or not, to be made), an id be pending to this
    # connection, a start be an event id given already
    ("group_create", "exists already"),
    ("group_create", "past the last event id"),
    ("group_reset", "past the last event id"),
    *[
        (m, "no group named")
        for m in ("group_drop", "group_reset", "dead_letters", "redeliver", "unconfirmed")
    ],
    ("ack", "consumes no group"),
    ("nack", "consumes no group"),
    ("redeliver", "no dead letter"),
    # rules between params, or between an options map's keys, that OpenRPC cannot declare
    # (each param has a schema of its own): PROTOCOL.md says them in words
    ("top", "name: must be a string"),  # a cohort's or community's name; nil for the ledger
    ("top", "name: must be nil for the ledger"),
    ("top", "options.window: not with by 'trend'"),
    ("top", "options.half_life: only with by 'trend'"),
]


class Peer:
    """A blocking MessagePack-RPC peer, the document its only knowledge of tidal."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.msgid = 0

    def send(self, method: str, params: list[Any]) -> tuple[Any, Any]:
        """(error, result) of one call."""
        self.msgid += 1
        self.sock.sendall(msgpack.packb([0, self.msgid, method, params], use_bin_type=True))
        while True:
            for message in self.unpacker:
                if message[0] == 1 and message[1] == self.msgid:
                    return message[2], message[3]
            data = self.sock.recv(1 << 20)
            assert data, f"the server closed the connection on {method}({params!r})"
            self.unpacker.feed(data)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Peer, dict[str, Any]]]:
    db = tmp_path_factory.mktemp("discover") / "t.db"
    argv = [sys.executable, "-m", "tidal.cli", "serve", "--port", "0", "--db", str(db)]
    child = subprocess.Popen(argv, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert child.stderr is not None
        while (port := listening_port(child.stderr.readline())) is None:
            assert child.poll() is None, "tidal serve exited before listening"
        peer = Peer(port)
        error, doc = peer.send("rpc.discover", [])
        assert error is None, error
        yield peer, {m["name"]: m for m in doc["methods"]}
    finally:
        child.terminate()
        child.wait(30)


def params_schema(method: dict[str, Any]) -> dict[str, Any]:
    """The whole params array of a method as one schema."""
    params = method["params"]
    return {
        "type": "array",
        "items": [p["schema"] for p in params],
        "minItems": sum(p["required"] for p in params),
        "maxItems": len(params),
    }


def strategy(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values a JSON Schema (the table's subset of draft 7) takes; a bin (``x-msgpack``) as
    bytes, as MessagePack carries it."""
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for either in ("oneOf", "anyOf"):
        if either in schema:
            return st.one_of([strategy(s) for s in schema[either]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([strategy({**schema, "type": k}) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    # an integer MessagePack can carry: past it, there is nothing to send
    low, high = schema.get("minimum", -(2**63)), schema.get("maximum", 2**64 - 1)
    if kind == "integer":
        return st.integers(int(low), int(high))
    if kind == "number":
        return st.one_of(
            st.integers(math.ceil(low), math.floor(high)),
            st.floats(
                schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False
            ),
        )
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        if schema.get("x-msgpack") == "bin":
            return st.binary(max_size=64)
        size = {"min_size": schema.get("minLength", 0), "max_size": schema.get("maxLength", 40)}
        # the rule counts UTF-8 bytes and refuses NUL: ASCII letters keep both in view
        return st.text(st.characters(min_codepoint=1, max_codepoint=0x7F), **size)
    if kind == "array":
        items = schema.get("items", {})
        least, most = schema.get("minItems", 0), schema.get("maxItems")
        if isinstance(items, list):  # a tuple: its first n, n within the bounds
            cut = len(items) if most is None else min(most, len(items))
            return st.integers(least, cut).flatmap(
                lambda n: st.tuples(*(strategy(i) for i in items[:n])).map(list)
            )
        unique = bool(schema.get("uniqueItems"))
        return st.lists(strategy(items), min_size=least, max_size=min(most or 4, 4), unique=unique)
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        fixed = st.fixed_dictionaries(
            {k: strategy(v) for k, v in properties.items() if k in required},
            optional={k: strategy(v) for k, v in properties.items() if k not in required},
        )
        extra = schema.get("additionalProperties")
        if not isinstance(extra, dict):
            return fixed
        letters = st.characters(min_codepoint=0x61, max_codepoint=0x7A)
        names = st.text(letters, min_size=1, max_size=8)
        return st.tuples(fixed, st.dictionaries(names, strategy(extra), max_size=3)).map(
            lambda parts: {**parts[1], **parts[0]}
        )
    raise AssertionError(f"a schema this test cannot draw from: {schema}")


def stateful(method: str, error: list[Any]) -> bool:
    return any(method == m and words in error[1] for m, words in STATEFUL)


GENERATED = [m.name for m in TABLE if m.params and m.name not in NOT_GENERATED]


@pytest.mark.parametrize("name", GENERATED)
def test_declared_params_are_taken_and_replies_are_as_declared(
    served: tuple[Peer, dict[str, Any]], name: str
) -> None:
    peer, methods = served
    method = methods[name]
    result = jsonschema.Draft7Validator(method["result"]["schema"])

    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy(params_schema(method)))
    def one(params: list[Any]) -> None:
        error, answer = peer.send(name, params)
        if error is not None:
            assert error[0] not in (ErrorCode.INVALID_REQUEST, ErrorCode.PARSE_ERROR), error
            assert error[0] != ErrorCode.INVALID_PARAMS or stateful(name, error), (
                f"{name}{json.dumps(params)[:300]}: the document takes it, the server says"
                f" {error[1]}"
            )
            return
        result.validate(as_json(answer))

    one()


def past(schema: dict[str, Any]) -> list[Any]:
    """Values just past a schema's declared bounds (the ones a number, a string or an
    array declares)."""
    out: list[Any] = []
    if schema.get("type") == "integer":
        if "maximum" in schema:
            out.append(schema["maximum"] + 1)
        if "minimum" in schema:
            out.append(schema["minimum"] - 1)
    if schema.get("type") == "string" and "maxLength" in schema:
        out.append("x" * (schema["maxLength"] + 1))
    if schema.get("type") == "array" and "minItems" in schema and schema["minItems"] > 0:
        out.append([])
    return out


def sendable(value: Any) -> bool:
    """What MessagePack can carry: an integer past 64 bits cannot be sent at all."""
    return not isinstance(value, int) or -(2**63) <= value < 2**64


def limits() -> Iterator[tuple[str, list[Any]]]:
    """Each method's example (or its defaults), with one param, or one key of an options
    map, just past its declared limit."""
    for method in TABLE:
        if method.examples:
            base = list(method.examples[0][0])
        elif all(not p.required for p in method.params):
            base = [p.default for p in method.params]
        else:
            continue
        for i, param in enumerate(method.params):
            schema = param.schema
            if i >= len(base):
                base.append(param.default)
            for bad in filter(sendable, past(schema)):
                yield method.name, [*base[:i], bad, *base[i + 1 :]]
            for key, inner in schema.get("properties", {}).items():
                for bad in filter(sendable, past(inner)):
                    yield method.name, [*base[:i], {key: bad}, *base[i + 1 :]]


LIMITS = list(limits())


def test_limits_are_found() -> None:
    """The four that were enforced and not declared are declared now, and checked below."""
    named = {(m, json.dumps(p, default=str)) for m, p in LIMITS}
    for method, fragment in (
        ("counts", '"limit": 32765'),
        ("cohorts", '"after": "xxxxxxxx'),
        ("subscribe", '"from": 9223372036854775808'),
        ("history", "9223372036854775808"),
        ("subscribe", '"events": []'),
    ):
        assert any(m == method and fragment in p for m, p in named), (method, fragment)


@pytest.mark.parametrize(("name", "params"), LIMITS, ids=lambda v: re.sub(r"\W", "", str(v))[:40])
def test_just_past_a_declared_limit_is_refused(
    served: tuple[Peer, dict[str, Any]], name: str, params: list[Any]
) -> None:
    peer, _ = served
    error, answer = peer.send(name, params)
    assert error is not None and error[0] == ErrorCode.INVALID_PARAMS, (name, params, answer)
