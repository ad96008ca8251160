#!/usr/bin/env python3
"""The tightest small-file loop: create a file, write SIZE bytes, close; N times.

Prints files/s. For profiles (perf record around it) and quick A/B runs of
two mounts; bench/small_writes.py and bench/create_cost.py are the
benchmarks with a local-disk reference.

Usage: python3 bench/small_file_loop.py DIR N [SIZE]     (SIZE default 4096; 0: empty files)
"""

import os
import sys
import time


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    d, n = sys.argv[1], int(sys.argv[2])
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    data = b"x" * size
    os.makedirs(d, exist_ok=True)
    t = time.perf_counter()
    for i in range(n):
        fd = os.open(os.path.join(d, f"w{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        if data:
            os.write(fd, data)
        os.close(fd)
    e = time.perf_counter() - t
    print(f"{n / e:.0f} files/s")


if __name__ == "__main__":
    main()
