#!/bin/bash
# What the Prometheus metrics cost: two `morris up` clusters of the same
# binary at once, one with metrics on and scraped every second, one with
# --no-metrics; small files, 100-byte appends and a 1 GiB write on each in
# turn, three rounds. Usage: sudo bench/metrics_cost.sh [MORRIS_BINARY]
# (docs/benchmarks.md, "What the metrics cost"). The 1 GiB column is a write.
set -u
B=${1:-$(dirname "$0")/../target/release/morris}
B=$(realpath "$B")
BENCH=$(realpath "$(dirname "$0")")
rm -rf /var/tmp/ab; mkdir -p /var/tmp/ab
cd /var/tmp/ab
setsid $B up --dir /var/tmp/ab/d1 --mount /var/tmp/ab/m1 --port 17700 --metrics-port 17800 --no-allow-other > up1.log 2>&1 &
setsid $B up --dir /var/tmp/ab/d2 --mount /var/tmp/ab/m2 --port 17720 --no-metrics --no-allow-other > up2.log 2>&1 &
sleep 8; mountpoint -q /var/tmp/ab/m1 && mountpoint -q /var/tmp/ab/m2 || { echo NOT MOUNTED; cat up1.log up2.log; exit 1; }
( while true; do for p in 17800 17801 17802 17803 17804; do curl -s http://127.0.0.1:$p/metrics > /dev/null; done; sleep 1; done ) &
SCR=$!
w100() { python3 - "$1" <<'PY'
import os,sys,time
fd=os.open(sys.argv[1],os.O_CREAT|os.O_WRONLY|os.O_APPEND,0o644); b=b"y"*100; n=100000
t=time.perf_counter()
for i in range(n): os.write(fd,b)
os.close(fd); print(f"{n/(time.perf_counter()-t):.0f} writes/s")
PY
}
for r in 1 2 3; do
  for m in m1 m2; do
    echo "run $r $m small: $(python3 $BENCH/small_file_loop.py /var/tmp/ab/$m/r$r 2000 4096)  100B: $(w100 /var/tmp/ab/$m/a$r)  write1G: $(dd if=/dev/zero of=/var/tmp/ab/$m/big$r bs=1M count=1024 2>&1 | tail -1 | awk '{print $(NF-1),$NF}')"
  done
done
kill $SCR
kill -INT $(pgrep -f "morris up --dir /var/tmp/ab/d1"); kill -INT $(pgrep -f "morris up --dir /var/tmp/ab/d2")
sleep 4; mount | grep /var/tmp/ab
