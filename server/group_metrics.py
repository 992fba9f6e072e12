"""The consumer groups' metrics, one series per group: lag, pending, the age of the oldest
event out unacknowledged, redeliveries, dead letters, events lost to retention, and the
opt-outs each holds unacknowledged past an hour."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class Figures(NamedTuple):
    """A group's figures (``engine.group_figures`` makes them)."""

    group: str
    lag_events: int
    lag_s: float  # the age of the oldest event it has not settled
    pending: int
    oldest_unacked_s: float
    redelivered: int
    dead_letters: int
    unconfirmed: int  # opt-outs it holds unacknowledged for over an hour
    lost: int


class Groups(Protocol):
    def figures(self) -> Sequence[Figures]: ...


def group_metrics(engine_groups: Groups | None) -> Iterator[Metric]:
    groups = engine_groups.figures() if engine_groups is not None else []
    gauges = {
        "lag_events": ("tidal_group_lag_events", "Events past the group's cursor."),
        "lag_s": (
            "tidal_group_lag_seconds",
            "Seconds since the oldest event the group has not settled was written.",
        ),
        "pending": ("tidal_group_pending", "Events out to consumers, unacknowledged."),
        "oldest_unacked_s": (
            "tidal_group_oldest_unacked_seconds",
            "Seconds since the oldest event out unacknowledged was first sent.",
        ),
        "dead_letters": ("tidal_group_dead_letters", "The group's dead letters now."),
        "unconfirmed": (
            "tidal_group_optouts_unconfirmed",
            "Opt-outs (leave, purge, erase) the group has not acknowledged for over an hour.",
        ),
    }
    for field, (name, doc) in gauges.items():
        gauge = GaugeMetricFamily(name, doc, labels=["group"])
        for g in groups:
            gauge.add_metric([g.group], getattr(g, field))
        yield gauge
    counters = {
        "redelivered": ("tidal_group_redeliveries", "Events sent again since boot."),
        "lost": ("tidal_group_lost_events", "Events retention deleted before the group read them."),
    }
    for field, (name, doc) in counters.items():
        counter = CounterMetricFamily(name, doc, labels=["group"])
        for g in groups:
            counter.add_metric([g.group], getattr(g, field))
        yield counter
