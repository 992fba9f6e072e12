"""tidal's limits on argument values: one place, read by the server's validation and the client."""

from typing import Final

USER_ID_MAX: Final = 2**64 - 1
ENTITY_MAX_BYTES: Final = 256
KIND_MAX_BYTES: Final = 64
NAME_MAX_BYTES: Final = 128  # community, cohort, attribute names
ATTR_VALUE_MAX_BYTES: Final = 256
MAX_COMMUNITIES: Final = 64
MAX_ATTRS: Final = 64
MAX_PREDICATE_VALUES: Final = 256  # values one attribute of a predicate may allow
MAX_PREDICATE_TERMS: Final = 1024  # values a predicate allows in all: each is indexed
#: aggregates one request may add to: each signal's communities and matched cohorts
MAX_FANOUT: Final = 250_000
#: attributes one request may carry in all: each is matched against every cohort
MAX_BATCH_ATTRS: Final = 50_000
#: a predicate, msgpack-encoded, at most this: every cohort is kept in memory and listed
MAX_PREDICATE_BYTES: Final = 64 * 1024
#: an aggregate (name, kind and tally) takes at most this in a ``counts`` reply, so a page
#: of ``limit`` of them fits a message of ``limit`` x this
SLOT_REPLY_BYTES: Final = 256
#: ``history`` and ``left_users`` pages: at most this many lines, and no more than fit
MAX_HISTORY: Final = 1_000
HISTORY_LINE_BYTES: Final = 64  # {"event", "at_ns", "signals"}
MAX_LEFT_USERS: Final = 10_000
LEFT_USER_BYTES: Final = 24  # [user_id, left_at_ns]

MAX_BATCH: Final = 10_000
MAX_COHORTS: Final = 1_000  # every forwarded signal is matched against each one
KEY_MAX_BYTES: Final = 64  # a signal's idempotency key, context "id"
#: |weight| at most this: a sum of 2**63 of them (more signals than seqs exist) stays
#: far below a float's overflow, so no aggregate can become inf, or NaN from inf - inf.
WEIGHT_MAX: Final = 1e12
#: what a reply takes besides its result (the envelope, and a margin)
REPLY_ENVELOPE: Final = 1024
#: the smallest ``--max-message-size`` that works: room for the largest single item a reply
#: carries (a cohort, its name and a predicate of MAX_PREDICATE_BYTES) or a request sends
MIN_MESSAGE_SIZE: Final = 2 * REPLY_ENVELOPE + MAX_PREDICATE_BYTES
#: ``--max-message-size``'s default
DEFAULT_MAX_MESSAGE_SIZE: Final = 8 * 1024 * 1024
#: a ``counts`` page's largest ``limit`` at that size (a server takes what its own fits)
COUNTS_LIMIT: Final = (DEFAULT_MAX_MESSAGE_SIZE - REPLY_ENVELOPE) // SLOT_REPLY_BYTES
#: a time or an id past this is no signed 64-bit integer, as storage keeps them
INT64_MAX: Final = 2**63 - 1
#: the change feed's events, by name (``subscribe``'s ``events`` option)
FEED_EVENTS: Final = ("leave", "rejoin", "purge", "erase", "define_cohort", "drop_cohort")
#: a subscriber with this many events, or bytes, written to it and still unsent is told
#: ``lagging`` and closed: a reader that does not keep up never holds up writers or memory
FEED_MAX_QUEUED_EVENTS: Final = 10_000
FEED_MAX_QUEUED_BYTES: Final = 8 * 1024 * 1024
