"""Cluster mode: a request to define or drop a cohort, with its answer (``cohorts``)."""

from __future__ import annotations

from tidal.protocol.refusals import InvalidParams

from .feed import Change
from .params import Predicate
from .replies import Later


class CohortAsk(Later):
    """Cluster mode: a define (``predicate``) or drop (None) of a cohort, and its answer,
    sent once its batch commits: decided as the request is read, and again each time
    another change reaches the cohorts before that batch commits (``rematch``)."""

    __slots__ = ("changes", "event", "name", "predicate", "refusal", "result")
    is_read = False

    def __init__(self, name: str, predicate: Predicate | None, event: Change) -> None:
        self.name = name
        self.predicate = predicate
        self.event = event  # its change feed event, in the batch while it changes something
        self.changes = False
        self.result = False
        self.refusal: str | None = None  # decided again, it could not be (too many cohorts)

    def answer(self) -> bool:
        if self.refusal is not None:
            raise InvalidParams(self.refusal)
        return self.result
