"""The sans-I/O core: no asyncio, no sockets, no files, no database.

The rules for every parameter, the ledger row and what a signal counts toward,
the aggregates, cohorts, leave state, idempotency keys and a user's past, and
the batch they all record their changes in. Everything here is plain data and
functions over it, tested without a server and run unchanged by the engine.
"""
