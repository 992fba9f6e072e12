"""The commit cycle without a server (``engine.cycle``): its participants run in the order
declared, at every step; their statements make one transaction between BEGIN and COMMIT;
what each found reaches it once committed; a batch that writes nothing costs no
transaction. And the timeline the history lines and events are timed by."""

from __future__ import annotations

from typing import Any

from tidal.server.core.batch import Batch
from tidal.server.core.timeline import Timeline
from tidal.server.core.userrows import BLOCK, UserRows, pack
from tidal.server.engine.cycle import Cycle, Participant, Transaction
from tidal.server.engine.participants import Ledger, Users
from tidal.server.storage.past_sql import PUT_BLOCK
from tidal.server.storage.sqlbulk import (
    SQLITE,
    Begin,
    Commit,
    Dialect,
    Exec,
    Many,
    Op,
    Plan,
    Rows,
)


class Recording(Participant):
    """A participant that says what it did, in a log every participant shares."""

    def __init__(self, name: str, log: list[str], *, writes: bool = False) -> None:
        self.name, self.log, self._writes = name, log, writes
        self.found: Any = "unset"

    def prepare(self, batch: Batch) -> None:
        self.log.append(f"prepare {self.name}")

    def reads(self, batch: Batch) -> Plan[None]:
        yield Rows(f"read {self.name}")

    def writes(self, batch: Batch) -> bool:
        return self._writes

    def plan(self, batch: Batch, d: Dialect) -> Plan[str]:
        answer = yield Exec(f"write {self.name}")
        return f"{self.name} found {answer}"

    def committed(self, batch: Batch, found: Any) -> None:
        self.log.append(f"committed {self.name}")
        self.found = found

    def failed(self, batch: Batch, later: Batch, unknown: bool) -> None:
        self.log.append(f"failed {self.name}")


def ran(transaction: Transaction) -> tuple[list[Op], bool]:
    """The transaction's plan run as a runner runs it, each statement answered by its
    position; what it yielded, and what it returned."""
    plan, sent, ops = transaction(SQLITE), None, []
    try:
        while True:
            op = plan.send(sent)
            ops.append(op)
            sent = len(ops)
    except StopIteration as done:
        return ops, done.value


def test_every_step_runs_the_participants_in_the_declared_order() -> None:
    log: list[str] = []
    parts = [Recording(name, log, writes=name == "b") for name in ("a", "b", "c")]
    cycle = Cycle()
    cycle.declare(parts)
    batch, found = Batch(1), list[Any]()
    cycle.prepare(batch)
    ops, wrote = ran(Transaction(cycle, batch, found))
    assert wrote
    assert ops == [
        Rows("read a"), Rows("read b"), Rows("read c"),
        Begin(), Exec("write a"), Exec("write b"), Exec("write c"), Commit(),
    ]  # fmt: skip
    cycle.committed(batch, found)
    cycle.failed(batch, Batch(2))
    assert log == [
        "prepare a", "prepare b", "prepare c",
        "committed a", "committed b", "committed c",
        "failed a", "failed b", "failed c",
    ]  # fmt: skip
    # each is handed what its own statements found (here: the answer to its write)
    assert [p.found for p in parts] == ["a found 5", "b found 6", "c found 7"]


def test_a_batch_nothing_writes_in_costs_no_transaction() -> None:
    log: list[str] = []
    parts = [Recording(name, log) for name in ("a", "b")]
    cycle = Cycle()
    cycle.declare(parts)
    batch, found = Batch(1), list[Any]()
    ops, wrote = ran(Transaction(cycle, batch, found))
    assert not wrote and ops == [Rows("read a"), Rows("read b")]
    cycle.committed(batch, found)
    assert [p.found for p in parts] == [None, None]  # nothing found: nothing was run

    batch.reach = True  # a health check: one round trip, still no transaction
    ops, wrote = ran(Transaction(cycle, batch, found))
    assert not wrote and ops[-1] == Rows("SELECT 1")


def test_what_was_found_is_kept_before_the_commit_whose_answer_may_be_lost() -> None:
    """A COMMIT whose answer was lost, found out later to have held: what the statements
    found was put aside before the COMMIT went, so the participants still take it in."""
    log: list[str] = []
    part = Recording("a", log, writes=True)
    cycle = Cycle()
    cycle.declare([part])
    batch, found = Batch(1), list[Any]()
    plan = Transaction(cycle, batch, found)(SQLITE)
    op = next(plan)
    while not isinstance(op, Commit):
        op = plan.send("answer")
    plan.close()  # the runner's COMMIT raised: the plan is abandoned there
    assert found == ["a found answer"]


def test_a_block_of_ledger_users_is_written_by_a_batch_of_reads_alone() -> None:
    """The fault-history checker found rows no erase reached: a batch with no write but a
    block of ``ledger_users`` that committed rows had filled cost no transaction, yet memory
    let go of those rows as if the block were on disk."""
    rows = UserRows(1, [7] * BLOCK)  # committed rows filled a block: not on disk yet
    cycle = Cycle()
    cycle.declare([Ledger(0, lambda seq: None), Users(rows, None)])
    batch, found = Batch(BLOCK + 1), list[Any]()
    batch.replies.append((None, 1, "a read waiting for the batch"))  # type: ignore[arg-type]
    cycle.prepare(batch)
    ops, wrote = ran(Transaction(cycle, batch, found))
    assert wrote and Begin() in ops and Commit() in ops
    assert Many(PUT_BLOCK, [(1, pack([7] * BLOCK))]) in ops
    cycle.committed(batch, found)
    assert rows.next_block == BLOCK + 1 and rows.tail == []


def test_the_timeline_never_steps_back() -> None:
    wall = [100]
    timeline = Timeline(150, lambda: wall[0])
    assert timeline.now() == 151  # later than the last, though the clock is behind
    assert timeline.now() == 151  # ... and not taken by looking
    assert timeline.take() == 151
    timeline.saw(140)  # an older line changes nothing
    assert timeline.take() == 152
    wall[0] = 1_000
    assert timeline.take() == 1_000
    timeline.saw(2_000)
    assert timeline.now() == 2_001
