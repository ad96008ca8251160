#!/usr/bin/env python3
"""Consistency under load: the checker (`morris-consistency`) on loopback volumes.

For each replicas value (--replicas, default 1,2) and configuration (--configs):

  one-mount      one FUSE mount                        --dir M1/t
  two-mounts     two FUSE mounts (two `morris mount`)  --dir M1/t --dir M2/t
  nfs            the NFS gateway alone                 --nfs GW/t
                 (append, sqlite and open-unlinked need a POSIX target: skipped)
  mount-and-nfs  one FUSE mount and the NFS gateway    --dir M1/t --nfs GW/t
                 (workloads with an NFS meaning spread their workers over both;
                 append and sqlite are POSIX-only and use the mount alone)

a fresh volume (K `morris server` processes under a temp dir, `format --replicas
R`, mounts and gateway through server 1, which is never killed) runs every
workload of --workloads for --minutes in all (split evenly between them), with
a fixed --seed. With replicas >= 2 a server other than server 1 is killed (-9)
every --kill-every seconds and restarted (same --data/--listen) --down seconds
later, while the checker runs. The checker's one-line JSON summaries are kept;
the script prints ops and violations per configuration and workload, and writes
them to --out. Exit 1 if any violation was found (the logs of the volume are
then kept next to the temp dir), 0 otherwise. Needs root (FUSE).

Usage:
  python3 bench/consistency.py [--minutes 10] [--replicas 1,2]
      [--configs one-mount,two-mounts,nfs,mount-and-nfs]
      [--workloads all] [--seed 1] [--procs 4] [--kill-every 60] [--down 15]
      [--exe target/release/morris] [--checker target/release/morris-consistency]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
from lib.loopback import (BenchError, Volume, interrupt_on_signals, make_keys, require_root_fuse,  # noqa: E402
                          run_bench)
from lib.util import finish, remove_tree  # noqa: E402

CONFIGS = ("one-mount", "two-mounts", "nfs", "mount-and-nfs")
WORKLOADS = ("append", "rename-replace", "create-unlink", "open-unlinked", "listing", "sqlite")
VIA = 1  # the server mounts and the gateway go through; never killed
NEEDS_POSIX = ("append", "open-unlinked", "sqlite")  # not run on the gateway alone


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


class Killer(threading.Thread):
    """kill -9 of a server other than VIA every `every` s, restarted `down` s later."""

    def __init__(self, vol, every, down):
        super().__init__(daemon=True)
        self.vol, self.every, self.down = vol, every, down
        self.stop_ev = threading.Event()
        self.events, self.error = [], None
        self.t0 = time.time()

    def run(self):
        victims = [i for i in range(self.vol.k) if i != VIA]
        n = 0
        try:
            while not self.stop_ev.wait(self.every):
                v = victims[n % len(victims)]
                n += 1
                self.vol.kill9(v)
                ev = {"server": v, "killed_s": round(time.time() - self.t0, 1)}
                self.events.append(ev)
                log(f"  kill -9 server {v}")
                self.stop_ev.wait(self.down)
                self.vol.start_server(v)
                self.vol.wait_port(v)
                ev["restarted_s"] = round(time.time() - self.t0, 1)
                log(f"  server {v} restarted")
        except (BenchError, OSError) as e:
            self.error = str(e)

    def finish(self):
        """Stops killing; a server still down is started again."""
        self.stop_ev.set()
        self.join(120)
        for i, p in enumerate(self.vol.procs):
            if p is None:
                self.vol.start_server(i)
                self.vol.wait_port(i)


def one_config(a, base, replicas, config, workloads, runs, keys):
    """A fresh volume, the checker over `config`; its record is appended to runs at once
    (a failed run keeps what it got)."""
    tag = f"r{replicas}-{config}"
    if config == "nfs":
        workloads = [w for w in workloads if w not in NEEDS_POSIX]
    rec = {"config": config, "replicas": replicas, "workloads": list(workloads), "summaries": []}
    if not workloads:
        return
    runs.append(rec)
    vol = Volume(a.exe, os.path.join(base, tag), a.servers, replicas, stripe_unit="64K",
                 lease_ms=a.lease_ms, via=VIA, own_session=True, format_timeout=60, quiet_umount=True,
                 keys=keys)
    killer = None
    try:
        m1 = vol.mount(os.path.join(base, tag, "m1"))
        os.mkdir(os.path.join(m1, "t"))
        args = [] if config == "nfs" else ["--dir", os.path.join(m1, "t")]
        if config == "two-mounts":
            m2 = vol.mount(os.path.join(base, tag, "m2"))
            args += ["--dir", os.path.join(m2, "t")]
        elif config in ("nfs", "mount-and-nfs"):
            port = vol.start_nfs()
            args += ["--nfs", f"127.0.0.1:{port}/t"]
        seconds = max(1.0, a.minutes * 60 / len(workloads))
        cmd = [a.checker, "--workload", ",".join(workloads), *args, "--seconds", f"{seconds:g}",
               "--seed", str(a.seed), "--procs", str(a.procs)]
        rec["command"] = " ".join(cmd)
        log(f"=== {tag}: {len(workloads)} workloads x {seconds:g} s" +
            (f", kill -9 every {a.kill_every:g} s" if replicas >= 2 else ""))
        if replicas >= 2 and a.kill_every > 0:
            killer = Killer(vol, a.kill_every, a.down)
            killer.start()
        t0 = time.time()
        # Bounded: the checker's own grace per workload (90 s) plus set-up and checks.
        limit = len(workloads) * (seconds + 300)
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            def text(b):
                return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
            rec["summaries"] = [json.loads(ln) for ln in text(e.stdout).splitlines() if ln.startswith("{")]
            rec["stderr_tail"] = text(e.stderr)[-4000:]
            raise BenchError(f"{tag}: the checker did not finish within {limit:.0f} s") from e
        rec["elapsed_s"] = round(time.time() - t0, 1)
        rec["checker_rc"] = out.returncode
        rec["summaries"] = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
        rec["stderr_tail"] = out.stderr[-4000:]
        if out.returncode not in (0, 1) or not rec["summaries"]:
            raise BenchError(f"{tag}: checker exit {out.returncode}:\n{out.stderr[-2000:]}")
        if killer:
            killer.finish()
            rec["kills"] = killer.events
            if killer.error:
                raise BenchError(f"{tag}: killing/restarting a server failed: {killer.error}")
        v = sum(s["violations"] for s in rec["summaries"])
        log(f"    {tag}: {sum(s['ops'] for s in rec['summaries'])} ops, {v} violations")
    finally:
        if killer and killer.is_alive():
            killer.finish()
        vol.stop()


def table(runs):
    print(f"\n{'replicas':>8}  {'config':<13} {'workload':<15} {'ops':>9} {'violations':>10}  kinds")
    for r in runs:
        if r.get("error"):
            print(f"{r['replicas']:>8}  {r['config']:<13} FAILED: {r['error'][:120]}")
        for s in r.get("summaries", []):
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(s["violations_by_kind"].items(), key=lambda x: -x[1]))
            if s.get("skipped"):
                kinds = f"skipped: {s['skipped']}"
            print(f"{r['replicas']:>8}  {r['config']:<13} {s['workload']:<15} {s['ops']:>9} "
                  f"{s['violations']:>10}  {kinds[:110]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10, help="checker time per configuration")
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--workloads", default="all")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--lease-ms", type=int, default=None, help="servers' --lease-ms (default: theirs)")
    ap.add_argument("--kill-every", type=float, default=60, help="seconds between kills (replicas >= 2; 0: none)")
    ap.add_argument("--down", type=float, default=15, help="seconds a killed server stays down")
    ap.add_argument("--exe", default=os.environ.get("MORRIS_EXE", os.path.join(ROOT, "target", "release", "morris")))
    ap.add_argument("--checker", default=os.environ.get(
        "MORRIS_CONSISTENCY", os.path.join(ROOT, "target", "release", "morris-consistency")))
    ap.add_argument("--dir", default="/var/tmp", help="parent of the temp dir")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-consistency.json"))
    a = ap.parse_args()
    reps = [int(x) for x in a.replicas.split(",") if x]
    configs = [c for c in a.configs.split(",") if c]
    workloads = list(WORKLOADS) if a.workloads == "all" else [w for w in a.workloads.split(",") if w]
    require_root_fuse("consistency.py", a.exe)
    if not os.access(a.checker, os.X_OK):
        sys.exit(f"consistency.py: {a.checker} not found (cargo build --release -p morris-consistency)")
    if set(configs) - set(CONFIGS) or set(workloads) - set(WORKLOADS):
        sys.exit(f"consistency.py: configs are {CONFIGS}, workloads {WORKLOADS}")
    if a.servers < 3:
        sys.exit("consistency.py: needs >= 3 servers (one is killed, another serves the mounts)")

    base = tempfile.mkdtemp(prefix="morris-consistency-", dir=a.dir)
    interrupt_on_signals(ignore_later=lambda sig: log(f"signal {sig} ignored: cleaning up"))
    runs = []
    t_all = time.time()

    def body():
        keys = make_keys(a.exe, os.path.join(base, "keys"))  # once: every volume of the run uses them
        errors = []
        for rep in reps:
            for c in configs:
                try:
                    one_config(a, base, rep, c, workloads, runs, keys)
                except BenchError as e:
                    # Recorded; the other configurations still run.
                    runs[-1]["error"] = str(e)
                    errors.append(str(e))
                    log(f"    r{rep}-{c}: {e}")
        bad = sum(s["violations"] for r in runs for s in r["summaries"])
        if bad or errors:
            raise BenchError(f"{bad} violations, {len(errors)} failed configurations "
                             f"(see the table and {a.out})")

    failure = run_bench(body, base, lambda d: remove_tree(d, log), log, a.dir, "morris-consistency-logs-")
    summary = {"date": time.strftime("%Y-%m-%d"), "command": " ".join([sys.executable] + sys.argv),
               "exe": a.exe, "checker": a.checker, "minutes_per_config": a.minutes, "seed": a.seed,
               "procs": a.procs, "servers": a.servers, "kill_every_s": a.kill_every, "down_s": a.down,
               "failure": failure, "elapsed_s": round(time.time() - t_all, 1)}
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "runs": runs}, f, indent=1)
    table(runs)
    finish(a.out, failure)


if __name__ == "__main__":
    main()
