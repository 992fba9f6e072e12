"""A history in Jepsen's sense: every operation with its invocation and its completion.

An operation completes ``ok`` (with the server's reply), ``fail`` (an error reply: the
server says nothing of it was saved) or ``unknown`` (the connection died first: it may or
may not have taken effect). Times are ``time.monotonic()`` in this process, so an
operation that completed before another was invoked really did come first.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["ok", "fail", "unknown", "pending"]
INFINITY = float("inf")


@dataclass(eq=False)
class Op:
    index: int
    client: int
    method: str
    params: list[Any]
    user: int | None
    invoked: float
    completed: float = INFINITY  # unknown and pending never complete
    outcome: Outcome = "pending"
    reply: Any = None
    bound: float = INFINITY  # unknown: when the server that had it died (its effect came before)
    #: cluster mode: the node its last try went to, and when (``sent``); a try goes again
    #: only if the one before was not sent, so the last is the only one that may count
    node: str | None = None
    sent_at: float = INFINITY
    #: refused, but what it wrote as it was read is kept: a leave with purge's leave, an
    #: erase's leave of an Active user (the refusal says so)
    partial: bool = False

    def sent(self, node: str) -> None:
        """Cluster mode: a try sent to ``node`` (the tries before it sent nothing, so a
        death that bounded them does not bound this one)."""
        self.node, self.sent_at, self.bound = node, time.monotonic(), INFINITY

    @property
    def left(self) -> bool | None:
        """As ``took_effect``, for what it did to the user's membership."""
        return True if self.partial else self.took_effect

    @property
    def end(self) -> float:
        """By when its effect, if any, had happened."""
        return self.completed if self.outcome in ("ok", "fail") else self.bound

    @property
    def took_effect(self) -> bool | None:
        """True if acknowledged, False if refused, None if it may have taken effect."""
        return {"ok": True, "fail": False}.get(self.outcome)

    def before(self, other: Op) -> bool:
        """This one's effect, if any, came before ``other`` was sent."""
        return self.end < other.invoked

    def describe(self) -> str:
        params = repr(self.params)
        params = params if len(params) < 200 else params[:200] + "..."
        reply = repr(self.reply)  # an error's words in full: they say what was saved
        reply = reply if self.outcome == "fail" or len(reply) < 160 else reply[:160] + "..."
        return (
            f"#{self.index} c{self.client} {self.method}{params} [{self.invoked:.3f}"
            f"..{self.completed:.3f}] {self.outcome} {reply}"
        )


#: the operation a task is sending: cluster mode's client records each try in it (``Op.sent``)
SENDING: ContextVar[Op | None] = ContextVar("SENDING", default=None)


@dataclass
class Fault:
    at: float
    what: str


@dataclass
class History:
    seed: int
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    #: each user's operations less its signals (leaves, rejoins, purges, erasures): what the
    #: checker asks of every signal, kept apart so that a check costs the history's length,
    #: not its square
    changes: dict[int, list[Op]] = field(default_factory=lambda: defaultdict(list))
    #: anomalies seen as they happened (a read out of its connection's order), with when
    observed: list[tuple[float, str]] = field(default_factory=list)

    def invoke(self, client: int, method: str, params: list[Any], user: int | None) -> Op:
        op = Op(len(self.ops), client, method, params, user, time.monotonic())
        self.ops.append(op)
        if user is not None and method not in ("signal", "signal_batch"):
            self.changes[user].append(op)
        return op

    @staticmethod
    def complete(op: Op, outcome: Outcome, reply: Any = None) -> None:
        op.completed = time.monotonic() if outcome in ("ok", "fail") else INFINITY
        op.outcome, op.reply = outcome, reply

    def fault(self, what: str) -> None:
        self.faults.append(Fault(time.monotonic(), what))
        print(f"{self.faults[-1].at:.3f} fault: {what}", flush=True)  # shown with -s

    def died(self, at: float, node: str | None = None) -> None:
        """The server died at ``at``: what it had not answered took effect before, or never.
        Cluster mode: the ``node`` that died, and only what was last sent to it before;
        an operation in flight elsewhere, or tried again elsewhere, may take effect later."""
        for op in self.ops:
            if op.outcome not in ("pending", "unknown"):
                continue
            went = op.invoked < at if node is None else op.node == node and op.sent_at < at
            if went:
                op.bound = min(op.bound, at)

    def of(self, *methods: str) -> Iterator[Op]:
        return (op for op in self.ops if op.method in methods)

    def around(self, at: float, span: int = 12) -> str:
        """The operations and faults nearest ``at``: the shortest story of an anomaly."""
        nearest = sorted(self.ops, key=lambda op: abs(op.invoked - at))[:span]
        lines = [op.describe() for op in sorted(nearest, key=lambda op: op.index)]
        lines += [f"fault {f.what} at {f.at:.3f}" for f in self.faults if abs(f.at - at) < 5]
        return "\n  ".join(lines)
