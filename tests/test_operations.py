"""An operator's day one: one server per database, and every mistake told in one line.

Each start here is a real ``tidal serve`` (or tool) in a child process; a refused
start must exit 2 with the cause on one line, no traceback, and nothing changed
on disk.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from tidal.cli.parser import tidal_parser
from tidal.server.storage.sqlite.sqlite_schema import SCHEMA_VERSION

from .conftest import Database, ServerProcess, tmpfs


def tidal(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=None if env is None else {**os.environ, **env},
        stdin=subprocess.DEVNULL,
    )


def refused(done: subprocess.CompletedProcess[str], *words: str, code: int = 2) -> str:
    """The one line of a refused start: the exit code, no traceback, the cause named."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    causes = [
        line
        for line in done.stderr.splitlines()
        if " INFO " not in line and not line.startswith("warning:")
    ]
    assert len(causes) == 1, done.stderr
    for word in words:
        assert word in causes[0], causes[0]
    return causes[0]


def files(folder: Path) -> dict[str, str]:
    """What is in a folder, by content: to show a refused start changed nothing."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def serve(
    db: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return tidal("serve", "--port", "0", "--db", str(db), *extra, env=env)


# -- one server per database ---------------------------------------------------


async def test_a_second_server_on_the_same_database_refuses_and_changes_nothing(
    process: ServerProcess, tmp_path: Path
) -> None:
    await process.start()
    assert process.proc is not None
    async with await process.connect() as first:
        await first.leave(5)
        before = files(tmp_path)
        # the same file, named directly and through a link: both refused
        link = tmp_path / "elsewhere"
        link.mkdir()
        (link / "same.db").symlink_to(process.file)
        for name in (process.file, link / "same.db"):
            done = await asyncio.to_thread(serve, name)
            refused(done, f"pid {process.proc.pid}", "whatever path or link", "another tidal")
        (link / "same.db").unlink()
        link.rmdir()
        assert files(tmp_path) == before  # no migration, no file, not a byte
        # the first one still serves, and still gates
        assert (await first.status(5)).status == "left"
        assert (await first.signal(5, "ent", "view", communities=["c"])).forwarded is False
        assert (await first.leave(6)).status == "left"
        # and a backup still reads beside it
        done = await asyncio.to_thread(
            tidal, "backup", str(tmp_path / "copy.db"), "--db", str(process.file)
        )
        assert done.returncode == 0, done.stderr
    with sqlite3.connect(tmp_path / "copy.db") as copy:
        assert copy.execute("SELECT COUNT(*) FROM memberships WHERE left = 1").fetchone() == (2,)


async def test_a_kill_9_leaves_no_lock_behind(process: ServerProcess) -> None:
    await process.start()
    await process.kill9()  # the lock dies with the process: the next start takes it
    await process.start()
    async with await process.connect() as c:
        assert await c.ping() == "pong"


# -- mistakes, each in one line ------------------------------------------------


def test_a_database_in_a_missing_directory(tmp_path: Path) -> None:
    done = serve(tmp_path / "no" / "such" / "t.db")
    refused(done, "--db", f"{tmp_path / 'no' / 'such'} does not exist")
    assert not (tmp_path / "no").exists()


def test_a_database_in_a_directory_that_cannot_be_entered(tmp_path: Path) -> None:
    """Mode 700 and another owner: the server's user may not even look inside."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    command = [sys.executable, "-m", "tidal.cli", "serve", "--port", "0"]
    command += ["--db", str(closed / "t.db")]
    if os.geteuid() == 0:
        # root enters any directory; without the two capabilities that let it, it is the
        # user the issue names: uid 0, owner of nothing here
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.fail("this test drops root's file capabilities with setpriv (util-linux)")
        os.chown(closed, 65534, 65534)  # nobody's
        command = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--", *command]
    else:
        closed.chmod(0o000)  # our own, closed to us
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    finally:
        closed.chmod(0o700)
    refused(done, f"--db {closed / 't.db'}", f"uid {os.getuid()}", f"cannot enter {closed}")


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Path]:
    """A healthy database's file system, to be remounted read-only (a real tmpfs)."""
    with tmpfs(tmp_path / "ro", "8m") as mount:
        yield mount


