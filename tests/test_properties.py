"""Property tests: the server against a plain-Python model, and fuzzing of what it reads."""

from __future__ import annotations

import asyncio
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tidal.client import Client, Counts, Membership
from tidal.protocol import NEED_DATA, Connection, RemoteProtocolError
from tidal.server import Config, Server

from .conftest import BlockingServer

USERS = st.sampled_from([0, 1, 2, 3, 2**63, 2**64 - 1])
ENTITIES = st.sampled_from(["a", "b"])
KINDS = st.sampled_from(["view", "like"])
SCALARS = st.sampled_from([0, 1, 1.0, True, False, "x", "1"])
ATTRS = st.dictionaries(st.sampled_from(["tier", "vip"]), SCALARS, max_size=2)
PREDICATES = st.dictionaries(
    st.sampled_from(["tier", "vip"]),
    SCALARS | st.lists(SCALARS, min_size=1, max_size=3),
    max_size=2,
)
NAMES = st.sampled_from(["k1", "k2"])


def family(value: Any) -> tuple[bool, Any]:
    return (type(value) is bool, value)


def rule_of(predicate: dict[str, Any]) -> dict[str, frozenset[tuple[bool, Any]]]:
    return {
        attr: frozenset(family(v) for v in (values if isinstance(values, list) else [values]))
        for attr, values in predicate.items()
    }


class Model:
    """What tidal should answer, in a few lines of plain Python."""

    def __init__(self) -> None:
        self.members: dict[int, tuple[str, int | None]] = {}
        self.cohorts: dict[str, dict[str, Any]] = {}  # name -> predicate
        self.counts: dict[
            tuple[str, str, str, str], list[float]
        ] = {}  # (entity, layer, name, kind)

    def bump(self, key: tuple[str, str, str, str], weight: float) -> None:
        tally = self.counts.setdefault(key, [0, 0.0])
        tally[0] += 1
        tally[1] += weight

    def signal(self, user: int, entity: str, kind: str, weight: float, communities: list[str],
               attrs: dict[str, Any]) -> bool:  # fmt: skip
        self.bump((entity, "ledger", "", kind), weight)
        if self.members.get(user, ("active", None))[0] == "left":
            return False
        for name, predicate in self.cohorts.items():
            if all(a in attrs and family(attrs[a]) in ok for a, ok in rule_of(predicate).items()):
                self.bump((entity, "cohorts", name, kind), weight)
        for community in dict.fromkeys(communities):
            self.bump((entity, "communities", community, kind), weight)
        return True

    def define(self, name: str, predicate: dict[str, Any]) -> None:
        old = self.cohorts.get(name)
        if old is None or rule_of(old) != rule_of(predicate):
            self.drop_counts(name)
            self.cohorts[name] = predicate

    def drop_counts(self, name: str) -> None:
        for key in [k for k in self.counts if k[1] == "cohorts" and k[2] == name]:
            del self.counts[key]

    def counts_of(self, entity: str) -> dict[str, Any]:
        out: dict[str, Any] = {"ledger": {}, "cohorts": {}, "communities": {}}
        for (e, layer, name, kind), (count, weight) in self.counts.items():
            if e != entity:
                continue
            tally = {"count": count, "weight": weight}
            if layer == "ledger":
                out["ledger"][kind] = tally
            else:
                out[layer].setdefault(name, {})[kind] = tally
        return out


def wire(counts: Counts) -> dict[str, Any]:
    def kinds(by_kind: dict[str, Any]) -> dict[str, Any]:
        return {k: {"count": t.count, "weight": t.weight} for k, t in by_kind.items()}

    return {
        "ledger": kinds(counts.ledger),
        "cohorts": {n: kinds(v) for n, v in counts.cohorts.items()},
        "communities": {n: kinds(v) for n, v in counts.communities.items()},
    }


