"""Emulated multi-host cluster (network namespaces + shaped veth links) for morris benchmarks
and partition/server-loss tests. See hosts.py for the API and cli.py / README for the commands."""
from .hosts import Cluster, Host, ShapingError, cleanup_leftovers, parse_rate, drop_caches, is_mounted  # noqa: F401