def test_a_read_only_database_is_called_read_only_not_damaged(read_only_disk: Path) -> None:
    db = read_only_disk / "t.db"
    made = sqlite3.connect(db)
    made.execute("CREATE TABLE t (x)")
    made.close()  # a file open for writing would keep the remount from happening
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_disk)], check=True)
    line = refused(serve(db), "read-only")
    assert "damaged" not in line and "recover" not in line


def test_another_programs_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """``serve --db app.db``, where app.db holds an application's tables: it was served,
    and tidal added 22 tables to it."""
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as made:
        made.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        made.execute("INSERT INTO users VALUES (1, 'ada')")
    made.close()
    before = files(tmp_path)
    refused(serve(db), str(db), "another program's tables (users)", "writes nothing")
    assert files(tmp_path) == before  # not a byte changed, no -wal or -shm left


def test_a_database_from_a_newer_tidal(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as made:
        made.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    refused(serve(db), "newer", str(db))


def test_a_port_in_use_is_found_before_the_database_is_touched(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = tidal("serve", "--port", str(port), "--db", str(tmp_path / "t.db"))
    refused(done, f"127.0.0.1:{port}", "in use")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("TIDAL_LOG_LEVEL", "verbose", "TIDAL_LOG_LEVEL='verbose': must be one of debug"),
        ("TIDAL_MAX_CONNECTIONS", "abc", "TIDAL_MAX_CONNECTIONS='abc': must be a whole number"),
        ("TIDAL_IDLE_TIMEOUT", "soon", "TIDAL_IDLE_TIMEOUT='soon': must be a duration"),
        ("TIDAL_IDLE_TIMEOUT", "inf", "TIDAL_IDLE_TIMEOUT='inf': must be a duration"),
        ("TIDAL_BACKLOG", "1e20", "TIDAL_BACKLOG='1e20': must be a whole number"),
        ("TIDAL_MEMORY_BUDGET", "\u0665\u0661\u0662M", "TIDAL_MEMORY_BUDGET="),
        ("TIDAL_TREND_HALF_LIVES", ",", "TIDAL_TREND_HALF_LIVES=','"),
        ("TIDAL_PORT", "99999", "TIDAL_PORT='99999': port must be in 0..65535"),
        ("TIDAL_DURABILITY", "sometimes", "TIDAL_DURABILITY='sometimes': must be one of full"),
    ],
)
def test_a_bad_environment_value_names_the_variable(
    tmp_path: Path, variable: str, value: str, says: str
) -> None:
    done = tidal("serve", "--db", str(tmp_path / "t.db"), env={variable: value})
    refused(done, says)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--port", "abc"], "argument --port: port must be an integer, got 'abc'"),
        (["serve", "--durability", "sometimes"], "argument --durability: invalid choice"),
        (["top", "ledger", "view", "--window", "2h"], "argument --window: invalid choice"),
        (["stats", "-p", "http"], "argument -p/--port: port must be an integer"),
        # what the fifth round of hostile input found printing a traceback, or taken
        (["serve", "--db", ""], "argument --db: must be a file's path"),
        (["serve", "--host", ""], "argument --host: must be a host name or an IP address"),
        (["serve", "--trend-half-lives", ""], "argument --trend-half-lives: '' is not a"),
        (["serve", "--trend-half-lives", "\u0666h"], "argument --trend-half-lives: '\u0666h' is"),
        (["serve", "--idempotency-window", "inf"], "argument --idempotency-window: must be a"),
        (["serve", "--idempotency-window", "1e300"], "argument --idempotency-window: must be"),
        (["serve", "--backlog", "1e20"], "argument --backlog: must be a whole number"),
        (["serve", "--backlog", "100000"], "argument --backlog: must be 1 to 65535"),
        (
            ["serve", "--max-message-size", "100000000000000000000"],
            "argument --max-message-size: must be 67584 to 1073741824",
        ),
        (["serve", "--memory-budget", "\u0665\u0661\u0662M"], "argument --memory-budget: must be"),
        (["serve", "--max-connections", "\uff16"], "argument --max-connections: must be a whole"),
        (["status", "42", "--timeout", "-1"], "tidal status: argument --timeout: must be"),
        (["status", "42", "--timeout", "nan"], "argument --timeout: must be a duration"),
        (["status", "42", "--timeout", "inf"], "argument --timeout: must be a duration"),
        (["status", "42", "--timeout", "0"], "argument --timeout: must be more than 0s"),
        (["status", "18446744073709551616"], "argument user_id: must be 0 to 18446744073709551615"),
        (["top", "ledger", "view", "--limit", "0"], "argument --limit: must be 1 to 1000"),
        # the nearest command or flag, as git and cargo suggest, told by the command given
        (["stauts", "42"], "invalid choice: 'stauts'"),
        (
            ["status", "42", "--jsn"],
            "tidal status: unrecognized arguments: --jsn; did you mean '--json'?",
        ),
        (
            ["top", "ledger", "view", "--windw", "1h"],
            "tidal top: unrecognized arguments: --windw 1h; did",
        ),
    ],
)
def test_a_bad_flag_gets_one_line_naming_it(tmp_path: Path, argv: list[str], says: str) -> None:
    """As a bad environment value does: not thirty lines of usage before the one that matters."""
    done = tidal(*argv, "--db", str(tmp_path / "t.db")) if argv[0] == "serve" else tidal(*argv)
    refused(done, says, "--help")
    assert list(tmp_path.iterdir()) == []


