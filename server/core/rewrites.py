"""A purge's or erase's rows, rewritten after it took effect, a chunk per commit.

A user's rows lie across the whole ledger: flipping or deleting 10,000 of them
rewrites 10,000 pages, a quarter of a second and more inside one commit that
every client waits on. So a withdrawal takes its sums off at once (from a survey
read beside the writer, see ``engine.withdrawals``) and records a rule in ``rewrites``,
in the same transaction: the user's rows below ``erase_before`` count as gone,
those below ``purge_before`` as not forwarded, whatever the rows still say. The
rows are then rewritten ``CHUNK`` at a time, one chunk per commit, and the rule
is deleted with the last. Everything that reads rows back (a later survey, boot's
replay of the ledger's tail, keys at boot) reads them through ``reach``: the one
place the rule lives.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final, NamedTuple

#: rows per commit, by default: 64 scattered rows rewrite in a few ms here (256: about 10)
CHUNK: Final = 64
#: the share of the writer's time that chunks take from commits requests wait on: with a
#: chunk in nearly every commit, 20 users' rows (200,000 pages written and synced) took a
#: third of the writer's CPU away from a 16x16 load
SHARE: Final = 0.1
#: the most time, in s, the rewrites save up while no chunk is due: a short burst at most
SAVED: Final = 0.005

GONE: Final = -1  # ``reach`` of a row an erase took


class Rule(NamedTuple):
    """A user's rows below ``erase_before`` are gone, below ``purge_before`` unforwarded."""

    purge_before: int = 0
    erase_before: int = 0

    def wider(self, erase: bool, before_seq: int) -> Rule:
        if erase:
            return Rule(self.purge_before, max(self.erase_before, before_seq))
        return Rule(max(self.purge_before, before_seq), self.erase_before)


NO_RULE: Final = Rule()


def reach(rule: Rule, seq: int, forwarded: int) -> int:
    """What a row counts as: ``GONE``, 0 (not forwarded) or 1, whatever it still says."""
    if seq < rule.erase_before:
        return GONE
    if seq < rule.purge_before:
        return 0
    return forwarded


class Pace:
    """When a chunk may ride a commit that requests wait on: while the commits chunks rode
    took under ``share`` of the time (a token bucket, drawn by each such commit's whole
    time: its statements take little, its sync of the rows' pages the most). A commit
    nobody waits on (the writer idle but for the rewrites) takes one whatever the pace:
    the rows are still rewritten at the disk's speed when the server has nothing else to do.
    """

    __slots__ = ("_at", "_credit", "share")

    def __init__(self, share: float = SHARE) -> None:
        self.share = share
        self._credit = SAVED
        self._at: float | None = None

    def due(self, now: float) -> bool:
        if self._at is not None:
            self._credit = min(SAVED, self._credit + (now - self._at) * self.share)
        self._at = now
        return self._credit > 0

    def spent(self, seconds: float) -> None:
        self._credit -= seconds


@dataclass(slots=True)
class Job:
    user: int
    erase: bool
    seqs: list[int]
    done: int = 0
    commits: int = 0
    longest: float = 0.0  # the writer's longest time on one of its chunks, in s


@dataclass(slots=True)
class Rewrite:
    """One commit's chunk: ``seqs`` of ``user`` flipped (purge) or deleted (erase); with
    ``last``, the user's rule goes too."""

    user: int
    erase: bool
    seqs: list[int]
    last: bool
    job: Job | None = None  # whose chunk this is
    paced: bool = False  # rides a commit requests wait on: its time counts (``Pace``)
    began: float = 0.0  # time.monotonic() as its commit began


@dataclass(frozen=True, slots=True)
class Rewritten:
    """What the writer found rewriting a chunk: an erase's keys it deleted (key, seq), and
    its time on it."""

    keys: list[tuple[str, int]]
    seconds: float


class Rewrites:
    def __init__(self, rules: dict[int, Rule], chunk: int = CHUNK) -> None:
        self.rules = rules  # by user_id
        self._chunk = chunk
        self._jobs: deque[Job] = deque()
        #: jobs queued per user, and rows still to rewrite: kept as jobs come and go, for
        #: a bench's clean-up queues 100,000 erases, and each chunk asks (``_only``)
        self._queued: dict[int, int] = {}
        self._pending = 0

    def _append(self, job: Job) -> None:
        self._jobs.append(job)
        self._queued[job.user] = self._queued.get(job.user, 0) + 1
        self._pending += len(job.seqs)

    def rule(self, user: int) -> Rule:
        return self.rules.get(user, NO_RULE)

    def pending(self) -> int:
        """Rows still to rewrite."""
        return self._pending

    def busy(self) -> bool:
        return bool(self._jobs)

    def took_effect(self, user: int, erase: bool, before_seq: int, seqs: list[int]) -> None:
        """A withdrawal committed, with its rule (``wider`` than the user's last) and the
        rows it covers (never none: a withdrawal of no row writes no rule)."""
        self.rules[user] = self.rule(user).wider(erase, before_seq)
        self._append(Job(user, erase, seqs))

    def resume(self, user: int, erase: bool, seqs: list[int]) -> None:
        """At boot: rows a rule still covers, found again (the rule itself was loaded)."""
        self._append(Job(user, erase, seqs))

    def chunk(self, withdrawing: set[int]) -> Rewrite | None:
        """The next commit's chunk. Its ``last`` deletes the rule, unless another job of
        the user waits, or ``withdrawing`` (users with a withdrawal in the same commit)
        holds the user: that one writes the rule anew."""
        if not self._jobs:
            return None
        job = self._jobs[0]
        seqs = job.seqs[job.done : job.done + self._chunk]
        ends = job.done + len(seqs) >= len(job.seqs)
        last = ends and job.user not in withdrawing and self._only(job)
        return Rewrite(job.user, job.erase, seqs, last, job=job)

    def drop(self, user: int) -> None:
        """Cluster mode: the user's partition is served by another node now, which rewrites
        what is left (it loads the rule as it takes the partition)."""
        self._jobs = deque(job for job in self._jobs if job.user != user)
        self._queued.pop(user, None)
        self._pending = sum(len(job.seqs) - job.done for job in self._jobs)
        self.rules.pop(user, None)

    def committed(self, rewrite: Rewrite, seconds: float = 0.0) -> Job | None:
        """The chunk is on disk, written in ``seconds``; returns its job if that is done."""
        job = rewrite.job
        if job is None or not self._jobs or self._jobs[0] is not job:
            return None  # dropped meanwhile (cluster mode: its partition went)
        job.done += len(rewrite.seqs)
        self._pending -= len(rewrite.seqs)
        job.commits += 1
        job.longest = max(job.longest, seconds)
        if job.done < len(job.seqs):
            return None
        self._jobs.popleft()
        if (left := self._queued[job.user] - 1) == 0:
            del self._queued[job.user]
        else:
            self._queued[job.user] = left
        if rewrite.last:
            self.rules.pop(job.user, None)
        elif not left:
            # its last chunk shared a commit with a withdrawal of the same user that found
            # no row: a chunk of none deletes the rule
            self._append(Job(job.user, job.erase, []))
        return job

    def _only(self, job: Job) -> bool:
        return self._queued[job.user] == 1
