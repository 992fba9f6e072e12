"""The OpenRPC document: built from the method table, served by ``rpc.discover``, shipped as
``docs/openrpc.json``, valid against OpenRPC's meta-schema, and enough on its own to drive
every method from a client that knows nothing else of tidal."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import msgpack
import pytest
import referencing
from referencing.jsonschema import DRAFT7

from tidal.protocol import ErrorCode
from tidal.protocol.methods import BY_NAME, TABLE
from tidal.protocol.openrpc import ERRORS, document
from tidal.protocol.schemas import CONTEXT
from tidal.server import VERSION, Server
from tidal.server.engine.health import Booting

ROOT = Path(__file__).parent.parent
META = Path(__file__).parent / "openrpc"


def meta_validator() -> jsonschema.Draft7Validator:
    """OpenRPC 1.4's meta-schema, with the JSON Schema meta-schema it refers to, offline."""
    meta = json.loads((META / "openrpc-1.4.schema.json").read_text())
    schemas = json.loads((META / "json-schema-tools.schema.json").read_text())
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(
        "https://meta.json-schema.tools", DRAFT7.create_resource(schemas)
    )
    return jsonschema.Draft7Validator(meta, registry=registry)


def as_json(value: Any) -> Any:
    """A MessagePack value as the document's JSON Schema sees it: a bin as base64 text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


class Refused(Exception):
    def __init__(self, error: list[Any]) -> None:
        super().__init__(f"{error[0]} {error[1]}")
        self.code = error[0]


class Generated:
    """A client made from an OpenRPC document alone, over a bare socket: each call checks
    its arguments against the params' schemas, sends ``[0, msgid, name, params]``, skips
    notifications, and checks the result against the result's schema."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 doc: dict[str, Any]) -> None:  # fmt: skip
        self.reader, self.writer = reader, writer
        self.methods = {m["name"]: m for m in doc["methods"]}
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.msgid = 0
        self.called: set[str] = set()

    def check(self, name: str, args: tuple[Any, ...]) -> None:
        """Raises ``ValidationError`` (or ``TypeError``) for what the document refuses."""
        params = self.methods[name]["params"]
        least = sum(p["required"] for p in params)
        if not least <= len(args) <= len(params):
            raise TypeError(f"{name} takes {least}..{len(params)} params, got {len(args)}")
        for param, arg in zip(params, args, strict=False):
            jsonschema.Draft7Validator(param["schema"]).validate(as_json(arg))

    async def send(self, name: str, *args: Any) -> Any:
        self.msgid += 1
        self.writer.write(msgpack.packb([0, self.msgid, name, list(args)], use_bin_type=True))
        while True:
            for message in self.unpacker:
                if message[0] == 1 and message[1] == self.msgid:
                    if message[2] is not None:
                        raise Refused(message[2])
                    return message[3]
            data = await asyncio.wait_for(self.reader.read(1 << 16), 10)
            assert data, f"the server closed the connection during {name}"
            self.unpacker.feed(data)

    async def call(self, name: str, *args: Any) -> Any:
        self.check(name, args)
        result = await self.send(name, *args)
        jsonschema.Draft7Validator(self.methods[name]["result"]["schema"]).validate(as_json(result))
        self.called.add(name)
        return result


async def generated(server: Server) -> Generated:
    reader, writer = await asyncio.open_connection(*server.address)
    bare = Generated(reader, writer, {"methods": []})
    return Generated(reader, writer, await bare.send("rpc.discover"))


def test_the_document_is_valid_openrpc_and_docs_ship_it() -> None:
    doc = document(VERSION)
    errors = [
        f"{list(e.absolute_path)}: {e.message[:200]}" for e in meta_validator().iter_errors(doc)
    ]
    assert not errors, errors
    shipped = json.loads((ROOT / "docs" / "openrpc.json").read_text())
    assert shipped == doc, "docs/openrpc.json is not the table's document: run `make openrpc`"
    assert [m["name"] for m in doc["methods"]] == [m.name for m in TABLE]
    assert {e["code"] for e in doc["components"]["errors"].values()} == {int(c) for c in ErrorCode}


def test_every_example_fits_its_methods_schemas() -> None:
    doc = document(VERSION)
    examples = 0
    for method in doc["methods"]:
        for example in method.get("examples", []):
            given = [p["value"] for p in example["params"]]
            Generated(None, None, doc).check(method["name"], tuple(given))  # type: ignore[arg-type]
            jsonschema.Draft7Validator(method["result"]["schema"]).validate(
                example["result"]["value"]
            )
            examples += 1
    assert examples >= 10


