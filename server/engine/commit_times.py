"""How long commits take: each observed once, for the metrics' histogram (when on) and
for ``stats`` (``commit_p50_ms``, ``commit_p99_ms``), which a console without Prometheus
reads: the last ``KEPT`` commits that wrote, their quantiles worked out when asked."""

from __future__ import annotations

from collections import deque
from typing import Final

from tidal.server.metrics import Metrics

#: commits whose times ``stats`` reports quantiles of
KEPT: Final = 1024


class CommitTimes:
    def __init__(self, metrics: Metrics | None) -> None:
        self._metrics = metrics
        self._recent: deque[float] = deque(maxlen=KEPT)

    def observe(self, seconds: float, writes: int) -> None:
        """A commit that wrote ``writes`` rows took ``seconds``."""
        self._recent.append(seconds)
        if self._metrics is not None:
            self._metrics.commit_seconds.observe(seconds)
            self._metrics.batch_size.observe(writes)

    def quantile(self, q: float) -> float | None:
        """Seconds, of the last commits; None before the first."""
        if not self._recent:
            return None
        ordered = sorted(self._recent)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
