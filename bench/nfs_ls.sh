#!/usr/bin/env bash
# READDIRPLUS of a 10,000-file directory through `morris nfs`: libnfs's
# `nfs-ls` (one READDIRPLUS per ~50 entries) timed, for each build given,
# on a cached directory (a 4-server `morris up --home file://...` of N
# empty files, listed once through the mount first, so its names are
# placeholders) and on a plain one (N empty files made through the mount).
# Per build and kind: the first listing, then three more. Builds take
# turns, ROUNDS times. Everything started is stopped and unmounted.
#
#   bench/nfs_ls.sh target/release/morris /work/bin/morris-old
#
# Environment: N (10000), ROUNDS (2), PORT (7950), NFS_PORT (2070),
# WORK (/var/tmp/nfs-ls). Needs root (FUSE), fuse3, libnfs-utils.
set -euo pipefail
N=${N:-10000}
ROUNDS=${ROUNDS:-2}
PORT=${PORT:-7950}
NFS_PORT=${NFS_PORT:-2070}
WORK=${WORK:-/var/tmp/nfs-ls}
[ $# -ge 1 ] || { echo "usage: $0 MORRIS_EXE..." >&2; exit 2; }
mkdir -p "$WORK/home/d" "$WORK/mnt"
if [ "$(ls "$WORK/home/d" | wc -l)" != "$N" ]; then
    rm -rf "$WORK/home/d"; mkdir -p "$WORK/home/d"
    python3 -c "import sys
for i in range($N): open(f'$WORK/home/d/file-{i:06d}.dat', 'w').close()"
fi
UP=""; NFS=""
stop() {
    [ -n "$NFS" ] && kill "$NFS" 2>/dev/null && wait "$NFS" 2>/dev/null || true
    [ -n "$UP" ] && kill -INT "$UP" 2>/dev/null && wait "$UP" 2>/dev/null || true
    mountpoint -q "$WORK/mnt" && umount -l "$WORK/mnt" || true
    UP=""; NFS=""
}
trap stop EXIT
secs() { python3 -c 'import sys,time; print(f"{time.time():.4f}")'; }
for round in $(seq "$ROUNDS"); do
    for exe in "$@"; do
        for kind in cached plain; do
            rm -rf "$WORK/vol"
            home=(); [ "$kind" = cached ] && home=(--home "file://$WORK/home")
            "$exe" up --servers 4 --dir "$WORK/vol" --mount "$WORK/mnt" --port "$PORT" --no-metrics \
                "${home[@]}" > "$WORK/up.log" 2>&1 & UP=$!
            for _ in $(seq 100); do mountpoint -q "$WORK/mnt" && break; sleep 0.1; done
            mountpoint -q "$WORK/mnt" || { cat "$WORK/up.log"; exit 1; }
            if [ "$kind" = cached ]; then
                ls "$WORK/mnt/d" > /dev/null
            else
                mkdir "$WORK/mnt/d"
                python3 -c "import sys
for i in range($N): open(f'$WORK/mnt/d/file-{i:06d}.dat', 'w').close()"
            fi
            "$exe" nfs "127.0.0.1:$PORT" --listen "127.0.0.1:$NFS_PORT" --no-rpcbind --insecure \
                --key "$WORK/vol/keys/client.key" > "$WORK/nfs.log" 2>&1 & NFS=$!
            sleep 2
            line="round $round $kind $exe:"
            for i in 1 2 3 4; do
                t0=$(secs)
                n=$(nfs-ls "nfs://127.0.0.1/d?version=3&nfsport=$NFS_PORT&mountport=$NFS_PORT" | wc -l)
                t1=$(secs)
                [ "$n" = "$N" ] || { echo "listed $n of $N" >&2; exit 1; }
                line="$line $(python3 -c "print(f'{$t1 - $t0:.3f}')")"
            done
            echo "$line"
            stop
        done
    done
done
