#!/usr/bin/env bash
# How long `morris scrub` takes on a mirrored volume, builds side by side:
# for each binary given, 4 servers on loopback formatted with --replicas 2,
# FILES files of 256 MiB of random data written through a mount, then
# ROUNDS scrubs at an unlimited rate (the page cache is warm: this times
# the CPU a pass costs — checksums and, from protocol 19, the comparison
# of copies — not the disk).
#
#   bench/scrub.sh ROUNDS EXE [EXE...]     # FILES=16 (4 GiB, 8 GiB with copies): ~1 min per binary
set -euo pipefail
ROUNDS=${1:?rounds}; shift
FILES=${FILES:-16}
BASE=${BASE:-/var/tmp/morris-scrub-bench}
PORT=${PORT:-23500}
for exe in "$@"; do
    rm -rf "$BASE"; mkdir -p "$BASE/mnt"
    "$exe" key new "$BASE/keys" >/dev/null
    pids=(); addrs=""
    for i in 0 1 2 3; do
        "$exe" server --key "$BASE/keys/volume.key" --data "$BASE/s$i" \
            --listen "127.0.0.1:$((PORT + i))" >"$BASE/s$i.log" 2>&1 &
        pids+=($!); addrs="$addrs,127.0.0.1:$((PORT + i))"
    done
    sleep 1
    "$exe" format --key "$BASE/keys/volume.key" --replicas 2 --servers "${addrs#,}" >/dev/null
    "$exe" mount --key "$BASE/keys/client.key" "127.0.0.1:$PORT" "$BASE/mnt" >"$BASE/mount.log" 2>&1 &
    mp=$!
    for _ in $(seq 100); do mountpoint -q "$BASE/mnt" && break; sleep 0.1; done
    for f in $(seq "$FILES"); do head -c 256M /dev/urandom > "$BASE/mnt/f$f"; done
    sync
    fusermount3 -u "$BASE/mnt"; wait "$mp" || true
    for r in $(seq "$ROUNDS"); do
        s=$(date +%s.%N)
        "$exe" scrub --key "$BASE/keys/volume.key" "127.0.0.1:$PORT" --rate 64G > "$BASE/scrub.out" 2>&1 || true
        e=$(date +%s.%N)
        # The servers' own times (the command polls every 0.5 s): the
        # longest pass, from its log's "started" to "finished".
        pass=$(for i in 0 1 2 3; do
            grep -a "scrub pass \(started\|finished\)" "$BASE/s$i.log" | tail -2 |
                awk '{ split($1, t, "T"); split(t[2], h, ":"); sub("Z", "", h[3]);
                       x = h[1] * 3600 + h[2] * 60 + h[3]; if (NR == 1) a = x; else print x - a }'
        done | sort -n | tail -1)
        echo "$exe round $r: longest server pass ${pass} s, command $(echo "$e - $s" | bc) s; $(tail -1 "$BASE/scrub.out")"
    done
    kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
    rm -rf "$BASE"
done
