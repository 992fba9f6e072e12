"""The blocking client, against a real server process."""

from __future__ import annotations

import signal
import socket
import sqlite3
import threading
from pathlib import Path

import pytest

from tidal.client import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    InvalidArgument,
    InvalidParams,
    Membership,
    RequestTooLarge,
    Signal,
    SyncClient,
    Tally,
    TidalError,
)

from .conftest import BlockingServer


def test_the_same_methods_and_errors_as_the_async_client(blocking_server: BlockingServer) -> None:
    with SyncClient("127.0.0.1", blocking_server.port, timeout=10) as tidal:
        assert tidal.ping() == "pong"
        assert tidal.define_cohort("de", {"country": "DE"})
        assert tidal.signal(
            1, "song", "view", communities=["jazz"], attrs={"country": "DE"}
        ).forwarded
        left = tidal.leave(1)
        assert tidal.status(1) == left and left.status == "left"
        acks = tidal.signal_batch([Signal(1, "song", "view"), Signal(2, "song", "like")])
        assert [a.forwarded for a in acks] == [False, True]
        counts = tidal.counts("song")
        assert counts.ledger == {"view": Tally(2, 2.0), "like": Tally(1, 1.0)}
        assert counts.cohorts == {"de": {"view": Tally(1, 1.0)}}
        assert tidal.rejoin(1) == Membership(1, "active", left.left_at_ns)
        assert tidal.cohorts() == {"de": {"country": "DE"}}
        assert tidal.drop_cohort("de") is True
        assert tidal.stats()["signals"] == 3
        with pytest.raises(InvalidParams, match="entity"):
            tidal.signal(1, "", "view")
        with pytest.raises(ValueError, match="user_id"):
            tidal.leave(-1)
        assert tidal.ping() == "pong"  # errors leave the connection usable


def test_threads_share_one_client(blocking_server: BlockingServer) -> None:
    with SyncClient("127.0.0.1", blocking_server.port) as tidal:
        seqs: list[int] = []

        def work(n: int) -> None:
            for i in range(100):
                seqs.append(tidal.signal(n * 1000 + i, "threads", "view").seq)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seqs)) == 400
        assert tidal.counts("threads").ledger["view"].count == 400


def test_a_call_times_out_and_the_next_one_reconnects(tmp_path: Path) -> None:
    silent = socket.socket()  # accepts connections (in its backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    tidal = SyncClient("127.0.0.1", silent.getsockname()[1], timeout=0.2, reconnect=1)
    with pytest.raises(CallTimeout, match="ping: no reply"):
        tidal.ping()
    assert not tidal.is_connected  # a late reply can never answer a later call
    silent.close()
    with pytest.raises(ConnectionLost, match="could not reconnect"):
        tidal.ping()
    tidal.close()


def test_keyed_signals_survive_a_crash_of_the_server(db_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = BlockingServer(db_path, "--port", str(port)).start()
    with SyncClient("127.0.0.1", port, auto_keys=True, timeout=10) as tidal:
        seqs = [tidal.signal(i, "crash", "view").seq for i in range(100)]
        server.stop(signal.SIGKILL)
        server.start()
        seqs += [tidal.signal(i, "crash", "view").seq for i in range(100, 200)]
    server.stop()
    assert len(set(seqs)) == 200
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT COUNT(*) FROM ledger").fetchone() == (200,)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_calls_recover_after_the_server_restarts(db_path: Path, how: signal.Signals) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = BlockingServer(db_path, "--port", str(port)).start()
    try:
        with SyncClient("127.0.0.1", port, timeout=10) as tidal:
            assert tidal.leave(7).status == "left"
            server.stop(how)
            server.start()
            assert tidal.status(7).status == "left"  # the first call after the restart
            server.stop(how)
            server.start()
            assert tidal.leave(8).status == "left"  # a write too: the drop was seen first
    finally:
        server.stop()


def test_every_error_a_call_can_raise_is_a_tidal_error(blocking_server: BlockingServer) -> None:
    with SyncClient("127.0.0.1", blocking_server.port, timeout=10) as tidal:
        with pytest.raises(RequestTooLarge, match="exceeds the limit") as large:
            tidal.signal(1, "x" * 9_000_000, "view")
        with pytest.raises(InvalidArgument, match="user_id") as huge:
            tidal.status(2**64)
        assert isinstance(large.value, TidalError) and isinstance(huge.value, TidalError)
        assert tidal.ping() == "pong"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectFailed) as refused:
        SyncClient("127.0.0.1", port, reconnect=0)
    assert isinstance(refused.value, TidalError) and isinstance(refused.value, ConnectionError)


def test_the_server_s_reason_for_closing_reaches_the_caller(db_path: Path) -> None:
    server = BlockingServer(db_path, "--max-connections", "1").start()
    try:
        with SyncClient("127.0.0.1", server.port, timeout=10) as first:
            assert first.ping() == "pong"
            with (
                SyncClient("127.0.0.1", server.port, timeout=10, reconnect=1) as second,
                pytest.raises(ConnectionLost, match="too many connections"),
            ):
                second.leave(1)
    finally:
        server.stop()
