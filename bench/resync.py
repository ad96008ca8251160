#!/usr/bin/env python3
"""Mirrored volume (--replicas 2): writing on with a copy server lost, and its resync.

Loopback, one machine: K `morris server` processes (own data dir each, under a
temp dir on the normal disk), `format --stripe-unit 1M --replicas 2`, one FUSE
mount through server 1 (the root directory's owner: never the one killed).
Per run, on a fresh volume:

  healthy-write   file 1: SIZE in sequential 1 MiB writes (distinct random
                  blocks), fsync, close -> MiB/s
  healthy-read    file 1, fresh mount + drop_caches, sha256 checked -> MiB/s
  degraded-write  file 2: kill -9 a copy server (not the inode owner of file 2,
                  not the root owner) after 25 % of SIZE; the write must finish
                  without an error -> MiB/s whole write, MiB/s after the kill
  degraded-read   file 2, fresh mount + drop_caches, victim still down -> MiB/s
  resync          restart the victim (same --data/--listen); poll `status --json`
                  every 0.5 s until health == "healthy": time-to-healthy, the
                  victim's stats.resync (bytes_copied, passes ...), the pass
                  start/end from the victim's log -> resync MiB/s
  after-read      file 2 again (fresh mount + drop_caches), sha256 checked;
                  `morris fsck` must print 0 errors / 0 orphan data files /
                  0 stale copies
  local-write/read  the same writer/reader on a file in the same temp dir

Prints medians of --runs runs and ratios; writes raw + summary JSON.
Fails loudly (non-zero exit) on any error, wrong checksum or timeout. Needs root.
Usage:
  python3 bench/resync.py [--size 1G] [--runs 3] [--exe target/release/morris]
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from lib.loopback import (BenchError, Volume, interrupt_on_signals, make_keys, require_root_fuse,  # noqa: E402
                          run_bench)
from lib.util import drop_caches, finish, med, parse_size  # noqa: E402
from lib.util import log_times, log_warnings as warnings  # noqa: E402

ROOT_ID = 1  # the root directory's inode id (owner = id mod k)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data

class Pattern:
    """SIZE bytes of 1 MiB blocks: one random 1 MiB buffer, its first 16 bytes
    replaced per block by (seed, block index), so no two blocks are equal and
    none is all zeros. sha256 is computed once, outside any timed section."""

    def __init__(self, size, seed):
        self.size, self.seed = size, seed
        self.buf = bytearray(os.urandom(MiB))
        h = hashlib.sha256()
        for i, blk in self.blocks():
            h.update(blk)
        self.sha = h.hexdigest()

    def blocks(self):
        mv = memoryview(self.buf)
        for i in range((self.size + MiB - 1) // MiB):
            struct.pack_into("<QQ", self.buf, 0, self.seed, i)
            n = min(MiB, self.size - i * MiB)
            yield i, mv[:n]


def write_pattern(path, pat, on_progress=None):
    """Sequential 1 MiB writes, fsync, close. on_progress(bytes_written) is
    called after every write (may kill a server). Returns (seconds, marks)."""
    t0 = time.perf_counter()
    slow = []  # the slowest single 1 MiB writes: (seconds, MiB offset)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        for i, blk in pat.blocks():
            mv = blk
            tw = time.perf_counter()
            while len(mv):
                n = os.write(fd, mv)
                mv = mv[n:]
            slow.append((time.perf_counter() - tw, i))
            if len(slow) > 64:
                slow.sort(reverse=True)
                del slow[5:]
            done += len(blk)
            if on_progress:
                on_progress(done)
        t_fs = time.perf_counter()
        os.fsync(fd)
        fsync_s = time.perf_counter() - t_fs
    finally:
        os.close(fd)
    slow.sort(reverse=True)
    return time.perf_counter() - t0, t0, fsync_s, [(round(a, 3), b) for a, b in slow[:5]]


def read_check(path, expect_size, expect_sha, buf):
    """Reads the whole file into buf (timed), then checks size and sha256 (untimed)."""
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    n = 0
    t0 = time.perf_counter()
    try:
        while True:
            r = os.readv(fd, [mv[n:n + MiB]]) if n < len(buf) else len(os.read(fd, MiB))
            if r == 0:
                break
            n += r
            if n > expect_size:
                break
    finally:
        os.close(fd)
    el = time.perf_counter() - t0
    if n != expect_size:
        raise BenchError(f"{path}: read {n} bytes, expected {expect_size}")
    sha = hashlib.sha256(mv[:n]).hexdigest()
    if sha != expect_sha:
        raise BenchError(f"{path}: sha256 {sha} != written {expect_sha}  (DATA MISMATCH)")
    return n / MiB / el


# ---------------------------------------------------------------- cluster

def server_entry(st, i):
    for s in st.get("servers", []):
        if s.get("index") == i:
            return s
    raise BenchError(f"server {i} missing from status JSON")


# ---------------------------------------------------------------- one run

def one_run(a, run, base, size, keys):
    rd = os.path.join(base, f"run{run}")
    os.makedirs(rd)
    r = {"run": run + 1}
    # Mounts, status and fsck through the root directory's owner: never the one killed.
    vol = Volume(a.exe, os.path.join(rd, "volume"), a.servers, 2, stripe_unit="1M", via=ROOT_ID % a.servers,
                 keys=keys)
    cleanup = [vol]
    buf = bytearray(size)
    try:
        mnt = vol.mount(os.path.join(rd, "mnt"))
        p1, p2 = Pattern(size, 2 * run + 1), Pattern(size, 2 * run + 2)

        # 1. healthy write + healthy read of file 1.
        f1 = os.path.join(mnt, "healthy")
        kill_at = int(size * a.kill_at) // MiB * MiB
        hmark = {}

        def hprogress(done):
            if "t" not in hmark and done >= kill_at:
                hmark["t"] = time.perf_counter()

        el, t0, fs, slow = write_pattern(f1, p1, hprogress)
        r["healthy_write"] = size / MiB / el
        r["file1_inode"] = os.stat(f1).st_ino
        r["file1_inode_owner"] = r["file1_inode"] % vol.k
        r["healthy_write_fsync_s"] = fs
        r["healthy_write_slowest"] = slow
        # The same stretch as "after the kill" in the degraded write, healthy.
        r["healthy_write_after_mark"] = (size - kill_at) / MiB / (t0 + el - hmark["t"])
        r["healthy_write_before_mark"] = kill_at / MiB / (hmark["t"] - t0)
        r["remounts"] = rm = []
        mnt = vol.remount_cold(mnt, rm)
        r["healthy_read"] = read_check(f1, size, p1.sha, buf)
        log(f"run {run + 1}: healthy write {r['healthy_write']:.0f} MiB/s "
            f"(first {a.kill_at:.0%} {r['healthy_write_before_mark']:.0f}, rest {r['healthy_write_after_mark']:.0f}), read {r['healthy_read']:.0f} MiB/s")

        # 2. degraded write of file 2: victim = neither its inode owner nor the root owner.
        f2 = os.path.join(mnt, "degraded")
        os.close(os.open(f2, os.O_WRONLY | os.O_CREAT, 0o644))
        ino = os.stat(f2).st_ino
        owner = ino % vol.k
        cands = [s for s in range(vol.k) if s not in (owner, vol.via)]
        # Prefer one that does not hold file 1's inode either: the mount keeps a
        # lease there, and its exit after unmount then waits ~2 lease times.
        cands = [s for s in cands if s != r["file1_inode_owner"]] or cands
        victim = cands[run % len(cands)]
        r.update(inode=ino, inode_owner=owner, victim=victim)
        mark = {}

        def progress(done):
            if "t" not in mark and done >= kill_at:
                vol.kill9(victim)
                mark["t"] = time.perf_counter()
                mark["bytes"] = done

        try:
            el, t0, fs, slow = write_pattern(f2, p2, progress)
        except OSError as e:
            raise BenchError(f"DEGRADED WRITE FAILED after kill -9 of server {victim}: {e!r} "
                             f"(see {vol.mount_log})") from e
        t_end = t0 + el
        r["degraded_write"] = size / MiB / el
        r["degraded_write_fsync_s"] = fs
        r["degraded_write_slowest"] = slow
        r["after_kill_write"] = (size - mark["bytes"]) / MiB / (t_end - mark["t"])
        r["before_kill_write"] = mark["bytes"] / MiB / (mark["t"] - t0)
        # The client's record(s) of the missed copies (lowest missed block), from the mount's log.
        r["missed_from_blocks"] = []
        with open(vol.mount_log, errors="replace") as mf:
            for line in mf:
                if "recording its copies as stale" in line:
                    fb = [w.split("=", 1)[1] for w in line.split() if w.startswith("from_block=")]
                    r["missed_from_blocks"].append(int(fb[0]) if fb else line.strip())
        st = vol.status()
        r["status_degraded"] = {"health": st.get("health"),
                                "victim": {k: server_entry(st, victim).get(k) for k in ("state", "stale_files", "copies")}}
        log(f"run {run + 1}: inode {ino} owner {owner}, killed server {victim} at {mark['bytes'] // MiB} MiB; "
            f"degraded write {r['degraded_write']:.0f} MiB/s (after kill {r['after_kill_write']:.0f}); "
            f"slowest 1 MiB writes (s, MiB) {slow[:3]}; status {r['status_degraded']}; client recorded missed copies from block(s) {r['missed_from_blocks']}")
        if st.get("health") != "degraded":
            raise BenchError(f"expected health 'degraded' with server {victim} down, got {st.get('health')!r}")

        # 3. degraded read (victim still down).
        mnt = vol.remount_cold(mnt, rm)
        r["degraded_read"] = read_check(f2, size, p2.sha, buf)
        log(f"run {run + 1}: degraded read {r['degraded_read']:.0f} MiB/s (sha256 ok); remount {rm[-1]}")

        # 4. resync: restart the victim, wait for healthy.
        marker = f"=== bench resync.py run {run + 1}: restart {time.time():.3f} ==="
        with open(vol.log_path(victim), "a") as lf:
            lf.write(marker + "\n")
        t_restart = time.perf_counter()
        wall_restart = time.time()
        vol.start_server(victim)
        vol.wait_port(victim)
        seen = {"first_running": None}

        def note(st):
            v = server_entry(st, victim)
            rs = (v.get("stats") or {}).get("resync") or {}
            now = time.perf_counter() - t_restart
            if rs.get("running") and seen["first_running"] is None:
                seen["first_running"] = now
            return {"state": v.get("state"), "copies": v.get("copies"), "stale_files": v.get("stale_files"),
                    "resync": rs}

        t_healthy, timeline, _ = vol.wait_healthy(a.timeout, f"restarting server {victim}",
                                                   check_alive=[victim], note=note, t0=t_restart)
        first_running = seen["first_running"]
        final_rs = timeline[-1]["resync"]
        r["resync_time_to_healthy_s"] = t_healthy
        r["resync_first_seen_running_s"] = first_running
        r["resync_status_final"] = final_rs
        bytes_copied = final_rs.get("bytes_copied", 0)
        r["resync_bytes_copied"] = bytes_copied
        lt = log_times(vol.log_path(victim), marker, {"pass_start": "resync: catching up stale copies",
                                                       "pass_end": "resync pass finished"})
        r["resync_log_pass_start_s"] = lt["pass_start"] - wall_restart if lt["pass_start"] else None
        r["resync_log_pass_end_s"] = lt["pass_end"] - wall_restart if lt["pass_end"] else None
        pass_s = (lt["pass_end"] - lt["pass_start"]) if lt["pass_start"] and lt["pass_end"] else None
        r["resync_pass_s"] = pass_s
        r["resync_rate_raw"] = bytes_copied / MiB / t_healthy  # bytes / time from restart to healthy
        r["resync_rate_pass"] = bytes_copied / MiB / pass_s if pass_s else None
        r["resync_timeline"] = timeline
        if final_rs.get("last_error"):
            log(f"run {run + 1}: WARNING resync last_error = {final_rs['last_error']!r}")
        log(f"run {run + 1}: healthy {t_healthy:.1f}s after restart; copied {bytes_copied / MiB:.0f} MiB; "
            f"pass (log) {pass_s if pass_s is None else round(pass_s, 2)}s from "
            f"{r['resync_log_pass_start_s'] if r['resync_log_pass_start_s'] is None else round(r['resync_log_pass_start_s'], 2)}s; "
            f"{r['resync_rate_raw']:.0f} MiB/s raw, {r['resync_rate_pass'] or float('nan'):.0f} MiB/s over the pass; "
            f"resync {final_rs}")

        # 5. after resync: read file 2 (and file 1) again, fsck.
        mnt = vol.remount_cold(mnt, rm)
        r["after_resync_read"] = read_check(f2, size, p2.sha, buf)
        r["after_resync_read_file1"] = read_check(f1, size, p1.sha, buf)
        rc, out = vol.fsck()
        r["fsck_rc"], r["fsck_output"] = rc, out
        missing = [s for s in ("0 errors", "0 orphan data files", "0 stale copies") if s not in out]
        log(f"run {run + 1}: after-resync read {r['after_resync_read']:.0f} MiB/s (sha256 ok); "
            f"fsck rc={rc} {'OK' if not missing else 'MISSING ' + str(missing)}")
        if rc != 0 or missing:
            raise BenchError(f"FSCK after resync not clean (rc={rc}, missing {missing}):\n{out}")
        vol.stop()
        cleanup.remove(vol)
        r["log_warnings"] = warnings(vol.base)

        # 6. local disk reference, same writer/reader, same temp dir.
        lf = os.path.join(rd, "local.dat")
        el, _, fs, _ = write_pattern(lf, p1)
        r["local_write"] = size / MiB / el
        drop_caches()
        r["local_read"] = read_check(lf, size, p1.sha, buf)
        os.unlink(lf)
        log(f"run {run + 1}: local write {r['local_write']:.0f} MiB/s, read {r['local_read']:.0f} MiB/s")
        shutil.rmtree(rd, ignore_errors=True)  # on failure main() keeps the logs first
    finally:
        for v in cleanup:
            v.stop()
        del buf
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--kill-at", type=float, default=0.25, help="fraction of SIZE written before kill -9")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for healthy after the restart")
    ap.add_argument("--exe", default=os.environ.get(
        "MORRIS_EXE", os.path.join(os.path.dirname(BENCH), "target", "release", "morris")))
    ap.add_argument("--dir", default="/var/tmp", help="parent of the temp dir (on the disk under test)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-resync.json"))
    a = ap.parse_args()
    size = parse_size(a.size)

    require_root_fuse("resync.py", a.exe)
    for sub, flag in (("server", "--no-resync"), ("format", "--replicas"), ("status", "--json"), ("fsck", "--all")):
        h = subprocess.run([a.exe, sub, "--help"], capture_output=True, text=True).stdout
        if flag not in h:
            sys.exit(f"resync.py: `{a.exe} {sub} --help` has no {flag}: not a build with mirrored-volume resync")
    if a.servers < 3:
        sys.exit("resync.py: needs >= 3 servers (a victim besides the root and inode owners)")
    if size < 4 * MiB or size % MiB:
        sys.exit("resync.py: --size must be a multiple of 1 MiB, >= 4 MiB")

    base = tempfile.mkdtemp(prefix="morris-resync-", dir=a.dir)

    interrupt_on_signals()
    runs = []
    t_all = time.time()

    def all_runs():
        run_keys = make_keys(a.exe, os.path.join(base, "keys"))  # once: every volume of the run uses them
        for run in range(a.runs):
            log(f"=== run {run + 1}/{a.runs}, size {size // MiB} MiB, dir {base}")
            runs.append(one_run(a, run, base, size, run_keys))

    # Keeps logs of a failed run before deleting the temp dir.
    failure = run_bench(all_runs, base, lambda d: shutil.rmtree(d, ignore_errors=True), log, a.dir,
                        "morris-resync-failure-logs-")

    keys = ["healthy_write", "healthy_write_before_mark", "healthy_write_after_mark", "degraded_write", "before_kill_write", "after_kill_write", "healthy_read",
            "degraded_read", "after_resync_read", "after_resync_read_file1", "local_write", "local_read",
            "resync_time_to_healthy_s", "resync_log_pass_start_s", "resync_pass_s", "resync_bytes_copied",
            "resync_rate_raw", "resync_rate_pass", "healthy_write_fsync_s",
            "degraded_write_fsync_s"]
    m = {k: med(runs, k) for k in keys}

    def ratio(x, y):
        return m[x] / m[y] if m.get(x) and m.get(y) else None

    ratios = {
        "degraded_write/healthy_write": ratio("degraded_write", "healthy_write"),
        "after_kill_write/healthy_write_same_stretch": ratio("after_kill_write", "healthy_write_after_mark"),
        "degraded_read/healthy_read": ratio("degraded_read", "healthy_read"),
        "after_resync_read/healthy_read": ratio("after_resync_read", "healthy_read"),
        "resync_rate_pass/local_write": ratio("resync_rate_pass", "local_write"),
        "resync_rate_raw/local_write": ratio("resync_rate_raw", "local_write"),
        "healthy_write/local_write": ratio("healthy_write", "local_write"),
        "healthy_read/local_read": ratio("healthy_read", "local_read"),
    }
    summary = {"date": time.strftime("%Y-%m-%d"), "command": " ".join([sys.executable] + sys.argv),
               "exe": a.exe, "size_bytes": size, "servers": a.servers, "replicas": 2, "stripe_unit": "1M",
               "runs_completed": len(runs), "runs_requested": a.runs, "failure": failure,
               "elapsed_s": time.time() - t_all, "median": m, "ratios": ratios}
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "raw": runs}, f, indent=1)

    if runs:
        print(f"\nmorris {a.servers} servers on loopback, --replicas 2, file {size // MiB} MiB, "
              f"median of {len(runs)} run(s)")
        rows = [("healthy write (MiB/s)", "healthy_write"),
                (f"  first {a.kill_at:.0%} (MiB/s)", "healthy_write_before_mark"), ("  the rest (MiB/s)", "healthy_write_after_mark"),
                ("degraded write, whole (MiB/s)", "degraded_write"),
                ("  before the kill (MiB/s)", "before_kill_write"), ("  after the kill (MiB/s)", "after_kill_write"),
                ("healthy read, file 1 (MiB/s)", "healthy_read"), ("degraded read, file 2 (MiB/s)", "degraded_read"),
                ("read after resync, file 2 (MiB/s)", "after_resync_read"),
                ("restart -> healthy (s)", "resync_time_to_healthy_s"),
                ("restart -> pass start, log (s)", "resync_log_pass_start_s"),
                ("resync pass, log (s)", "resync_pass_s"), ("resync bytes copied (MiB)", "resync_bytes_copied"),
                ("resync rate over the pass (MiB/s)", "resync_rate_pass"),
                ("resync rate, restart->healthy (MiB/s)", "resync_rate_raw"),
                ("local disk write (MiB/s)", "local_write"), ("local disk read (MiB/s)", "local_read")]
        for label, k in rows:
            v = m[k]
            if k == "resync_bytes_copied" and v is not None:
                v /= MiB
            print(f"{label:<46}{'-' if v is None else f'{v:10.1f}':>10}   runs: "
                  + ", ".join("-" if r.get(k) is None else f"{(r[k] / MiB if k == 'resync_bytes_copied' else r[k]):.1f}"
                              for r in runs))
        print()
        for k, v in ratios.items():
            print(f"{k:<46}{'-' if v is None else f'{v:10.2f}':>10}")
    finish(a.out, failure)


if __name__ == "__main__":
    main()
