#!/usr/bin/env bash
# `cp` of one big file inside a mount (coreutils' cp uses copy_file_range
# first), for comparing builds side by side with the local disk: for each
# round and each binary given, a fresh `morris up` (4 servers, loopback),
# one SIZE file written into it, then `cp` of it to a new name, timed with
# the `sync` after it; and the same cp on the local disk ($DIR). Prints
# MiB/s per copy and the medians.
#
#   bench/copy.sh ROUNDS EXE [EXE...]          # SIZE=1G: ~30 s per binary and round
set -euo pipefail
ROUNDS=${1:?rounds}; shift
DIR=${DIR:-/var/tmp/morris-copy}
PORT=${PORT:-17870}
SIZE=${SIZE:-1G}
rm -rf "$DIR"; mkdir -p "$DIR"
head -c "$SIZE" /dev/urandom > "$DIR/src"
bytes=$(stat -c %s "$DIR/src")
declare -A res
# MiB/s of `cp $1 $2; sync`.
timed_cp() {
  local t0 t1
  t0=$(date +%s.%N)
  cp "$1" "$2"; sync
  t1=$(date +%s.%N)
  echo "$bytes $t0 $t1" | awk '{printf "%.0f", $1 / ($3 - $2) / 1048576}'
}
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
for r in $(seq "$ROUNDS"); do
  for exe in "$@"; do
    rm -rf "$DIR/vol"; mkdir -p "$DIR/vol/mnt"
    "$exe" up --servers 4 --dir "$DIR/vol/data" --mount "$DIR/vol/mnt" --port "$PORT" > "$DIR/up.log" 2>&1 &
    up=$!
    for _ in $(seq 100); do mountpoint -q "$DIR/vol/mnt" && break; sleep 0.2; done
    mountpoint -q "$DIR/vol/mnt" || { echo "mount did not come up; see $DIR/up.log" >&2; kill "$up"; exit 1; }
    cp "$DIR/src" "$DIR/vol/mnt/src"; sync
    m=$(timed_cp "$DIR/vol/mnt/src" "$DIR/vol/mnt/dst")
    cmp -s "$DIR/src" "$DIR/vol/mnt/dst" || { echo "copy differs ($exe)" >&2; kill "$up"; exit 1; }
    kill "$up"; wait "$up" 2>/dev/null || true
    mountpoint -q "$DIR/vol/mnt" && umount "$DIR/vol/mnt"
    res[$exe]+="$m "
    echo "round $r $exe: cp inside the mount $m MiB/s"
  done
  rm -f "$DIR/local-dst"
  l=$(timed_cp "$DIR/src" "$DIR/local-dst")
  res[local]+="$l "
  echo "round $r local disk: cp $l MiB/s"
done
echo "medians (MiB/s, $SIZE, $ROUNDS rounds):"
for k in "$@" local; do echo "  $k: $(echo "${res[$k]}" | median)"; done
rm -rf "$DIR"
