#!/usr/bin/env bash
# Large-directory benchmark: a 4-server loopback cluster, then N creates in one
# directory (rate per tenth), uncached lookups and a full cookie listing.
# Usage: bench/bigdir.sh [N] [IN_FLIGHT]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
INFLIGHT=${2:-32}
cargo build --release -p morris-cli -p morris-client --example bigdir >/dev/null
work=$(mktemp -d /var/tmp/morris-bigdir-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
addrs=()
for i in 0 1 2 3; do
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  target/release/morris server --data "$work/s$i" --listen "127.0.0.1:$port" >"$work/s$i.log" 2>&1 &
  pids+=($!)
  addrs+=("127.0.0.1:$port")
done
sleep 1
target/release/morris format --servers "$(IFS=,; echo "${addrs[*]}")" >/dev/null
target/release/examples/bigdir "${addrs[0]}" "$N" "$INFLIGHT"
