"""tidal's limits on argument values: one place, read by the server's validation and the client."""

from typing import Final

USER_ID_MAX: Final = 2**64 - 1
ENTITY_MAX_BYTES: Final = 256
KIND_MAX_BYTES: Final = 64
NAME_MAX_BYTES: Final = 128  # community, cohort, attribute names
ATTR_VALUE_MAX_BYTES: Final = 256
MAX_COMMUNITIES: Final = 64
MAX_ATTRS: Final = 64
MAX_PREDICATE_VALUES: Final = 256
MAX_BATCH: Final = 10_000
MAX_COHORTS: Final = 1_000  # every forwarded signal is matched against each one
KEY_MAX_BYTES: Final = 64  # a signal's idempotency key, context "id"
#: |weight| at most this: a sum of 2**63 of them (more signals than seqs exist) stays
#: far below a float's overflow, so no aggregate can become inf, or NaN from inf - inf.
WEIGHT_MAX: Final = 1e12
