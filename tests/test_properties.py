"""Property tests: the server against a plain-Python model, and fuzzing of what it reads."""

from __future__ import annotations

import asyncio
import math
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from signal import SIGKILL, SIGTERM
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tidal.client import Client, Counts, Membership
from tidal.protocol import NEED_DATA, Connection, RemoteProtocolError, error_data
from tidal.testing.postgres import Cluster

from .conftest import BACKENDS, BlockingServer, Database, ServerProcess
from .test_past import as_dict, recompute

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


@dataclass
class Row:
    seq: int
    user: int
    entity: str
    kind: str
    weight: float
    forwarded: bool
    communities: list[str]
    cohorts: list[int]  # the cohort definitions it reached
    at_ns: int = 0  # when it happened


MIN_NS, HOUR_NS, DAY_NS = 60 * 10**9, 3600 * 10**9, 86400 * 10**9
#: how long ago signals happened: none near a window's edge (1h, 24h, 7d, 30d), a minute ahead
AGES = st.sampled_from([0, 30 * MIN_NS, 3 * HOUR_NS, 2 * DAY_NS, 10 * DAY_NS,
                        40 * DAY_NS, -MIN_NS])  # fmt: skip
WINDOWS = {"1h": (MIN_NS, 60), "24h": (MIN_NS, 1440), "7d": (HOUR_NS, 168), "30d": (HOUR_NS, 720)}
HALF_LIFE_NS = 6 * HOUR_NS


def in_window(at_ns: int, window: str | None, now_ns: int) -> bool:
    """PROTOCOL.md's rule: the window's last n buckets of g, the current one included."""
    if window is None:
        return True
    g, n = WINDOWS[window]
    return at_ns // g > now_ns // g - n


