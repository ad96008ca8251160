#!/usr/bin/env bash
# A cache miss from a local-directory home, without any link in between:
# what the servers' own fetch path costs (issue 14). Root (drops caches).
#
#   bench/local_miss.sh [MORRIS_EXE] [RUNS]      # ~20 s a run
#
# Starts `morris up` with 4 servers bound to a home holding one 500 MiB
# random file (made once in $DIR/home), drops the page caches, reads the
# file once through the mount with 1 MiB reads, prints MiB/s, tears down.
set -euo pipefail
EXE=${1:-$(dirname "$0")/../target/release/morris}
RUNS=${2:-2}
DIR=${DIR:-/var/tmp/morris-local-miss}
PORT=${PORT:-17960}
mkdir -p "$DIR/home"
[ -f "$DIR/home/big" ] || head -c 500M /dev/urandom > "$DIR/home/big"
for _ in $(seq "$RUNS"); do
    rm -rf "$DIR/data"; mkdir -p "$DIR/mnt"
    "$EXE" up --servers 4 --dir "$DIR/data" --mount "$DIR/mnt" --port "$PORT" \
        --home "file://$DIR/home" > "$DIR/up.log" 2>&1 &
    up=$!
    for _ in $(seq 100); do mountpoint -q "$DIR/mnt" && break; sleep 0.2; done
    mountpoint -q "$DIR/mnt" || { echo "mount did not come up; see $DIR/up.log" >&2; kill "$up"; exit 1; }
    sync; echo 3 > /proc/sys/vm/drop_caches
    python3 - "$DIR/mnt/big" <<'PY'
import sys, time
t = time.perf_counter(); n = 0
with open(sys.argv[1], 'rb') as f:
    while b := f.read(1 << 20):
        n += len(b)
print(f"miss {n / (time.perf_counter() - t) / 2**20:.0f} MiB/s ({n} bytes)")
PY
    "$EXE" umount "$DIR/mnt" || true
    kill "$up" 2>/dev/null || true
    wait "$up" 2>/dev/null || true
done