@pytest.mark.both_backends
async def test_rpc_discover_serves_the_document(server: Server) -> None:
    c = await generated(server)
    served = await c.call("rpc.discover")
    assert served == document(VERSION)
    assert not list(meta_validator().iter_errors(served))


@pytest.mark.both_backends
async def test_a_client_generated_from_the_document_drives_every_method(server: Server) -> None:
    c = await generated(server)
    assert await c.call("auth", "any") is True  # no --token: any token
    assert await c.call("ping") == "pong"
    assert (await c.call("rpc.discover"))["openrpc"] == "1.4.1"
    assert await c.call("define_cohort", "de", {"country": "DE", "plan": ["pro", "team"]})
    de = {"communities": ["jazz"], "attrs": {"country": "DE", "plan": "pro"}}
    assert (await c.call("signal", 1, "song", "view", 1.0, de))["forwarded"] is True
    assert (await c.call("signal", 5, "tune", "view"))["seq"] > 0
    full = await c.call("signal_batch", [[2, "song", "view", 2.0, de], [3, "song", "like"]])
    assert [a["forwarded"] for a in full] == [True, True]
    compact = await c.call("signal_batch", [[4, "song", "view", 1, de]], {"ack": "compact"})
    assert compact["forwarded"] == b"\x01"
    assert (await c.call("status", 1))["status"] == "active"
    assert (await c.call("leave", 1, {"purge": True}))["purged"] == 1
    assert (await c.call("rejoin", 1))["status"] == "active"
    assert (await c.call("purge", 2))["purged"] == 1
    assert (await c.call("erase", 3))["erased"] == 1
    assert [line["event"] for line in await c.call("history", 1)] == ["leave", "purge", "rejoin"]
    assert (await c.call("left_users", None, 10))["users"][0][0] == 3
    assert await c.call("count_left") == len((await c.call("left_users"))["users"])
    assert (await c.call("catalog", "community"))["items"][0]["name"] == "jazz"
    assert set(await c.call("cohorts")) == {"de"}
    assert (await c.call("cohorts", {"limit": 1}))["cohorts"]["de"] == {
        "country": "DE", "plan": ["pro", "team"]
    }  # fmt: skip
    counts = await c.call("counts", "song")
    assert counts["ledger"]["view"]["count"] == 3 and counts["cohorts"]["de"]["view"]["count"] == 1
    assert (await c.call("counts", "song", {"window": "24h"}))["ledger"]["view"]["count"] == 3
    first = await c.call("top", "ledger", None, "view", {"limit": 1})
    assert first["next"] is not None  # a bin, given back as it came
    second = await c.call("top", "ledger", None, "view", {"limit": 1, "after": first["next"]})
    assert {first["entities"][0]["entity"], second["entities"][0]["entity"]} == {"song", "tune"}
    assert (await c.call("top", "community", "jazz", "view"))["entities"][0]["entity"] == "song"
    assert (await c.call("subscribe", {"from": 0}))["last_id"] >= 5
    assert await c.call("unsubscribe") is True
    assert (await c.call("group_create", "g", {"from": 0, "ack_wait": "1h"}))["cursor"] == 0
    assert (await c.call("subscribe", {"group": "g"}))["group"] == "g"

    async def out() -> int:  # the group sends with the next commit: its state says when
        for _ in range(500):
            if (pending := (await c.call("groups"))[0]["pending"]) > 0:
                return int(pending)
            await asyncio.sleep(0.01)
        raise AssertionError("the group never sent its events")

    await out()
    left = (await c.call("receipt", 1))["optouts"][0]["id"]  # user 1's leave
    assert await c.call("nack", [left], {"dead": True, "reason": "x"}) == {"nacked": 1, "dead": 1}
    assert (await c.call("dead_letters", "g"))["dead_letters"][0]["reason"] == "x"
    assert await c.call("redeliver", "g", [left]) == {"redelivered": 1}
    await out()
    assert (await c.call("ack", [left]))["acked"] == 1
    assert (await c.call("receipt", 1))["optouts"][0]["groups"]["g"]["state"] == "acknowledged"
    assert 3 in [u["user_id"] for u in (await c.call("unconfirmed"))["users"]]
    assert (await c.call("group_reset", "g"))["cursor"] >= 5
    assert await c.call("unsubscribe") is True
    assert await c.call("group_drop", "g") is True
    assert (await c.call("partition_map"))["partitions"] == 1
    assert (await c.call("stats"))["signals"] == 5
    assert (await c.call("health"))["status"] == "ok"
    assert await c.call("drop_cohort", "de") is True
    assert c.called == set(c.methods), f"not driven: {set(c.methods) - c.called}"


