"""Shared helpers for the morris benchmarks (stdlib only)."""
