"""What the host gives this process: its memory, as the kernel will enforce it; how the
collector is set for what boot loads; the system's words for what it refused.

A container's limit is its cgroup's, not the machine's: a server sized by
``/proc/meminfo`` alone would plan for 24 GiB in a pod allowed 512 MiB, and meet
the OOM killer long before its budget. So the smaller of the two counts.
"""

from __future__ import annotations

import gc
import os
import re
import socket
from pathlib import Path
from typing import Final

#: ASCII digits: ``\d`` takes any script's (Arabic-Indic 512 would be taken as 512M)
_SIZE: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(%|[kmgt]?)(?:i?b)?\s*", re.IGNORECASE)
#: a budget past this is a mistake, not a machine: 1 PiB
MAX_SIZE: Final = 2**50
_UNIT: Final = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
#: cgroup v2 (the process's own group, as mounted in a container), then v1
_LIMITS: Final = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def parse_size(text: str) -> tuple[float, bool]:
    """``512M``, ``2G``, ``1.5GiB``, ``100000`` (bytes) or ``60%`` (of ``memory()``):
    the number, and whether it is a share."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"must be a size such as 512M, 2G or 60% (of memory), got {text[:100]!r}")
    number = float(match[1])
    if match[2] == "%":
        if not 0 < number <= 100:
            raise ValueError(f"a share of memory must be in (0, 100]%, got {text!r}")
        return number, True
    size = number * _UNIT[match[2].lower()]
    if not size <= MAX_SIZE:
        raise ValueError(f"must be at most 1P (2**50 bytes), got {text[:100]!r}")
    return size, False


def memory() -> int:
    """Bytes this process may use: the machine's memory, or its cgroup's limit if lower
    (0 where neither can be read)."""
    total = 0
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:  # not Linux: a share of memory is then no budget at all
        lines = []
    for line in lines:
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    for limit in _LIMITS:
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < (total or 2**62):
            total = int(text)
    return total


def budget_bytes(text: str) -> int:
    """``--memory-budget`` in bytes; 0: no budget."""
    number, share = parse_size(text)
    if not share:
        return int(number)
    return int(memory() * number / 100)


def why(exc: OSError) -> str:
    """The system's words for an errno ("Address already in use"), not asyncio's wrapping."""
    if isinstance(exc, socket.gaierror) or not exc.errno:
        return str(exc.strerror or exc)
    return os.strerror(exc.errno)


def settle_gc() -> None:
    """What boot loaded lives as long as the server: out of the collector's sight, it is
    not walked again and again. Requests make many short-lived containers, nearly all
    freed by reference counting, so the young generation is collected less often
    (measured: 5-10% of the CPU per signal, and a shorter tail). A batch of 1,000 signals
    holds about 5,000 containers until its commit: at 20,000 the collector walked them
    again and again (7% of a batch's CPU); at 400,000, 10-15% less CPU per signal."""
    gc.freeze()
    gc.set_threshold(400_000, 50, 1000)
