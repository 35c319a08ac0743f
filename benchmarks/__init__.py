"""Benchmarks that print tables (performance never lives in unit tests)."""