def test_a_misspelt_command_is_told_the_nearest() -> None:
    refused(tidal("stauts", "42"), "did you mean 'stats' or 'status'?")


def test_serve_help_prints_every_setting() -> None:
    """A bare % in a setting's help (the memory budget's 60%) made argparse's help crash."""
    done = tidal("serve", "--help")
    assert done.returncode == 0, done.stderr
    assert "--memory-budget" in done.stdout and "60%" in done.stdout


def command_lines(parser: argparse.ArgumentParser) -> Iterator[list[str]]:
    """The words of every command the parser has, itself first, then its subcommands'."""
    yield []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ([name, *words] for words in command_lines(sub))


@pytest.mark.parametrize("words", [" ".join(w) for w in command_lines(tidal_parser()[0])])
def test_every_command_help_exits_0(words: str) -> None:
    """Generated from the parser: a command added later is covered as it is added."""
    done = tidal(*words.split(), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: tidal {words}".rstrip()), done.stdout
    assert done.stderr == ""


def test_an_empty_host_variable_is_unset_and_binds_loopback(tmp_path: Path) -> None:
    """A compose file's ``TIDAL_HOST=${TIDAL_HOST}`` with nothing behind it leaves the
    variable empty: that is unset, so loopback, never every interface (asyncio binds every
    interface for an empty host)."""
    env = {**os.environ, "TIDAL_HOST": "", "TIDAL_TOKEN": "a-token", "TIDAL_DB": ""}
    command = [sys.executable, "-m", "tidal.cli", "serve", "--port", "0"]
    with subprocess.Popen(
        command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stderr is not None
            line = child.stderr.readline()
            assert "bound 127.0.0.1:" in line, line
        finally:
            child.terminate()
            child.wait(timeout=30)
    assert (tmp_path / "tidal.db").exists()  # TIDAL_DB= is unset too: the default file


async def test_the_largest_limits_a_flag_takes_are_served(tmp_path: Path) -> None:
    """What the ranges allow, the code honours: a server at the top of each one serves
    (past 2**63, --max-message-size started a server whose every connection died)."""
    big = ("--max-message-size", str(2**30), "--max-output-buffer", str(2**34))
    process = ServerProcess(tmp_path / "t.db", *big, "--backlog", "65535")
    await process.start()
    try:
        async with await process.connect() as c:
            await c.leave(7)
            assert (await c.status(7)).left
    finally:
        await process.stop()


async def test_stats_and_status_print_json_and_p_is_the_port(process: ServerProcess) -> None:
    await process.start()
    done = await asyncio.to_thread(tidal, "call", "-p", str(process.port), "leave", "5")
    assert done.returncode == 0, done.stderr
    done = await asyncio.to_thread(tidal, "stats", "-p", str(process.port), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["users_left"] == 1, done.stderr
    done = await asyncio.to_thread(tidal, "status", "5", "-p", str(process.port), "--json")
    status = json.loads(done.stdout)
    assert (status["user_id"], status["status"]) == (5, "left") and status["left_at_ns"] > 2**53


async def interrupted_bench(process: ServerProcess, *extra: str) -> tuple[str, str, int | None]:
    """``tidal bench`` stopped by Ctrl-C once under way (the server has counted 1,000 of its
    signals): what it printed, and its exit status."""
    bench = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidal.cli", "bench", "-p", str(process.port), "-c", "2",
        "-n", "1000000", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with await process.connect() as c:
            for _ in range(3000):  # polled: a minute at most
                if (await c.stats())["signals"] >= 1000:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("tidal bench sent no 1,000 signals in a minute")
        bench.send_signal(signal.SIGINT)
        out, err = (b.decode() for b in await asyncio.wait_for(bench.communicate(), 120))
    finally:
        if bench.returncode is None:
            bench.kill()
    return out, err, bench.returncode


async def test_ctrl_c_during_bench_prints_what_it_measured(process: ServerProcess) -> None:
    await process.start()
    out, err, code = await interrupted_bench(process, "--keep")
    assert code == 130, err
    assert "Traceback" not in err, err
    assert "interrupted (Ctrl-C)" in out and "requests/s" in out, out
    answered = re.search(r"the (\d+) requests answered", out)
    assert answered is not None and 1000 <= int(answered[1]) < 1_000_000, out


async def test_ctrl_c_during_bench_cleans_up_only_what_it_sent_without_flooding_the_log(
    process: ServerProcess,
) -> None:
    """Its summary came only after about 55 s of silent clean-up that erased every user it
    had planned for (94,962, more than the requests answered), one commit each, writing
    130,000 lines to the server's log. Now the summary comes first; then the users of the
    requests it sent are erased, a batch at a time, with a line for their number, and the
    server logs at most a line a second of them."""
    await process.start()
    out, err, code = await interrupted_bench(process)
    assert code == 130, err
    answered = re.search(r"the (\d+) requests answered", out)
    assert answered is not None, out
    cleaning = re.search(r"cleaning up ([\d,]+) users", err)
    assert cleaning is not None, err
    # a signal each, from 2 connections with one request in flight each
    assert 0 < int(cleaning[1].replace(",", "")) <= int(answered[1]) + 2, (out, err)
    assert re.search(r"erased and rejoined its [\d,]+ users", err), err
    async with await process.connect() as c:
        stats = await c.stats()
        assert stats["users_left"] == 0, stats
    erased = [line for line in process.log if b"signals erased" in line]
    assert len(erased) < 100, f"{len(erased)} lines of erases in the server's log"


async def test_environment_choices_ignore_case(db_path: Path) -> None:
    proc = ServerProcess(db_path)
    os.environ["TIDAL_LOG_FORMAT"] = "JSON"
    try:
        await proc.start()
    finally:
        del os.environ["TIDAL_LOG_FORMAT"]
    await proc.stop()
    assert json.loads(proc.log[0])["logger"] == "tidal.server"


def test_a_backup_into_a_missing_directory_names_it(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as made:
        made.execute("CREATE TABLE t (x)")
    refused(tidal("backup", "/no/such/dir/b.db", "--db", str(db)), "/no/such/dir", "not exist")


# -- tidal call and friends ------------------------------------------------------


async def test_tidal_call_sends_what_was_typed(process: ServerProcess) -> None:
    await process.start()
    port = ["--port", str(process.port)]

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return tidal("call", *port, *args)

    done = await asyncio.to_thread(call, "signal", "1", "x", "view", '{"communities": ["j"],}')
    line = refused(done, "argument 4 is not valid JSON", "column 23")
    assert "context" not in line  # refused here, not by the server
    done = await asyncio.to_thread(call, "signal", "18446744073709551616", "x", "view")
    refused(done, "argument 1", "2**64-1")
    # an entity of digits, forced to a string as JSON says strings are written
    done = await asyncio.to_thread(call, "signal", "1", '"17"', "view")
    assert done.returncode == 0 and json.loads(done.stdout)["forwarded"] is True, done.stderr
    done = await asyncio.to_thread(call, "counts", '"17"')
    assert json.loads(done.stdout)["ledger"]["view"]["count"] == 1
    done = await asyncio.to_thread(call, "counts", "17")  # an int: checked before sending
    refused(done, "argument 1 (entity) must be string, got int 17", "quote it as JSON")
    done = await asyncio.to_thread(call, "ping", "1")  # the number of arguments too
    refused(done, "ping takes 0 params (none), got 1")
    done = await asyncio.to_thread(call, "pong")
    refused(done, "no method 'pong'", "tidal call --help")
    done = await asyncio.to_thread(call, "counts", '"17"', '{"window": "2h"}')  # the server's rule
    assert done.returncode == 1 and "window" in done.stderr, done.stderr


async def test_tidal_call_prints_a_cursor_that_can_be_sent_back(process: ServerProcess) -> None:
    await process.start()
    port = ["--port", str(process.port)]
    for user, entity in enumerate(["a", "b", "b"]):
        await asyncio.to_thread(tidal, "call", *port, "signal", str(user), entity, "view")
    pages = []
    after: list[str] = []
    for _ in range(2):
        options = json.dumps({"limit": 1, **({"after": after[0]} if after else {})})
        done = await asyncio.to_thread(
            tidal, "call", *port, "top", "ledger", "null", "view", options
        )
        assert done.returncode == 0, done.stderr
        page = json.loads(done.stdout)
        pages.append(page["entities"][0]["entity"])
        after = [page["next"]]
    assert pages == ["b", "a"]


def test_tidal_call_help_lists_every_method() -> None:
    from tidal.protocol.methods import TABLE

    done = tidal("call", "--help")
    assert done.returncode == 0
    for method in TABLE:
        assert f"  {method.name} " in done.stdout and method.summary in done.stdout, method.name


def test_tidal_version_is_the_installed_one_and_says_how_it_was_built() -> None:
    import tidal.server.core.tallies as hot

    built = "pure Python" if hot.__file__.endswith(".py") else "compiled"  # mypyc's: a .so
    done = tidal("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"tidal {version('tidal')} ({built})"


async def test_the_token_from_a_file_for_the_server_and_the_tools(
    db_path: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text("from-a-file\n")  # as secrets files usually end
    proc = ServerProcess(db_path, "--token-file", str(secret))
    await proc.start()
    try:
        port = str(proc.port)
        done = await asyncio.to_thread(
            tidal, "call", "--port", port, "ping", env={"TIDAL_TOKEN_FILE": str(secret)}
        )
        assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
        done = await asyncio.to_thread(tidal, "call", "--port", port, "--token", "x", "ping")
        assert done.returncode == 1 and "visible" not in done.stderr
        assert done.stderr.startswith("warning: a token given with --token can be read by any")
        both = {"TIDAL_TOKEN": "a", "TIDAL_TOKEN_FILE": str(secret)}
        done = await asyncio.to_thread(tidal, "call", "--port", port, "ping", env=both)
        refused(done, "TIDAL_TOKEN and TIDAL_TOKEN_FILE are both set")
        done = await asyncio.to_thread(
            tidal, "call", "--port", port, "ping", env={"TIDAL_TOKEN_FILE": "/no/such/token"}
        )
        refused(done, "TIDAL_TOKEN_FILE /no/such/token")
    finally:
        await proc.stop()


async def test_debug_logs_are_tidal_s_own(db_path: Path) -> None:
    proc = ServerProcess(db_path, "--log-level", "debug")
    await proc.start()
    async with await proc.connect() as c:
        await c.signal(1, "e", "view")
    await proc.stop()
    log = b"".join(proc.log).decode()
    assert "DEBUG tidal.connection: connection from" in log
    assert "aiosqlite" not in log


@pytest.mark.both_backends
async def test_a_new_database_is_made_at_the_current_schema_in_one_line(
    database: Database,
) -> None:
    """Not a line per version it never had: an operator's first start reads one."""
    process = await ServerProcess(database.target).start()
    await process.stop()
    lines = [line.decode() for line in process.log if b"schema" in line]
    assert len(lines) == 1, lines
    assert "database created at schema version" in lines[0], lines

    await process.start()  # the schema is current: nothing to say of it
    await process.stop()
    assert [line for line in process.log if b"schema" in line] == []