class Model:
    """What tidal should answer, in a few lines of plain Python: a ledger, and aggregates
    recomputed from it as it stands."""

    def __init__(self) -> None:
        self.members: dict[int, tuple[str, int | None]] = {}
        self.cohorts: dict[str, tuple[dict[str, Any], int]] = {}  # name -> predicate, id
        self.definitions = 0
        self.rows: list[Row] = []
        self.ever: list[Row] = []  # every signal counted, withdrawn or not (rounding's scale)
        self.keys: dict[str, tuple[int, bool]] = {}  # idempotency key -> first ack
        self.next_seq = 1
        self.history: dict[int, list[tuple[str, int | None]]] = {}

    def left(self, user: int) -> bool:
        return self.members.get(user, ("active", None))[0] == "left"

    def signal(self, user: int, entity: str, kind: str, weight: float, communities: list[str],
               attrs: dict[str, Any], key: str | None, at_ns: int) -> tuple[int, bool]:  # fmt: skip
        if key is not None and key in self.keys:
            return self.keys[key]  # a retry: counted once
        forwarded = not self.left(user)
        reached = [
            cid
            for predicate, cid in self.cohorts.values()
            if forwarded
            and all(a in attrs and family(attrs[a]) in ok for a, ok in rule_of(predicate).items())
        ]
        names = list(dict.fromkeys(communities)) if forwarded else []
        row = Row(self.next_seq, user, entity, kind, weight, forwarded, names, reached, at_ns)
        self.rows.append(row)
        self.ever.append(row)
        ack = (self.next_seq, forwarded)
        self.next_seq += 1
        if key is not None:
            self.keys[key] = ack
        return ack

    def define(self, name: str, predicate: dict[str, Any]) -> None:
        old = self.cohorts.get(name)
        if old is None or rule_of(old[0]) != rule_of(predicate):
            self.definitions += 1
            self.cohorts[name] = (predicate, self.definitions)

    def purge(self, user: int) -> int:
        mine = [r for r in self.rows if r.user == user and r.forwarded]
        for row in mine:
            row.forwarded, row.communities, row.cohorts = False, [], []
        self.history.setdefault(user, []).append(("purge", len(mine)))
        return len(mine)

    def erase(self, user: int, at_ns: int) -> int:
        gone = {r.seq for r in self.rows if r.user == user}
        self.rows = [r for r in self.rows if r.seq not in gone]
        self.keys = {k: ack for k, ack in self.keys.items() if ack[0] not in gone}
        if not self.left(user):
            self.members[user] = ("left", at_ns)
        self.history.setdefault(user, []).append(("erase", len(gone)))
        return len(gone)

    def counts_of(self, entity: str, window: str | None = None, now_ns: int = 0) -> dict[str, Any]:
        """A recompute from the ledger as it stands (in a window, at ``now_ns``)."""
        tallies: dict[tuple[str, str, str], list[float]] = {}

        def bump(key: tuple[str, str, str], weight: float) -> None:
            tally = tallies.setdefault(key, [0, 0.0])
            tally[0] += 1
            tally[1] += weight

        names = {cid: name for name, (_, cid) in self.cohorts.items()}
        for row in self.rows:
            if row.entity != entity or not in_window(row.at_ns, window, now_ns):
                continue
            bump(("ledger", "", row.kind), row.weight)
            for cid in row.cohorts:
                if cid in names:
                    bump(("cohorts", names[cid], row.kind), row.weight)
            for community in row.communities:
                bump(("communities", community, row.kind), row.weight)
        out: dict[str, Any] = {"ledger": {}, "cohorts": {}, "communities": {}}
        for (layer, name, kind), (count, weight) in tallies.items():
            tally = {"count": count, "weight": weight}
            if layer == "ledger":
                out["ledger"][kind] = tally
            else:
                out[layer].setdefault(name, {})[kind] = tally
        return out

    def reached(self, row: Row, layer: str, name: str | None) -> bool:
        if layer == "ledger":
            return True
        if layer == "community":
            return name in row.communities
        cohort = self.cohorts.get(name or "")
        return cohort is not None and cohort[1] in row.cohorts

    def top_of(self, layer: str, name: str | None, kind: str, by: str, window: str | None,
               now_ns: int) -> list[tuple[str, int, float, float]]:  # fmt: skip
        """(entity, count, weight, score), highest score first, then by entity."""
        tallies: dict[str, list[float]] = {}
        for row in self.rows:
            if row.kind != kind or not self.reached(row, layer, name):
                continue
            tally = tallies.setdefault(row.entity, [0, 0.0, 0.0])
            if in_window(row.at_ns, window, now_ns):
                tally[0] += 1
                tally[1] += row.weight
            tally[2] += row.weight * 2 ** (-(now_ns - row.at_ns) / HALF_LIFE_NS)
        ranked = []
        for entity, (count, weight, decayed) in tallies.items():
            if by == "trend" or count:
                score = {"count": float(count), "weight": weight, "trend": decayed}[by]
                ranked.append((entity, int(count), weight, score))
        return sorted(ranked, key=lambda r: (-r[3], r[0].encode()))

    def rounding(self, entity: str, now_ns: int) -> float:
        """What the decayed sums of ``entity`` may be off by: every signal ever added to
        them and taken off again leaves its rounding."""
        return 1e-9 * sum(
            abs(r.weight) * 2 ** (-(now_ns - r.at_ns) / HALF_LIFE_NS)
            for r in self.ever
            if r.entity == entity
        )


def wire(counts: Counts) -> dict[str, Any]:
    def kinds(by_kind: dict[str, Any]) -> dict[str, Any]:
        return {k: {"count": t.count, "weight": t.weight} for k, t in by_kind.items()}

    return {
        "ledger": kinds(counts.ledger),
        "cohorts": {n: kinds(v) for n, v in counts.cohorts.items()},
        "communities": {n: kinds(v) for n, v in counts.communities.items()},
    }


