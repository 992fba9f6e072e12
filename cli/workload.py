"""What ``tidal bench`` sends: the workloads, drawn from one seeded random stream, so
that every system raced against another gets the same requests.

A benchmark must never change what it did not create: its users are its own (ids from
``USER_BASE`` up), and so are its entities, communities and cohort (named ``bench...``).
It leaves and rejoins only its own users."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final, Literal

from tidal.protocol.partitions import partition

Workload = Literal[
    "signal", "batch", "batch_compact", "leave", "status", "mixed", "counts", "top",
    "top_window", "top_trend",
]  # fmt: skip
WORKLOADS: Final = (
    "signal", "batch", "batch_compact", "leave", "status", "mixed", "counts", "top",
    "top_window", "top_trend",
)  # fmt: skip
BATCHES: Final = ("batch", "batch_compact")  # batch_compact: signal_batch's compact ack
#: bench's users: ``USER_BASE`` + 0 .. users-1, far from the ids a product gives out
USER_BASE: Final = 1 << 48
#: its entities are ``bench:e0`` .., its communities ``bench:c0`` .. ``bench:c15``
NAMES: Final = "bench:"
COHORT: Final = "bench-de"  # {"country": "DE"}
#: methods whose users bench made: what its clean-up erases
MAKES: Final = ("signal", "signal_batch", "leave", "rejoin")
#: what the top workloads read: community bench:c0 (signals name bench:c{user % 16}), view
TOP_OPTIONS: Final = {"top": {}, "top_window": {"window": "24h"}, "top_trend": {"by": "trend"}}
COUNTRIES: Final = ("DE", "FR", "US", "JP")
#: requests by default; with the batch workloads, signals: 100,000 batches of 1,000
#: were 100 million signals, encoded for minutes before the clock started
REQUESTS: Final = 100_000
#: signals a run encodes before its clock starts, at most (about 60 bytes each)
SIGNALS_AT_MOST: Final = 10_000_000


def default_requests(workload: str, batch_size: int) -> int:
    return max(1, REQUESTS // batch_size) if workload in BATCHES else REQUESTS


def too_many(cfg: BenchConfig) -> str | None:
    """Why the run would not fit in memory, if it would not: every request is encoded
    before the clock starts."""
    signals = cfg.requests * (cfg.batch_size if cfg.workload in BATCHES else 1)
    if signals <= SIGNALS_AT_MOST:
        return None
    return (
        f"requests: {cfg.requests:,} requests of {cfg.workload} are {signals:,} signals,"
        f" all encoded before the clock starts; at most {SIGNALS_AT_MOST:,}"
    )


@dataclass(frozen=True, slots=True)
class BenchConfig:
    host: str = "127.0.0.1"
    port: int = 7411
    clients: int = 50
    pipeline: int = 1
    requests: int = REQUESTS
    workload: Workload = "signal"
    batch_size: int = 1_000
    users: int = 100_000
    left_fraction: float = 0.0
    entities: int = 1_000  # signals and counts pick entities e0 .. e{entities-1}
    token: str | None = None
    seed: int = 1
    #: drive Redis instead, with the SHA of ``bench/signal.lua`` loaded there (see ``resp``)
    redis_sha: str | None = None
    #: send the requests to tidal's HTTP edge on this port instead, as JSON (``httpwire``);
    #: the set-up and clean-up still go through ``port``
    http_port: int | None = None
    #: the server's process, when local: its CPU time over the run is reported
    server_pid: int | None = None
    #: cluster mode: draw only users of the partitions the target node serves
    own_users: bool = False
    #: ... those partitions, and how many the cluster has (read before the clock starts)
    only: tuple[frozenset[int], int] | None = None
    #: run beside other data (bench refuses a server that holds any, by default)
    allow_data: bool = False
    #: leave what the run made: by default its users' signals are erased, its users
    #: rejoined, and its cohort dropped if it defined it
    keep: bool = False


def requests(cfg: BenchConfig, rng: random.Random, count: int) -> list[list[Any]]:
    """Method and params of ``count`` requests of the workload, drawn from ``rng``."""

    def draw() -> int:
        user = USER_BASE + rng.randrange(cfg.users)
        if cfg.only is not None:
            parts, partitions = cfg.only
            while partition(user, partitions) not in parts:
                user = USER_BASE + rng.randrange(cfg.users)
        return user

    def signal_params() -> list[Any]:
        user = draw()
        context = {
            "communities": [f"{NAMES}c{user % 16}"],
            "attrs": {"country": COUNTRIES[user % len(COUNTRIES)]},
        }
        return [user, f"{NAMES}e{rng.randrange(cfg.entities)}", "view", 1.0, context]

    out: list[list[Any]] = []
    for _ in range(count):
        if cfg.workload == "signal":
            out.append(["signal", signal_params()])
        elif cfg.workload == "batch":
            out.append(["signal_batch", [[signal_params() for _ in range(cfg.batch_size)]]])
        elif cfg.workload == "batch_compact":
            items = [signal_params() for _ in range(cfg.batch_size)]
            out.append(["signal_batch", [items, {"ack": "compact"}]])
        elif cfg.workload == "status":
            out.append(["status", [draw()]])
        elif cfg.workload == "counts":
            out.append(["counts", [f"{NAMES}e{rng.randrange(cfg.entities)}"]])
        elif cfg.workload in TOP_OPTIONS:
            top = ["community", f"{NAMES}c0", "view", TOP_OPTIONS[cfg.workload]]
            out.append(["top", top])
        elif cfg.workload == "leave":
            out.append([rng.choice(("leave", "rejoin")), [draw()]])
        else:  # mixed: 95% signal, 4% status, 1% leave or rejoin
            roll = rng.random()
            if roll < 0.95:
                out.append(["signal", signal_params()])
            elif roll < 0.99:
                out.append(["status", [draw()]])
            else:
                out.append([rng.choice(("leave", "rejoin")), [draw()]])
    return out


def made(method: str, params: list[Any]) -> list[int]:
    """The users a request of the workload writes for: bench's own, for its clean-up."""
    if method == "signal_batch":
        return [item[0] for item in params[0]]
    return [params[0]] if method in MAKES else []
