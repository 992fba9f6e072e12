"""The clients' methods, declared once (``Commands``) for every face: each is a plan
(``plans``), which an asyncio face drives with ``await`` and a blocking face with
plain calls. A face only says how one call is sent (``_send``): to its server, or in
cluster mode to the node that serves the call's user."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from . import group_plans, plans
from .closing import AsyncClosing, Closing
from .plans import Options, Plan
from .requests import Call

P = ParamSpec("P")
T = TypeVar("T")


class AsyncFace(AsyncClosing):
    """A face whose methods are coroutines (and ``async with`` closes it)."""

    options: Options

    async def _send(self, call: Call) -> Any:
        raise NotImplementedError

    async def run(self, plan: Plan[T]) -> T:
        """Drive ``plan`` to its result, sending each call it yields."""
        try:
            call = next(plan)
            while True:
                call = plan.send(await self._send(call))
        except StopIteration as done:
            result: T = done.value
            return result


class SyncFace(Closing):
    """A face whose methods block (and ``with`` closes it)."""

    options: Options

    def _send(self, call: Call) -> Any:
        raise NotImplementedError

    def run(self, plan: Plan[T]) -> T:
        try:
            call = next(plan)
            while True:
                call = plan.send(self._send(call))
        except StopIteration as done:
            result: T = done.value
            return result


class command(Generic[P, T]):
    """One method for every face: on an ``AsyncFace`` it returns an awaitable of the
    plan's result, on a ``SyncFace`` the result itself, with the plan's parameters."""

    def __init__(self, plan: Callable[Concatenate[Options, P], Plan[T]]) -> None:
        self.plan = plan
        self.__doc__ = plan.__doc__
        whole = inspect.signature(plan)  # as help() shows it: without the face's options
        self.signature = whole.replace(parameters=list(whole.parameters.values())[1:])

    @overload
    def __get__(self, face: None, owner: type) -> command[P, T]: ...

    @overload
    def __get__(self, face: AsyncFace, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, face: SyncFace, owner: type) -> Callable[P, T]: ...

    def __get__(self, face: AsyncFace | SyncFace | None, owner: type) -> Any:
        if face is None:
            return self
        plan = self.plan

        @functools.wraps(plan)
        def bound(*args: P.args, **kwargs: P.kwargs) -> Any:
            return face.run(plan(face.options, *args, **kwargs))

        del bound.__wrapped__
        bound.__signature__ = self.signature  # type: ignore[attr-defined]
        return bound


class Commands:
    """Every method of the clients (docs/PROTOCOL.md says what each does on the server)."""

    ping = command(plans.ping)
    signal = command(plans.signal)
    signal_batch = command(plans.signal_batch)
    leave = command(plans.leave)
    rejoin = command(plans.rejoin)
    purge = command(plans.purge)
    erase = command(plans.erase)
    history = command(plans.history)
    left_users = command(plans.left_users)
    count_left = command(plans.count_left)
    catalog = command(plans.catalog)
    status = command(plans.status)
    define_cohort = command(plans.define_cohort)
    drop_cohort = command(plans.drop_cohort)
    cohorts = command(plans.cohorts)
    counts = command(plans.counts)
    top = command(plans.top)
    stats = command(plans.stats)
    health = command(plans.health)
    partition_map = command(plans.partition_map)
    group_create = command(group_plans.group_create)
    group_drop = command(group_plans.group_drop)
    group_reset = command(group_plans.group_reset)
    groups = command(group_plans.groups)
    dead_letters = command(group_plans.dead_letters)
    redeliver = command(group_plans.redeliver)
    receipt = command(group_plans.receipt)
    unconfirmed = command(group_plans.unconfirmed)