#: arguments the document refuses: the server refuses each too, naming the argument
REFUSED: list[tuple[str, list[Any], str]] = [
    ("signal", [-1, "e", "view"], "user_id"),
    ("signal", [1, "", "view"], "entity"),
    ("signal", [1, "e", "k" * 65], "kind"),
    ("signal", [1, "e", "view", 1e13], "weight"),
    ("signal", [1, "e", "view", 1, {"color": "red"}], "context"),
    ("signal", [1, "e", "view", 1, {"communities": ["x"] * 65}], "communities"),
    ("signal_batch", [[]], "signals"),
    ("signal_batch", [[[1, "e"]]], "signals[0]"),
    ("leave", [1, {"purge": 1}], "purge"),
    ("history", [1, 0], "limit"),
    ("left_users", [None, 10_001], "limit"),
    ("counts", ["e", {"window": "2h"}], "window"),
    ("top", ["charts", None, "view"], "layer"),
    ("top", ["ledger", None, "view", {"limit": 0}], "limit"),
    ("top", ["ledger", None, "view", {"by": "likes"}], "by"),
    ("define_cohort", ["c", "DE"], "predicate"),
    ("subscribe", [{"events": ["signal"]}], "events"),
    ("ping", [1], "ping takes 0 params"),
    ("status", [], "status takes 1 params"),
]


@pytest.mark.both_backends
@pytest.mark.parametrize(("method", "args", "named"), REFUSED)
async def test_what_the_document_refuses_the_server_refuses(
    server: Server, method: str, args: list[Any], named: str
) -> None:
    c = await generated(server)
    with pytest.raises((jsonschema.ValidationError, TypeError)):
        c.check(method, tuple(args))
    with pytest.raises(Refused) as refused:
        await c.send(method, *args)
    assert refused.value.code == ErrorCode.INVALID_PARAMS
    assert named in str(refused.value)


def test_protocol_md_names_every_method_param_and_error_of_the_table() -> None:
    """PROTOCOL.md's method reference and the table: no method, parameter or error code
    in one and not the other."""
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    headed: dict[str, set[str]] = {}
    for name, params in re.findall(r"^### `([a-z_.]+)\(([^)]*)\)`", text, re.MULTILINE):
        names = {p.strip(" []").split("=")[0] for p in re.split(r"[,\[]", params) if p.strip(" []")}
        headed.setdefault(name, set()).update(names)
    assert set(headed) == set(BY_NAME), (
        f"in PROTOCOL.md only: {set(headed) - set(BY_NAME)}; in the table only:"
        f" {set(BY_NAME) - set(headed)}"
    )
    for name, method in BY_NAME.items():
        assert headed[name] == {p.name for p in method.params}, name
    documented = {int(code) for code in re.findall(r"^\| (-?\d+) \|", text, re.MULTILINE)}
    assert documented == {int(code) for code in ERRORS}
    # the Values table's context row names each key the table's context takes (at_ns was
    # missing, though PROTOCOL.md's own example uses it), and each has a row of its own
    row = re.search(r"^\| `context` \|(.*)\|$", text, re.MULTILINE)
    assert row is not None, "PROTOCOL.md's Values table has no context row"
    for key in CONTEXT["properties"]:
        assert f"`{key}`" in row[1], f"the context row does not name {key}"
        assert re.search(rf"^\| `{key}` \|", text, re.MULTILINE), f"no Values row for {key}"


class Recorder:
    """What a connection is told, without one: the booting server's answers are sans-I/O."""

    def __init__(self) -> None:
        self.told: dict[int, tuple[str, Any]] = {}

    def reply(self, msgid: int | None, result: Any) -> None:
        assert msgid is not None
        self.told[msgid] = ("result", result)

    def reply_error(self, msgid: int | None, code: int, message: str) -> None:
        assert msgid is not None
        self.told[msgid] = ("error", code)


def test_a_loading_server_answers_what_the_table_says_it_does() -> None:
    """While the database loads (and a standby waits), the methods the table marks
    ``while_starting`` are answered, and every other is refused with error 2."""
    conn = Recorder()
    methods = [m for m in TABLE if m.name != "auth"]  # the connection's own, before any load
    for msgid, method in enumerate(methods):
        Booting().handle(conn, msgid, method.name, [])  # type: ignore[arg-type]
    answered = {methods[i].name for i, (kind, _) in conn.told.items() if kind == "result"}
    refused = {methods[i].name for i, told in conn.told.items() if told == ("error", 2)}
    assert answered == {m.name for m in methods if m.while_starting}
    assert answered | refused == {m.name for m in methods}
