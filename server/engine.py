"""The engine: requests change memory in the order they are read; replies wait for the disk.

Two promises meet here. *Zero window*: a request is applied the moment it is
read, so a signal read after a leave is gated even before the leave's reply is
sent. *Acknowledged means durable*: every reply that reveals a write, whether
the write's own acknowledgement or a later read that sees it, waits until the
batch holding that write has committed. Writes from all connections share a
batch; while one batch commits, the next one fills (group commit).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

import msgpack

from tidal.protocol import DEFAULT_MAX_MESSAGE_SIZE, ErrorCode
from tidal.protocol.limits import (
    ENTITY_MAX_BYTES,
    MAX_COHORTS,
    MAX_FANOUT,
    NAME_MAX_BYTES,
    SLOT_REPLY_BYTES,
)

from . import params
from .aggregates import (
    CHECKPOINT_SECONDS,
    CHECKPOINT_SIGNALS,
    COHORT,
    COMMUNITY,
    LEDGER,
    Aggregates,
    CountsRead,
    bump,
)
from .batch import Batch, Replier
from .cohorts import Cohort, index
from .health import report
from .members import Members
from .metrics import Metrics
from .params import InvalidParams, SignalArgs
from .storage import Snapshot, Storage, StorageFailure, to_db
from .version import VERSION

log = logging.getLogger("tidal.engine")

Handler = Callable[[Replier, int | None, list[Any]], None]


#: An open batch this large stops every connection until the writer takes it: what waits
#: for a commit (rows, tallies, replies) stays bounded, and so does the commit's length.
OPEN_SIGNALS: Final = 50_000
OPEN_FANOUT: Final = 500_000  # aggregates added to (each signal: its communities and cohorts)


class Unavailable(Exception):
    """Answered as error 2: storage has failed and writes are refused rather than diverge."""


class Engine:
    def __init__(
        self,
        storage: Storage,
        snapshot: Snapshot,
        *,
        clock: Callable[[], int] = time.time_ns,
        connections: Callable[[], int] = lambda: 0,
        checkpoint_signals: int = CHECKPOINT_SIGNALS,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        key_window_ns: int = 24 * 3600 * 10**9,
        max_keys: int = 1_000_000,
        metrics: Metrics | None = None,
        hold: Callable[[bool], None] = lambda on: None,
        open_signals: int = OPEN_SIGNALS,
        open_fanout: int = OPEN_FANOUT,
        max_reply: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        self._storage = storage
        self._clock = clock
        #: back-pressure: stops (True) or lets go on (False) every connection
        self._hold = hold
        self._open_signals = open_signals
        self._open_fanout = open_fanout
        self._reply_budget = max_reply - 1024  # the envelope, and a margin
        self.metrics = metrics
        self._connections = connections
        self.members = Members.adopt(snapshot.left, snapshot.rejoined)
        self._cohorts: dict[str, Cohort] = {
            name: Cohort.build(cid, name, predicate) for cid, name, predicate in snapshot.cohorts
        }
        self._cohort_names: dict[int, str] | None = None
        self._index = index(self._cohorts.values())
        self._next_seq = snapshot.next_seq
        self._next_cohort_id = snapshot.next_cohort_id
        self.aggregates = Aggregates(
            snapshot.watermark, every_signals=checkpoint_signals, every_seconds=checkpoint_seconds
        )
        self.aggregates.replay(snapshot.ledger_tail)
        #: idempotency key -> (seq, forwarded, ts_ns) of the signal that first used it,
        #: oldest first; bounded by the window and by ``max_keys``
        self._keys = snapshot.keys
        self._key_window_ns = key_window_ns
        self._max_keys = max_keys
        self._open = Batch(self._next_seq)
        self._inflight: Batch | None = None
        self._idle: asyncio.Future[None] | None = None  # set while the writer waits for work
        self._closing = False
        self._last_checkpoint_tried = False
        self._failed: str | None = None  # a commit failed for good: writes refused
        self._full: str | None = None  # the last commit found the disk full
        self._task: asyncio.Task[None] | None = None
        self._started = time.monotonic()
        self.signals = self.forwarded = 0
        self._methods: dict[str, Handler] = {
            "ping": self._ping,
            "signal": self._signal,
            "signal_batch": self._signal_batch,
            "leave": self._leave,
            "rejoin": self._rejoin,
            "status": self._status,
            "define_cohort": self._define_cohort,
            "drop_cohort": self._drop_cohort,
            "cohorts": self._list_cohorts,
            "counts": self._counts,
            "stats": self._stats,
            "health": self._health,
        }

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tidal-writer")

    async def close(self) -> None:
        """Commit and answer everything already read, then stop the writer."""
        self._closing = True
        self._wake()
        if self._task is not None:
            await self._task

    # -- requests --------------------------------------------------------

    def handle(self, conn: Replier, msgid: int | None, method: str, args: list[Any]) -> None:
        """Apply one request now; its reply goes out now or when its batch is durable.

        ``msgid`` is None for a notification: it is applied, never answered.
        """
        handler = self._methods.get(method)
        try:
            if handler is None:
                raise _NotFound(f"method not found: {method!r}")
            handler(conn, msgid, args)
        except InvalidParams as exc:
            self._refuse(conn, msgid, ErrorCode.INVALID_PARAMS, str(exc))
        except Unavailable as exc:
            self._refuse(conn, msgid, ErrorCode.UNAVAILABLE, str(exc))
        except _NotFound as exc:
            self._refuse(conn, msgid, ErrorCode.METHOD_NOT_FOUND, str(exc))
        except Exception:
            log.exception("internal error in %s", method)
            self._refuse(conn, msgid, ErrorCode.INTERNAL_ERROR, f"internal error in {method}")

    @staticmethod
    def _refuse(conn: Replier, msgid: int | None, code: int, message: str) -> None:
        conn.reply_error(msgid, code, message)

    def _ack(self, conn: Replier, msgid: int | None, result: Any) -> None:
        """A write's reply: sent once the batch it joined has committed. A notification's
        write stays in flight until then too, so that notifications feel back-pressure."""
        batch = self._open
        batch.replies.append((conn, msgid, result))
        if self._idle is not None:
            self._wake()
        if batch.signals >= self._open_signals or batch.fanout >= self._open_fanout:
            self._hold(True)  # let go of when the writer takes this batch

    def _answer(self, conn: Replier, msgid: int | None, result: Any) -> None:
        """A read's reply: now, unless it could show a write that is not yet on disk."""
        if msgid is None:
            conn.reply(None, None)
            return
        inflight = self._inflight
        if self._open.writes or (inflight is not None and inflight.writes):
            self._open.replies.append((conn, msgid, result))
            self._wake()
        else:
            conn.reply(msgid, result)

    def _writable(self) -> Batch:
        if self._failed is not None:
            raise Unavailable(
                f"storage failed ({self._failed}); writes are refused until the server"
                " is restarted on a healthy disk"
            )
        return self._open

    # -- methods ---------------------------------------------------------

    def _ping(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        params.arity(args, "ping", "none", 0, 0)
        conn.reply(msgid, "pong")

    def _signal(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        signal = params.signal(args)
        batch = self._writable()
        self._ack(conn, msgid, self._record(batch, signal, self._clock()))

    def _signal_batch(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        signals = params.signal_batch(args)  # all valid, or none applied
        batch = self._writable()
        now = self._clock()
        record = self._record
        if not self._cohorts:  # fan-out is the communities named, bounded by params
            self._ack(conn, msgid, [record(batch, s, now) for s in signals])
            return
        # matched first, to bound the request's fan-out before any of it is applied
        is_left = self.members.is_left
        match = self._index.match
        matched = [() if is_left(s.user_id) else match(s.attrs) for s in signals]
        self._fanout([len(s.communities) + len(m) for s, m in zip(signals, matched, strict=True)])
        self._ack(
            conn,
            msgid,
            [record(batch, s, now, m) for s, m in zip(signals, matched, strict=True)],
        )

    @staticmethod
    def _fanout(each: list[int]) -> None:
        """Refuse a batch that would add to more aggregates than one request may: the
        loop time and memory a request costs follow its fan-out, not its bytes."""
        total = sum(each)
        if total > MAX_FANOUT:
            raise InvalidParams(
                f"signals: this batch adds to {total} aggregates (communities named and"
                f" cohorts matched, per signal); at most {MAX_FANOUT} per request: send"
                " fewer signals per batch"
            )

    def _record(
        self, batch: Batch, s: SignalArgs, now_ns: int, matched: tuple[int, ...] | None = None
    ) -> dict[str, Any]:
        """The signal path: a dict lookup for the gate, then memory only; the batch does the I/O.

        The ledger row's context is ``[communities, attrs, cohort ids]``: what the
        signal named and what it was forwarded to, so the ledger alone rebuilds
        the aggregates.
        """
        user_id, entity, kind, weight, communities, attrs, key = s
        if key is not None:
            seen = self._keys.get(key)
            if seen is not None and seen[2] >= now_ns - self._key_window_ns:
                return {"seq": seen[0], "forwarded": seen[1]}  # a retry: counted once
        seq = self._next_seq
        self._next_seq = seq + 1
        mine = batch.deltas.get(entity)
        if mine is None:
            mine = batch.deltas[entity] = {}
        bump(mine, (LEDGER, "", kind), weight)
        if self.members.is_left(user_id):
            forwarded = False
            context = _pack((communities, attrs, ())) if communities or attrs else None
        else:
            forwarded = True
            if matched is not None:
                cohorts = matched
            else:
                cohorts = self._index.match(attrs) if self._cohorts else ()
            for cid in cohorts:
                bump(mine, (COHORT, cid, kind), weight)
            for name in communities:
                bump(mine, (COMMUNITY, name, kind), weight)
            context = _pack((communities, attrs, cohorts)) if communities or attrs else None
            batch.forwarded += 1
            batch.fanout += len(cohorts) + len(communities)
        batch.ledger.append((seq, to_db(user_id), entity, kind, weight, now_ns, forwarded, context))
        if key is not None:
            self._remember_key(batch, key, (seq, forwarded, now_ns))
        batch.signals += 1
        batch.writes += 1
        return {"seq": seq, "forwarded": forwarded}

    def _remember_key(self, batch: Batch, key: str, ack: tuple[int, bool, int]) -> None:
        keys = self._keys
        batch.undo.append(("key", key, keys.pop(key, None)))
        keys[key] = ack  # at the end: the dict stays oldest first
        batch.keys.append((key, *ack))
        if len(keys) > self._max_keys:
            # O(1) in an OrderedDict; a dict's first key is found past every slot
            # deleted before it, so evicting that way slows with every eviction
            keys.popitem(last=False)

    def _forget_old_keys(self, batch: Batch) -> None:
        """Drop keys past the window, from memory now and from the table with ``batch``."""
        cutoff = self._clock() - self._key_window_ns
        keys = self._keys
        while keys:
            oldest = next(iter(keys))
            if keys[oldest][2] >= cutoff:
                break
            keys.popitem(last=False)
        batch.forget_keys_before = cutoff

    def _leave(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        params.arity(args, "leave", "user_id", 1, 1)
        user_id = params.user_id(args[0])
        batch = self._writable()
        prior = self.members.prior(user_id)
        membership = self.members.leave(user_id, self._clock())
        assert membership.left_at_ns is not None
        batch.member(user_id, prior, True, membership.left_at_ns)
        batch.leaves += 1
        self._ack(conn, msgid, membership.wire())

    def _rejoin(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        params.arity(args, "rejoin", "user_id", 1, 1)
        user_id = params.user_id(args[0])
        batch = self._writable()
        prior = self.members.prior(user_id)
        membership = self.members.rejoin(user_id)
        if prior is not None and prior[0]:
            assert membership.left_at_ns is not None
            batch.member(user_id, prior, False, membership.left_at_ns)
            batch.rejoins += 1
            self._ack(conn, msgid, membership.wire())
        else:  # already active: nothing to write
            self._answer(conn, msgid, membership.wire())

    def _status(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        params.arity(args, "status", "user_id", 1, 1)
        self._answer(conn, msgid, self.members.status(params.user_id(args[0])).wire())

    def _define_cohort(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        params.arity(args, "define_cohort", "name, predicate", 2, 2)
        name = params.cohort_name(args[0])
        predicate = params.predicate(args[1])
        batch = self._writable()
        old = self._cohorts.get(name)
        cohort = Cohort.build(self._next_cohort_id, name, predicate)
        if old is not None and old.same_rule(cohort):
            self._answer(conn, msgid, True)  # the same cohort again: its counts go on
            return
        if old is None and len(self._cohorts) >= MAX_COHORTS:
            raise InvalidParams(f"name: at most {MAX_COHORTS} cohorts may be defined; drop one")
        self._next_cohort_id += 1
        self._set_cohort(batch, name, old, cohort)
        batch.next_cohort_id = self._next_cohort_id
        self._ack(conn, msgid, True)

    def _drop_cohort(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        params.arity(args, "drop_cohort", "name", 1, 1)
        name = params.cohort_name(args[0])
        batch = self._writable()
        old = self._cohorts.get(name)
        if old is None:
            self._answer(conn, msgid, False)
            return
        self._set_cohort(batch, name, old, None)
        self._ack(conn, msgid, True)

    def _set_cohort(self, batch: Batch, name: str, old: Cohort | None, new: Cohort | None) -> None:
        batch.undo.append(("cohort", name, old))
        batch.cohorts[name] = new
        batch.writes += 1
        self._put_cohort(name, new)

    def _put_cohort(self, name: str, cohort: Cohort | None) -> None:
        old = self._cohorts.pop(name, None)
        if old is not None:
            self._index.remove(old)
        if cohort is not None:
            self._cohorts[name] = cohort
            self._index.add(cohort)
        if self._index.wasted > max(len(self._cohorts), 64):
            self._index = index(self._cohorts.values())
        self._cohort_names = None

    def _list_cohorts(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """Every cohort, or, given a page, those named after ``after`` in byte order that
        fit one reply. Without a page, a list over the message limit is refused, not cut:
        its shape has no room to say so."""
        params.arity(args, "cohorts", "page={}", 0, 1)
        budget = self._reply_budget
        if not args:
            total = sum(c.size for c in self._cohorts.values())
            if total > budget:
                raise InvalidParams(
                    f"page: the {len(self._cohorts)} cohorts take {total} bytes, over the"
                    f" {budget} a reply may; read them in pages: cohorts({{'limit': n}})"
                )
            self._answer(conn, msgid, {name: c.predicate for name, c in self._cohorts.items()})
        else:
            page = params.page(args[0], "cohorts", ("after", "limit"), MAX_COHORTS)
            after = page.get("after")
            if after is not None:
                after = params.text(after, "page.after", NAME_MAX_BYTES)
            names = sorted(
                (n for n in self._cohorts if after is None or _utf8(n) > _utf8(after)), key=_utf8
            )
            listed: dict[str, Any] = {}
            for name in names[: page.get("limit", MAX_COHORTS)]:
                budget -= self._cohorts[name].size
                if budget < 0 and listed:
                    break
                listed[name] = self._cohorts[name].predicate
            more = names[len(listed) - 1] if len(listed) < len(names) else None
            self._answer(conn, msgid, {"cohorts": listed, "more": more})
        conn.flush()  # a large reply made now must meet the peer's flow control at once

    def _counts(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        params.arity(args, "counts", "entity, page={}", 1, 2)
        entity = params.text(args[0], "entity", ENTITY_MAX_BYTES)
        most = self._reply_budget // SLOT_REPLY_BYTES
        page = params.page(args[1] if len(args) > 1 else None, "counts", ("after", "limit"), most)
        after = params.cursor(page["after"]) if page.get("after") is not None else None
        limit = page.get("limit", most)
        if msgid is None:
            conn.reply(None, None)
            return
        if self._cohort_names is None:
            self._cohort_names = {c.id: name for name, c in self._cohorts.items()}
        uncommitted = [self._open.deltas]
        if self._inflight is not None:
            uncommitted.append(self._inflight.deltas)
        read = self.aggregates.capture(entity, self._cohort_names, uncommitted, after, limit)
        self._open.reads.append(read)
        self._open.replies.append((conn, msgid, read))
        conn.reading(True)
        self._wake()

    def _stats(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        params.arity(args, "stats", "none", 0, 0)
        signals = self.signals
        self._answer(
            conn,
            msgid,
            {
                "version": VERSION,
                "uptime_s": round(time.monotonic() - self._started, 3),
                "connections": self._connections(),
                "signals": signals,
                "forwarded": self.forwarded,
                "gated": signals - self.forwarded,
                "users_left": len(self.members),
                "commits": self._storage.commits,
                "storage": self.health()["storage"],
            },
        )

    def _health(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """Answered after a round trip through the writer: a stuck disk times it out.
        After a full disk, the round trip carries a small write, to see if space is back."""
        params.arity(args, "health", "none", 0, 0)
        if msgid is None:
            conn.reply(None, None)
            return
        batch = self._open
        if self._full is not None and self._failed is None and not batch.probe:
            batch.probe = True
            batch.writes += 1
        batch.replies.append((conn, msgid, HealthCheck(self)))
        self._wake()

    def health(self) -> dict[str, Any]:
        if self._failed is not None:
            return report("failed", f"storage failed ({self._failed}); restart on a healthy disk")
        if self._full is not None:
            return report("full", f"the last commit failed ({self._full}); writes are refused")
        return report("ok")

    # -- the writer ------------------------------------------------------

    async def _run(self) -> None:
        while True:
            batch = self._open
            if not batch.pending():
                if self._closing:
                    if self._last_checkpoint_tried or self._failed or not self.aggregates.live:
                        return
                    # one last checkpoint, so that the next boot replays nothing
                    self._last_checkpoint_tried = True
                    batch.checkpoint_seq = self._next_seq - 1
                    batch.checkpoint = self.aggregates.begin_checkpoint(batch.checkpoint_seq)
                else:
                    self._idle = asyncio.get_running_loop().create_future()
                    await self._idle
                    continue
            elif self.aggregates.due() and self._failed is None:
                # everything before this batch has committed: the live deltas run to here
                batch.checkpoint_seq = batch.first_seq - 1
                batch.checkpoint = self.aggregates.begin_checkpoint(batch.checkpoint_seq)
                self._forget_old_keys(batch)
            self._open = Batch(self._next_seq)
            self._inflight = batch
            self._hold(False)
            began = time.perf_counter()
            try:
                await self._storage.commit(batch)
            except StorageFailure as exc:
                self._fail(batch, exc)
            except Exception as exc:  # a bug must not pass for a commit
                log.exception("writer failed")
                self._fail(batch, StorageFailure(f"writer failed: {exc!r}", transient=False))
            else:
                if self.metrics is not None and batch.writes:
                    self.metrics.commit_seconds.observe(time.perf_counter() - began)
                    self.metrics.batch_size.observe(batch.writes)
                self._deliver(batch)
            finally:
                self._inflight = None

    def _wake(self) -> None:
        """Start the writer if it waits for work (it re-checks the open batch after each commit)."""
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    def _deliver(self, batch: Batch) -> None:
        if batch.checkpoint is not None:
            self.aggregates.end_checkpoint(committed=True)
        if batch.writes:
            self._full = None
        self.aggregates.absorb(batch.deltas, batch.signals)
        self.signals += batch.signals
        self.forwarded += batch.forwarded
        if self.metrics is not None:
            self.metrics.leaves += batch.leaves
            self.metrics.rejoins += batch.rejoins
        touched: dict[Replier, None] = {}
        for conn, msgid, result in batch.replies:
            if type(result) in _LATER:
                if type(result) is CountsRead:
                    conn.reading(False)
                result = result.answer()
            conn.reply(msgid, result)
            touched[conn] = None
        for conn in touched:
            conn.flush()

    def _fail(self, batch: Batch, exc: StorageFailure) -> None:
        """Undo in memory what the disk refused, and refuse every reply that depended on it.

        The open batch was built on top of the failed one (its signals were gated
        by its leaves), so it fails with it.
        """
        if batch.checkpoint is not None:
            self.aggregates.end_checkpoint(committed=False)
        later = self._open  # its deltas, like the failed batch's, are simply dropped
        for failed in (later, batch):
            for what, key, prior in reversed(failed.undo):
                if what == "member":
                    self.members.restore(key, prior)
                elif what == "key":
                    self._keys.pop(key, None)
                    if prior is not None:
                        self._keys[key] = prior
                else:
                    self._put_cohort(key, prior)
        self._next_seq = batch.first_seq
        self._open = Batch(self._next_seq)
        if exc.transient:
            self._full = str(exc)
            log.error("%s; the writes in it were refused, later writes will be tried", exc)
        else:
            self._failed = str(exc)
            log.critical("%s; refusing all writes until restarted", exc)
        message = f"storage unavailable: {exc}; nothing of this request was saved"
        touched: dict[Replier, None] = {}
        for failed in (batch, later):
            for conn, msgid, result in failed.replies:
                if type(result) is CountsRead:
                    conn.reading(False)
                if type(result) is HealthCheck:
                    conn.reply(msgid, result.answer())
                else:
                    conn.reply_error(msgid, ErrorCode.UNAVAILABLE, message)
                touched[conn] = None
        for conn in touched:
            conn.flush()


class _NotFound(Exception):
    pass


def _utf8(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


class HealthCheck:
    """A ``health`` request waiting for its writer round trip; answered as things are then."""

    __slots__ = ("engine",)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def answer(self) -> dict[str, Any]:
        return self.engine.health()


_LATER: Final = (CountsRead, HealthCheck)  # replies worked out when their batch is done


_pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
