"""One run: load, a fault, recovery, then the checker over the whole history so far; again.

A failure prints the seed that replays the run's choices (``TIDAL_HISTORY_SEED``), the
fault it followed, the operations around the first anomaly, and on SQLite where a copy of
the database it checked is kept.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tidal.client import Client, ConnectionLost, Unavailable
from tidal.testing.postgres import Cluster

from ..conftest import Database
from . import group_checker
from .checker import Checker
from .cluster import ClusterTarget
from .groups import GroupHistory, GroupLoad
from .http_caller import HttpCaller
from .nemesis import Target
from .record import History
from .workload import CALL_TIMEOUT, PROBE_USERS, PROBES, Caller, Dial, Load, dial_port

#: the connections of one server's load that go through its HTTP edge (``--http``): one 16
#: tasks deep, one 3 deep; the probes (the first two) stay on MessagePack
OVER_HTTP = frozenset({2, 3})


def dial_mixed(target: Target) -> Dial:
    """Clients of the serving tidal: over HTTP for ``OVER_HTTP``, else MessagePack."""
    plain = dial_port(target.port)

    async def dial(index: int) -> Caller:
        if index in OVER_HTTP:
            return await HttpCaller.connect(target.serving.http_port, CALL_TIMEOUT)
        return await plain(index)

    return dial


def keep(database: Database, disk: Path | None) -> str:
    """The SQLite file as the failed check read it, copied beside the test's own file system
    (unmounted after the run), for sqlite3 to open once the run is over: the seed replays a
    run's choices, not its timing."""
    if database.backend != "sqlite" or disk is None:
        return ""
    kept = disk.parent / "anomalous"
    kept.mkdir(exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(database.target + suffix, kept / (Path(database.target).name + suffix))
    return f"\nthe database as checked: {kept}"


@dataclass
class Summary:
    seed: int
    operations: int
    acknowledged: int
    unknown: int
    refused: int  # an error that says nothing was saved
    full: int  # ... for the memory budget
    faults: int
    checks: int
    anomalies: int
    seconds: float
    group: GroupHistory | None = None
    over_http: int = 0  # operations sent through the HTTP edge

    def __str__(self) -> str:
        g = self.group
        grouped = "" if g is None else (
            f"; group: {len(g.deliveries)} deliveries to {g.sessions} consumer sessions"
            f" on {len(g.ports)} ports"
            f" ({g.crashes} crashed unacknowledged), {sum(a.outcome == 'ok' for a in g.acks)}"
            f" acks of {sum(len(a.ids) for a in g.acks if a.outcome == 'ok')} events"
        )  # fmt: skip
        return (
            f"history seed {self.seed}: {self.operations} operations ({self.acknowledged}"
            f" acknowledged, {self.unknown} of unknown outcome, {self.refused} refused,"
            f" {self.full} of them for the memory budget; {self.over_http} over HTTP),"
            f" {self.faults} faults,"
            f" {self.checks} checks, {self.anomalies} anomalies, {self.seconds:.0f} s{grouped}"
        )


async def check(
    history: History,
    database: Database,
    target: Target | ClusterTarget,
    group: GroupHistory | None = None,
) -> list[tuple[float, str]]:
    await target.settle()
    if isinstance(target, ClusterTarget):  # routed by user; the reads of every node checked
        routed = await target.dial(PROBE_USERS, 60)
        readers = await target.readers()
        try:
            checker = Checker(history, database, routed, readers, clustered=True)
            anomalies = await checker.run()
            if group is not None:  # served by partition 0's node, settled now
                port = await target.lead_port()
                async with await Client.connect("127.0.0.1", port, timeout=60) as c:
                    anomalies += await group_checker.check(group, port, c, checker.sent)
            return anomalies
        finally:
            await routed.close()
            for c in readers:
                await c.close()
    async with await Client.connect("127.0.0.1", target.port(), timeout=60) as c:
        checker = Checker(history, database, c, [c])
        anomalies = await checker.run()
        if group is not None:
            anomalies += await group_checker.check(group, target.port(), c, checker.sent)
        return anomalies


STATS = "stats.aggregates_bytes"


class Anomalies(AssertionError):
    pass


def kinds(anomalies: list[tuple[float, str]], most: int = 8) -> list[str]:
    """One anomaly of each kind (its first words, less numbers), at most ``most``."""
    seen: dict[str, str] = {}
    for _, text in anomalies:
        words = " ".join(w for w in text.split()[:6] if not w[0].isdigit())
        seen.setdefault(words, text.split("\n")[0][:300])
    return list(seen.values())[:most]


async def run(database: Database, seed: int, faults: int, nemesis: list[str], *extra: str,
              pg: Cluster | None = None, standby: bool = False,
              disk: Path | None = None, cluster: bool = False) -> Summary:  # fmt: skip
    """``cluster``: three nodes (``history.cluster``) rather than one server."""
    rng = random.Random(seed)
    history = History(seed)
    began = time.monotonic()
    target: Target | ClusterTarget
    if cluster:
        target = ClusterTarget(database, history, *extra, pg=pg)
        routed = target
        load = Load(history, rng,
                    lambda i: routed.dial(PROBE_USERS + i, CALL_TIMEOUT, pinned=i < PROBES),
                    target.up, one_user=True)  # fmt: skip
        group = GroupLoad(GroupHistory(), routed.lead_port, target.up, rng)
    else:
        target = Target(database, history, *extra, "--http", "127.0.0.1:0", pg=pg,
                        standby=standby, disk=disk)  # fmt: skip
        load = Load(history, rng, dial_mixed(target), target.up)
        one = target

        async def port() -> int:
            return one.port()

        group = GroupLoad(GroupHistory(), port, target.up, rng)
    checks = 0
    try:
        await target.start()
        for n in range(faults):
            load.start()
            await group.make()
            group.start()
            await load.until(rng.randrange(50, 600))
            fault = rng.choice(target.faults(nemesis))
            await fault(rng)
            await load.until(rng.randrange(0, 100))
            await load.stop()
            await group.stop()
            try:
                anomalies = await check(history, database, target, group.record)
            except (ConnectionLost, Unavailable) as exc:
                # its tidal let the database go meanwhile, and the standby took it: the
                # check is made again of the one that serves now (``Target.settle``)
                if isinstance(exc, Unavailable) and "took the database" not in str(exc):
                    raise
                anomalies = await check(history, database, target, group.record)
            checks += 1
            used, allowed = load.memory_over
            if used:
                anomalies.append((0, (
                    f"the aggregates took {used} bytes ({STATS}), past the memory budget's"
                    f" {allowed}: a write created aggregates that did not fit"
                )))  # fmt: skip
            if anomalies:
                at, first = min(anomalies, key=lambda a: a[0] or float("inf"))
                story = history.around(at) if at else "(no single operation)"
                raise Anomalies(
                    f"history seed {seed} (TIDAL_HISTORY_SEED={seed} replays it), after fault"
                    f" {n + 1} ({fault.__name__}): {len(anomalies)} anomalies; the first:\n"
                    f"  {first}\n"
                    + "\n".join(f"  {text}" for text in kinds(anomalies))
                    + f"\naround it:\n  {story}"
                    + keep(database, disk)
                )
    except BaseException as exc:
        print(target.logs(), flush=True)  # shown with -s: what the servers said last
        if not isinstance(exc, Anomalies):  # a wedge or a timeout: which run, and where
            last = [fault.what for fault in history.faults[-3:]]
            exc.add_note(f"history seed {seed} (TIDAL_HISTORY_SEED={seed} replays its choices),"
                         f" {len(history.faults)} faults in; the last: {last}")  # fmt: skip
        raise
    finally:
        await load.stop()
        await group.stop()
        await target.close()
    ops = history.ops
    return Summary(
        seed, len(ops), sum(op.outcome == "ok" for op in ops),
        sum(op.outcome == "unknown" for op in ops),
        sum(op.outcome == "fail" for op in ops),
        sum(op.outcome == "fail" and " full: " in str(op.reply) for op in ops),
        len(history.faults), checks, 0,
        time.monotonic() - began, group.record,
        sum(op.client in OVER_HTTP for op in ops) if not cluster else 0,
    )  # fmt: skip
