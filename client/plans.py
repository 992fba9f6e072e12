"""Every method of the clients, written once, sans-I/O: a plan is a generator that yields
the calls to send (``requests.Call``) and is sent each one's raw result, and returns the
typed result. The faces (``Client``, ``SyncClient``, the cluster ones) drive plans with
their own transport (``faces``): a method is never written twice."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from . import requests
from .requests import Call
from .types import (
    Catalog,
    Counts,
    Event,
    LeftUsers,
    Membership,
    Scalar,
    Signal,
    SignalAck,
    Top,
    Withdrawn,
)

T = TypeVar("T")
Plan: TypeAlias = Generator[Call, Any, T]


@dataclass(frozen=True, slots=True)
class Options:
    """What a face was made with that its plans read."""

    #: a signal without a key gets one, so that a resend after a lost reply counts once
    auto_keys: bool = False


def _one(call: Call) -> Plan[Any]:
    result = yield call
    return result


def ping(o: Options) -> Plan[str]:
    result: str = yield from _one(requests.read("ping"))
    return result


def signal(
    o: Options,
    user_id: int,
    entity: str,
    kind: str,
    weight: float = 1.0,
    *,
    communities: Iterable[str] | None = None,
    attrs: Mapping[str, Scalar] | None = None,
    key: str | None = None,
    at_ns: int | None = None,
) -> Plan[SignalAck]:
    """``key`` (1..64 bytes) makes the signal idempotent: a repeat within the server's
    window gets the first acknowledgement and is counted once."""
    key = requests.key_for(key, o.auto_keys)
    call = requests.signal(user_id, entity, kind, weight, communities, attrs, key, at_ns)
    return SignalAck.from_wire((yield call))


def signal_batch(o: Options, signals: Iterable[Signal]) -> Plan[list[SignalAck]]:
    """All committed together, or none (a cluster splits it by node: each part one
    unit there, ``PartlyApplied`` if a part failed after another was acknowledged)."""
    call = requests.signal_batch(signals, o.auto_keys)
    result = yield call
    if isinstance(result, list):  # a cluster face's, split by node: acknowledged already
        return result
    return SignalAck.from_compact(result, len(call.params[0]))


def leave(o: Options, user_id: int, *, purge: bool = False) -> Plan[Membership]:
    """With ``purge``, the user's past leaves the cohorts and communities in the same
    step: no read sees them Left with it still counted (``purge`` says how much went)."""
    return Membership.from_wire((yield requests.leave(user_id, purge)))


def rejoin(o: Options, user_id: int) -> Plan[Membership]:
    return Membership.from_wire((yield requests.of_user("rejoin", user_id)))


def purge(o: Options, user_id: int) -> Plan[Withdrawn]:
    """Withdraw the user's signals so far from every cohort and community (the ledger
    keeps counting them); their status does not change."""
    return Withdrawn.from_wire((yield requests.of_user("purge", user_id)))


def erase(o: Options, user_id: int) -> Plan[Withdrawn]:
    """Delete the user's ledger rows and all they added, forget their idempotency
    keys, and leave them Left, so that a stale client's later signals are gated."""
    return Withdrawn.from_wire((yield requests.of_user("erase", user_id)))


def history(o: Options, user_id: int, limit: int = 100, after_ns: int = 0) -> Plan[list[Event]]:
    """The user's leaves, rejoins, purges and erasures after ``after_ns``, oldest first."""
    lines = yield requests.history(user_id, limit, after_ns)
    return [Event.from_wire(line) for line in lines]


def left_users(o: Options, after: int | None = None, limit: int = 1000) -> Plan[LeftUsers]:
    """One page of Left users in user_id order, past ``after``."""
    return LeftUsers.from_wire((yield requests.left_users(after, limit)))


def catalog(
    o: Options, layer: str = "community", after: str | None = None, limit: int = 100
) -> Plan[Catalog]:
    """A page of what is stored in a layer, in name order: the ledger's kinds ("ledger"),
    the cohorts ("cohort") or the communities ("community"), each with its aggregates and
    the signals they count; ``after``: the page before's ``next``."""
    page: dict[str, Any] = {"limit": limit}
    if after is not None:
        page["after"] = after
    return Catalog.from_wire((yield requests.read("catalog", layer, page)))


def count_left(o: Options) -> Plan[int]:
    """How many users are Left: every user's (every node's, in a cluster), as committed."""
    return int((yield requests.read("count_left")))


def status(o: Options, user_id: int) -> Plan[Membership]:
    return Membership.from_wire((yield requests.status(user_id)))


def define_cohort(o: Options, name: str, predicate: dict[str, Any]) -> Plan[bool]:
    return bool((yield Call("define_cohort", [name, predicate])))


def drop_cohort(o: Options, name: str) -> Plan[bool]:
    return bool((yield Call("drop_cohort", [name])))


def cohorts(o: Options) -> Plan[dict[str, dict[str, Any]]]:
    """Every cohort, read in pages that each fit a message."""
    return (yield from _pages("cohorts", None, requests.read("cohorts", {})))


def counts(o: Options, entity: str, window: str | None = None) -> Plan[Counts]:
    """An entity's aggregates, all of them: a busy entity's are read in pages. With
    ``window`` ("1h", "24h" or "1d", "7d", "30d"), only signals whose event time is in it."""
    page = None if window is None else {"window": window}
    return Counts.from_wire(
        (yield from _pages("counts", entity, requests.counts(entity, window), page))
    )


def top(
    o: Options,
    layer: str,
    name: str | None,
    kind: str,
    *,
    by: str = "count",
    window: str | None = None,
    half_life: str | None = None,
    limit: int = 10,
    after: bytes | None = None,
) -> Plan[Top]:
    """The ``limit`` entities with the highest score in one layer ("ledger", "cohort",
    "community"; ``name`` the cohort's or community's, None for the ledger): by
    "count", "weight" or "trend" (decayed by ``half_life``). More than one page's worth
    is read a page at a time; ``after`` reads on from a ``next``."""
    options = {"by": by, "window": window, "half_life": half_life, "after": after}
    pages = requests.TopPages(layer, name, kind, options, limit)
    call: Call | None = pages.call()
    while call is not None:
        call = pages.took((yield call))
    return Top.from_wire(pages.entities, pages.next, pages.as_of_ns)


def _pages(
    method: str, first: Any, call: Call | None, page: dict[str, Any] | None = None
) -> Plan[dict[str, Any]]:
    into: dict[str, Any] = {}
    while call is not None:
        call = requests.next_page(method, first, (yield call), into, page)
    return into


def stats(o: Options) -> Plan[dict[str, Any]]:
    result: dict[str, Any] = yield from _one(requests.read("stats"))
    return result


def health(o: Options) -> Plan[dict[str, Any]]:
    """``{"status": "ok" | "starting" | "standby" | "failing", "storage": ..., ...}``"""
    result: dict[str, Any] = yield from _one(requests.read("health"))
    return result


def partition_map(o: Options) -> Plan[dict[str, Any]]:
    """Which node serves each partition (cluster mode; one tidal: itself, every user)."""
    result: dict[str, Any] = yield from _one(requests.read("partition_map"))
    return result
