#!/usr/bin/env bash
# Small writes through a FUSE mount, for comparing builds side by side:
# for each round and each binary given, a fresh `morris up` (4 servers,
# loopback) and 3 files each written with 50,000 write(2) calls of 100 B,
# then of 4 KiB, from one process (as root). Prints writes/s and MiB/s per
# file and the median per binary.
#
#   bench/small_writes.sh ROUNDS EXE [EXE...]      # ~40 s per binary and round
set -euo pipefail
ROUNDS=${1:?rounds}; shift
DIR=${DIR:-/var/tmp/morris-small-writes}
PORT=${PORT:-17890}
declare -A small big
for r in $(seq "$ROUNDS"); do
  for exe in "$@"; do
    rm -rf "$DIR"; mkdir -p "$DIR/mnt"
    "$exe" up --servers 4 --dir "$DIR/data" --mount "$DIR/mnt" --port "$PORT" > "$DIR/up.log" 2>&1 &
    up=$!
    for _ in $(seq 100); do mountpoint -q "$DIR/mnt" && break; sleep 0.2; done
    mountpoint -q "$DIR/mnt" || { echo "mount did not come up; see $DIR/up.log" >&2; kill "$up"; exit 1; }
    out=$(python3 - "$DIR/mnt" <<'PY'
import os, sys, time
d = sys.argv[1]
for i in range(3):
    for name, size in (("small", 100), ("big", 4096)):
        fd = os.open(os.path.join(d, f"{name}{i}"), os.O_WRONLY | os.O_CREAT, 0o644)
        buf = b"x" * size
        t = time.perf_counter()
        for _ in range(50000):
            os.write(fd, buf)
        dt = time.perf_counter() - t
        os.close(fd)
        print(name, f"{50000 / dt:.0f}" if size == 100 else f"{50000 * size / dt / 2**20:.1f}")
PY
)
    kill "$up"; wait "$up" 2>/dev/null || true
    mountpoint -q "$DIR/mnt" && umount "$DIR/mnt"
    s=$(echo "$out" | awk '$1=="small"{print $2}' | tr '\n' ' ')
    b=$(echo "$out" | awk '$1=="big"{print $2}' | tr '\n' ' ')
    echo "round $r $exe: 100 B writes/s: $s| 4 KiB MiB/s: $b"
    small[$exe]+="$s"; big[$exe]+="$b"
  done
done
for exe in "$@"; do
  med() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
  echo "median $exe: 100 B writes/s $(echo "${small[$exe]}" | med), 4 KiB MiB/s $(echo "${big[$exe]}" | med)"
done
rm -rf "$DIR"
