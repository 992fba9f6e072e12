"""Helpers for testing against tidal, shared by its own tests and benchmarks: a
throwaway PostgreSQL cluster (``postgres``)."""
