"""Small helpers shared by the benchmark scripts."""

import os
import socket
import subprocess


def parse_size(s):
    """'64M' / '1G' / '4KiB' / '65536' -> bytes."""
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches():
    """Writes dirty pages back, then drops the page cache (needs root)."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def is_mounted(path):
    """True if `path` is a mount point of this mount namespace."""
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)
