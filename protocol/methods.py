"""The names of tidal's methods, in one place for whatever must know them without the
server's dispatch table (metrics label only these; issue 41 declares each fully)."""

from __future__ import annotations

from typing import Final

METHODS: Final = frozenset(
    {
        "auth", "ping", "signal", "signal_batch", "partition_map", "leave", "rejoin", "purge",
        "erase", "define_cohort", "drop_cohort", "subscribe", "unsubscribe", "status",
        "cohorts", "counts", "stats", "health", "history", "top", "left_users",
    }
)  # fmt: skip