class TidalMachine(RuleBasedStateMachine):
    """Rules are requests to a real ``tidal serve`` on a real file; SIGTERM and kill -9
    restarts are rules too. Integer weights: the sums are exact, so they compare equal."""

    #: the PostgreSQL the session started, for ``PostgresMachine`` (set by ``_cluster``)
    cluster: Cluster | None = None
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="tidal-model-")
        # checkpoint every few signals, so restarts cross checkpoints and replays
        self.db = Database(self.backend, self.database())
        self.server = ServerProcess(self.db.target, "--checkpoint-signals", "3")
        self.model = Model()
        self.client: Client | None = None

    def database(self) -> str:
        return str(Path(self.tmp.name) / "model.db")

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _start(self) -> None:
        await self.server.start()
        self.client = await self.server.connect()

    async def _stop(self, signum: int) -> None:
        assert self.client is not None
        await self.client.close()
        self.client = None
        if signum == SIGKILL:
            await self.server.kill9()
        else:
            assert await self.server.stop(signum) == 0

    @initialize()
    def boot(self) -> None:
        self.run(self._start())

    def teardown(self) -> None:
        if self.client is not None:
            self.run(self._stop(SIGKILL))
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
        key=st.none() | st.sampled_from(["k1", "k2", "k3"]),
        age=AGES,
    )
    def signal(self, user: int, entity: str, kind: str, weight: int, communities: list[str],
               attrs: dict[str, Any], key: str | None, age: int | None) -> None:  # fmt: skip
        w = float(weight)
        at = None if age is None else time.time_ns() - age
        ack = self.run(self.c.signal(user, entity, kind, w, communities=communities, attrs=attrs,
                                     key=key, at_ns=at))  # fmt: skip
        assert (ack.seq, ack.forwarded) == self.model.signal(
            user, entity, kind, w, communities, attrs, key, time.time_ns() if at is None else at
        )

    @rule(user=USERS, purge=st.booleans())
    def leave(self, user: int, purge: bool) -> None:
        got: Membership = self.run(self.c.leave(user, purge=purge))
        before = self.model.members.get(user, ("active", None))[1]
        assert got.status == "left" and got.left_at_ns is not None
        assert before is None or got.left_at_ns > before
        self.model.members[user] = ("left", got.left_at_ns)
        self.model.history.setdefault(user, []).append(("leave", None))
        if purge:
            assert got.purged == self.model.purge(user)
        else:
            assert got.purged is None

    @rule(user=USERS)
    def rejoin(self, user: int) -> None:
        got: Membership = self.run(self.c.rejoin(user))
        was_left = self.model.left(user)
        at = self.model.members.get(user, ("active", None))[1]
        assert (got.status, got.left_at_ns) == ("active", at)
        if was_left:
            self.model.members[user] = ("active", at)
            self.model.history.setdefault(user, []).append(("rejoin", None))

    @rule(user=USERS)
    def purge(self, user: int) -> None:
        assert self.run(self.c.purge(user)).signals == self.model.purge(user)

    @rule(user=USERS)
    def erase(self, user: int) -> None:
        got = self.run(self.c.erase(user))
        # the user is Left from the instant the erase is read, before it takes effect (at_ns)
        left_at = self.run(self.c.status(user)).left_at_ns
        assert left_at is not None and left_at < got.at_ns
        assert got.signals == self.model.erase(user, left_at)

    @rule(name=NAMES, predicate=PREDICATES)
    def define_cohort(self, name: str, predicate: dict[str, Any]) -> None:
        assert self.run(self.c.define_cohort(name, predicate)) is True
        self.model.define(name, predicate)

    @rule(name=NAMES)
    def drop_cohort(self, name: str) -> None:
        existed = name in self.model.cohorts
        assert self.run(self.c.drop_cohort(name)) is existed
        self.model.cohorts.pop(name, None)

    @rule(signum=st.sampled_from([SIGTERM, SIGKILL]))
    def restart(self, signum: int) -> None:
        self.run(self._stop(signum))
        self.run(self._start())

    @invariant()
    def answers_match_the_model(self) -> None:
        if self.client is None:
            return
        for user in (0, 1, 2, 3, 2**63, 2**64 - 1):
            status, at = self.model.members.get(user, ("active", None))
            assert self.run(self.c.status(user)) == Membership(user, status, at)  # type: ignore[arg-type]
            history = self.run(self.c.history(user))
            assert [(e.event, e.signals) for e in history] == self.model.history.get(user, [])
        assert self.run(self.c.cohorts()) == {n: p for n, (p, _) in self.model.cohorts.items()}
        for entity in ("a", "b"):
            counts = self.run(self.c.counts(entity))
            assert wire(counts) == self.model.counts_of(entity)
            assert as_dict(counts) == self.run(recompute(self.db, entity))  # the database agrees
        assert self.run(self.c.stats())["ledger_rows"] == len(self.model.rows)
        self.rankings_match_the_model()
        left = self.run(self.c.left_users())
        assert left.users == sorted(
            (u, at) for u, (s, at) in self.model.members.items() if s == "left" and at
        )
        assert self.run(self.c.count_left()) == sum(
            s == "left" for s, _ in self.model.members.values()
        )

    def rankings_match_the_model(self) -> None:
        """Windowed counts, and top by count, weight and trend, equal a recompute."""
        for entity in ("a", "b"):
            for span in ("1h", "30d"):
                now = time.time_ns()
                counted = wire(self.run(self.c.counts(entity, window=span)))
                assert counted == self.model.counts_of(entity, span, now), (entity, span)
        scopes = [
            ("ledger", None),
            ("community", "x"),
            *(("cohort", n) for n in self.model.cohorts),
        ]
        for layer, name in scopes:
            for by, window in (("count", None), ("count", "24h"), ("weight", "7d")):
                top = self.run(self.c.top(layer, name, "view", by=by, window=window))
                want = self.model.top_of(layer, name, "view", by, window, top.as_of_ns)
                got = [(r.entity, r.count, r.weight, r.score) for r in top.entities]
                assert got == want, (layer, name, by, window)
            top = self.run(self.c.top(layer, name, "view", by="trend"))
            want = self.model.top_of(layer, name, "view", "trend", None, top.as_of_ns)
            assert sorted(r.entity for r in top.entities) == sorted(w[0] for w in want)
            wanted = {entity: (count, weight, score) for entity, count, weight, score in want}
            scores = [r.score for r in top.entities]
            assert scores == sorted(scores, reverse=True), (layer, name)
            for r in top.entities:
                count, weight, score = wanted[r.entity]
                assert (r.count, r.weight) == (count, weight)
                slack = self.model.rounding(r.entity, top.as_of_ns)
                assert math.isclose(r.score, score, rel_tol=1e-9, abs_tol=slack), (r, score)


