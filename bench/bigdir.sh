#!/usr/bin/env bash
# Large-directory benchmark: a 4-server loopback cluster, then N creates in one
# directory (rate per tenth), uncached lookups and a full cookie listing; then
# the same directory listed through an NFS gateway (`morris nfs`) with raw
# READDIR and READDIRPLUS calls (bench/nfs_readdir.py) and with libnfs' nfs-ls.
# Keys: `morris key new $work/keys`; servers and format get volume.key, the
# bigdir client (MORRIS_KEY) and the gateway client.key.
# Usage: bench/bigdir.sh [N] [IN_FLIGHT]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
INFLIGHT=${2:-32}
cargo build --release -p morris-cli >/dev/null
cargo build --release -p morris-client --example bigdir >/dev/null
work=$(mktemp -d /var/tmp/morris-bigdir-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
keys="$work/keys"
[ -f "$keys/volume.key" ] && [ -f "$keys/client.key" ] || target/release/morris key new "$keys" >/dev/null
vkey="$keys/volume.key"
ckey="$keys/client.key"
addrs=()
for i in 0 1 2 3; do
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  target/release/morris server --key "$vkey" --data "$work/s$i" --listen "127.0.0.1:$port" >"$work/s$i.log" 2>&1 &
  pids+=($!)
  addrs+=("127.0.0.1:$port")
done
sleep 1
target/release/morris format --key "$vkey" --servers "$(IFS=,; echo "${addrs[*]}")" >/dev/null
MORRIS_KEY="$ckey" target/release/examples/bigdir "${addrs[0]}" "$N" "$INFLIGHT" | tee "$work/bigdir.out"
nport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
target/release/morris nfs --key "$ckey" "${addrs[0]}" --listen "127.0.0.1:$nport" --no-rpcbind >"$work/nfs.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "nfs gateway serving" "$work/nfs.log" && break; sleep 0.1; done
dir=$(python3 - "$nport" <<'PY'
import subprocess, sys
out = subprocess.run(["nfs-ls", f"nfs://127.0.0.1/?version=3&nfsport={sys.argv[1]}&mountport={sys.argv[1]}"],
                     capture_output=True, text=True, check=True).stdout
print([l.split()[-1] for l in out.splitlines() if "bigdir-" in l][0])
PY
)
python3 bench/nfs_readdir.py "127.0.0.1:$nport" "$dir"
python3 bench/nfs_readdir.py "127.0.0.1:$nport" "$dir" --plus
start=$(date +%s.%N)
n=$(nfs-ls "nfs://127.0.0.1//$dir?version=3&nfsport=$nport&mountport=$nport" | wc -l)
echo "nfs-ls (libnfs, READDIRPLUS): $n entries in $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s"