class TidalMachine(RuleBasedStateMachine):
    """Rules are requests to a real server on a real file; restart is one of them."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="tidal-model-")
        self.db = str(Path(self.tmp.name) / "model.db")
        self.model = Model()
        self.server: Server | None = None
        self.client: Client | None = None

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _start(self) -> None:
        # checkpoint every few signals, so restarts cross checkpoints and replays
        self.server = Server(Config(port=0, db=self.db, checkpoint_signals=3))
        await self.server.start()
        self.client = await Client.connect(*self.server.address)

    async def _stop(self) -> None:
        assert self.client is not None and self.server is not None
        await self.client.close()
        await self.server.shutdown()

    @initialize()
    def boot(self) -> None:
        self.run(self._start())

    def teardown(self) -> None:
        if self.server is not None:
            self.run(self._stop())
        self.loop.close()
        self.tmp.cleanup()

    @property
    def c(self) -> Client:
        assert self.client is not None
        return self.client

    @rule(
        user=USERS,
        entity=ENTITIES,
        kind=KINDS,
        weight=st.integers(0, 5),
        communities=st.lists(st.sampled_from(["x", "y"]), max_size=3),
        attrs=ATTRS,
    )
    def signal(self, user: int, entity: str, kind: str, weight: int, communities: list[str],
               attrs: dict[str, Any]) -> None:  # fmt: skip
        ack = self.run(
            self.c.signal(user, entity, kind, float(weight), communities=communities, attrs=attrs)
        )
        assert ack.forwarded == self.model.signal(
            user, entity, kind, float(weight), communities, attrs
        )

    @rule(user=USERS)
    def leave(self, user: int) -> None:
        got: Membership = self.run(self.c.leave(user))
        before = self.model.members.get(user, ("active", None))[1]
        assert got.status == "left" and got.left_at_ns is not None
        assert before is None or got.left_at_ns > before
        self.model.members[user] = ("left", got.left_at_ns)

    @rule(user=USERS)
    def rejoin(self, user: int) -> None:
        got: Membership = self.run(self.c.rejoin(user))
        at = self.model.members.get(user, ("active", None))[1]
        assert (got.status, got.left_at_ns) == ("active", at)
        if at is not None:
            self.model.members[user] = ("active", at)

    @rule(name=NAMES, predicate=PREDICATES)
    def define_cohort(self, name: str, predicate: dict[str, Any]) -> None:
        assert self.run(self.c.define_cohort(name, predicate)) is True
        self.model.define(name, predicate)

    @rule(name=NAMES)
    def drop_cohort(self, name: str) -> None:
        existed = name in self.model.cohorts
        assert self.run(self.c.drop_cohort(name)) is existed
        self.model.cohorts.pop(name, None)
        self.model.drop_counts(name)

    @rule()
    def restart(self) -> None:
        self.run(self._stop())
        self.run(self._start())

    @invariant()
    def answers_match_the_model(self) -> None:
        if self.client is None:
            return
        for user in (0, 1, 2, 3, 2**63, 2**64 - 1):
            status, at = self.model.members.get(user, ("active", None))
            assert self.run(self.c.status(user)) == Membership(user, status, at)  # type: ignore[arg-type]
        assert self.run(self.c.cohorts()) == self.model.cohorts
        for entity in ("a", "b"):
            assert wire(self.run(self.c.counts(entity))) == self.model.counts_of(entity)


TidalMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_server_matches_the_model = TidalMachine.TestCase


# -- fuzzing what the server reads -------------------------------------------------------


@given(st.binary(max_size=512))
@settings(max_examples=500, deadline=None)
def test_the_decoder_raises_only_protocol_errors(data: bytes) -> None:
    conn = Connection(max_message_size=256)
    for cut in (len(data) // 3, len(data)):
        try:
            conn.receive_data(data[:cut] if cut < len(data) else data[len(data) // 3 :])
            while conn.next_event() is not NEED_DATA:
                pass
        except RemoteProtocolError:
            return


MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
METHODS = st.sampled_from(
    ["ping", "signal", "signal_batch", "leave", "rejoin", "status", "define_cohort",
     "drop_cohort", "cohorts", "counts", "stats", "auth", "nope"]
)  # fmt: skip


@pytest.fixture(scope="module")
def live_server() -> Iterator[int]:
    """One server process for every fuzzed request."""
    with tempfile.TemporaryDirectory(prefix="tidal-fuzz-") as tmp:
        server = BlockingServer(Path(tmp) / "f.db").start()
        yield server.port
        assert server.stop() == 0


@given(method=METHODS, params=st.lists(MSGPACK_VALUES, max_size=6))
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_request_gets_exactly_one_well_formed_reply(
    live_server: int, method: str, params: list[Any]
) -> None:
    with socket.create_connection(("127.0.0.1", live_server), timeout=10) as sock:
        sock.sendall(msgpack.packb([0, 77, method, params]) + msgpack.packb([0, 78, "ping", []]))
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        replies: list[Any] = []
        while len(replies) < 2:
            data = sock.recv(65536)
            assert data, "the server closed the connection"
            unpacker.feed(data)
            replies.extend(unpacker)
    by_id = {r[1]: r for r in replies}
    assert sorted(by_id) == [77, 78] and len(replies) == 2
    kind, _, error, result = by_id[77]
    assert kind == 1
    if error is not None:
        assert type(error) is list and len(error) == 2
        assert type(error[0]) is int and type(error[1]) is str and error[1]
        assert result is None
    assert by_id[78][3] == "pong"