class PostgresMachine(TidalMachine):
    """The same rules, on a PostgreSQL database of its own."""

    backend = "postgresql"

    def database(self) -> str:
        assert self.cluster is not None
        self.name = self.run(self.cluster.create())
        return self.cluster.url(self.name)

    def teardown(self) -> None:
        super().teardown()
        assert self.cluster is not None
        asyncio.run(self.cluster.drop(self.name))


@pytest.fixture(autouse=True, scope="module")
def _cluster(pg_cluster: Cluster) -> None:
    TidalMachine.cluster = pg_cluster


for machine in (TidalMachine, PostgresMachine):
    machine.TestCase.settings = settings(
        max_examples=25,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
# 25 examples of 30 steps, with restarts: about 65 s on SQLite and 85 s on PostgreSQL here,
# too near the suite's 120 s per test for a loaded machine
test_server_matches_the_model = pytest.mark.timeout(600)(TidalMachine.TestCase)
test_server_on_postgresql_matches_the_model = pytest.mark.timeout(600)(PostgresMachine.TestCase)


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
     "drop_cohort", "cohorts", "counts", "stats", "auth", "purge", "erase", "history",
     "left_users", "nope"]
)  # fmt: skip


@pytest.fixture(scope="module", params=BACKENDS)
def live_server(request: pytest.FixtureRequest, pg_cluster: Cluster) -> Iterator[int]:
    """One server process for every fuzzed request, on each backend."""
    with tempfile.TemporaryDirectory(prefix="tidal-fuzz-") as tmp:
        if request.param == "sqlite":
            target = str(Path(tmp) / "f.db")
        else:
            target = pg_cluster.url(asyncio.run(pg_cluster.create()))
        server = BlockingServer(target).start()
        yield server.port
        assert server.stop() == 0


@given(method=METHODS, params=st.lists(MSGPACK_VALUES, max_size=6))
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
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
        assert type(error) is list and len(error) == 3
        assert type(error[0]) is int and type(error[1]) is str and error[1]
        assert error[2] == error_data(error[0], error[1])
        assert result is None
    assert by_id[78][3] == "pong"
