#!/usr/bin/env python3
"""A lost server replaced by an empty one (`morris volume replace`), rebuilt.

Loopback, one machine: K `morris server` processes (own data dir each, under
a temp dir on the normal disk), `format --stripe-unit 1M --replicas 2`, one
FUSE mount through server 1 (the root directory's owner: never killed).
Per run, on a fresh volume:

  write      FILES files of SIZE/FILES bytes each (1 MiB writes, fsync)
  replace    kill -9 the victim (server 2), delete its data directory, start
             it again on an empty one (same --listen), drop caches, then
             `morris volume replace`; poll `status --json` every 0.5 s
             until the volume is `healthy`; from the victim's log: when its
             copies were all recorded stale (this waits for its own metadata
             range to be taken over by the next server: nobody can list that
             range's files before) and the resync pass that rebuilt them;
             its bytes_copied and data_bytes against the others'
  read       every file through a fresh mount with ANOTHER server (3) killed,
             so that the victim's rebuilt copies must serve: sha256 checked
  local      the reference, same disk, same run: `cp` of a file as large as
             what the rebuild copied, then `sync` (caches dropped first)

Prints medians of --runs runs and the ratio rebuild MiB/s / local cp MiB/s;
writes raw + summary JSON. Fails loudly (non-zero exit) on any error, wrong
checksum or timeout. Needs root.
Usage:
  python3 bench/replace.py [--size 2G] [--files 8] [--runs 3] [--resync-rate 0] [--exe target/release/morris]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from lib.loopback import (BenchError, Volume, interrupt_on_signals, make_keys, require_root_fuse,  # noqa: E402
                          run_bench)
from lib.util import drop_caches, finish, log_times, med, parse_size  # noqa: E402
from resync import Pattern, read_check, server_entry, write_pattern  # noqa: E402

ROOT_ID = 1  # the root directory's inode id (owner = id mod k)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def one_run(a, run, base, size, keys):
    rd = os.path.join(base, f"run{run}")
    os.makedirs(rd)
    r = {"run": run + 1}
    via = ROOT_ID % a.servers
    victim, other = (via + 1) % a.servers, (via + 2) % a.servers
    r.update(victim=victim, other_lost=other)
    vol = Volume(a.exe, os.path.join(rd, "volume"), a.servers, 2, stripe_unit="1M", via=via, keys=keys,
                 server_args=["--resync-rate", a.resync_rate])
    try:
        mnt = vol.mount(os.path.join(rd, "mnt"))
        per = size // a.files // MiB * MiB
        pats = [Pattern(per, 100 * run + i) for i in range(a.files)]
        t0 = time.perf_counter()
        for i, p in enumerate(pats):
            write_pattern(os.path.join(mnt, f"f{i}"), p)
        r["write"] = per * a.files / MiB / (time.perf_counter() - t0)
        vol.umount(mnt)

        vol.kill9(victim)
        shutil.rmtree(vol.data_dir(victim))
        vol.start_server(victim)
        vol.wait_port(victim)
        drop_caches()
        t0 = time.perf_counter()
        wall0 = time.time()
        out = subprocess.run([a.exe, "volume", "replace", "--key", keys.volume, vol.live, str(victim)],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise BenchError(f"volume replace failed: {out.stdout}{out.stderr}")
        r["replace_cmd_s"] = time.perf_counter() - t0
        seen = {}

        def note(st):
            s = server_entry(st, victim)
            c = s.get("copies")
            if c != "rebuilding" and "recorded" not in seen:
                seen["recorded"] = time.perf_counter() - t0
            return {"copies": c, "copied": (s.get("stats") or {}).get("resync", {}).get("bytes_copied")}

        healthy_s, timeline, st = vol.wait_healthy(a.timeout, "volume replace", check_alive=[victim], note=note,
                                                   t0=t0)
        r["time_to_recorded_s"] = seen.get("recorded")
        r["time_to_healthy_s"] = healthy_s
        r["timeline"] = timeline[-40:]
        data = {s["index"]: (s.get("stats") or {}).get("data_bytes", 0) for s in st["servers"]}
        vs = server_entry(st, victim)["stats"]
        r["bytes_copied"] = vs["resync"]["bytes_copied"]
        r["victim_data_bytes"] = data[victim]
        r["others_data_bytes_mean"] = sum(v for k, v in data.items() if k != victim) / (len(data) - 1)
        r["rebuild_rate"] = r["bytes_copied"] / MiB / healthy_s
        # From the victim's log: when its copies were all recorded stale
        # (after its own range was taken over: until then nobody can list
        # that range's files), and the resync pass that rebuilt them.
        lt = log_times(vol.log_path(victim), "formatted as a replacement",
                       {"recorded": "copies here of every file are recorded stale",
                        "pass_start": "resync: catching up stale copies", "pass_end": "resync pass finished"})
        if not all(lt.values()):
            raise BenchError(f"victim's log lacks the rebuild's lines: {lt}")
        r["log_recorded_s"] = lt["recorded"] - wall0
        r["resync_pass_s"] = lt["pass_end"] - lt["pass_start"]
        r["resync_rate"] = r["bytes_copied"] / MiB / max(r["resync_pass_s"], 1e-3)
        log(f"run {run + 1}: rebuilt {r['bytes_copied'] / MiB:.0f} MiB in {healthy_s:.1f} s "
            f"({r['rebuild_rate']:.0f} MiB/s; recorded stale after {r['log_recorded_s']:.1f} s, "
            f"resync pass {r['resync_pass_s']:.1f} s = {r['resync_rate']:.0f} MiB/s); "
            f"victim holds {data[victim] / MiB:.0f} MiB, the others {r['others_data_bytes_mean'] / MiB:.0f} on average")

        rc, text = vol.fsck()
        if rc != 0 or "0 errors" not in text or "0 stale copies" not in text:
            raise BenchError(f"fsck after the rebuild is not clean:\n{text}")
        vol.kill9(other)
        mnt = vol.mount(os.path.join(rd, "mnt"))
        drop_caches()
        buf = bytearray(per)
        t0 = time.perf_counter()
        for i, p in enumerate(pats):
            read_check(os.path.join(mnt, f"f{i}"), per, p.sha, buf)
        r["read_other_lost"] = per * a.files / MiB / (time.perf_counter() - t0)
        vol.umount(mnt)
    finally:
        vol.stop()

    # The reference: a local copy of as many bytes, on the same disk.
    n = max(r["bytes_copied"] // MiB * MiB, MiB)
    src, dst = os.path.join(rd, "local-src"), os.path.join(rd, "local-dst")
    write_pattern(src, Pattern(n, 7))
    drop_caches()
    t0 = time.perf_counter()
    subprocess.run(["cp", src, dst], check=True)
    subprocess.run(["sync"], check=True)
    r["local_cp"] = n / MiB / (time.perf_counter() - t0)
    os.unlink(src)
    os.unlink(dst)
    log(f"run {run + 1}: read with server {other} lost {r['read_other_lost']:.0f} MiB/s; "
        f"local cp + sync of {n // MiB} MiB {r['local_cp']:.0f} MiB/s")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G", help="bytes written in all (default 2G)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for healthy")
    ap.add_argument("--resync-rate", default="0",
                    help="the servers' --resync-rate (default 0: no limit, the rebuild at full speed)")
    ap.add_argument("--exe", default=os.path.join(BENCH, "..", "target", "release", "morris"))
    ap.add_argument("--dir", default=None, help="where the temp dir goes (default: system temp)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-replace.json"))
    a = ap.parse_args()
    a.exe = os.path.abspath(a.exe)
    require_root_fuse("replace.py", a.exe)
    if a.servers < 4:
        sys.exit("--servers must be at least 4 (a server kept, the victim, another lost after)")
    size = parse_size(a.size)
    interrupt_on_signals()
    base = tempfile.mkdtemp(prefix="morris-replace-", dir=a.dir)
    runs = []
    t_all = time.time()

    def all_runs():
        keys = make_keys(a.exe, os.path.join(base, "keys"))
        for run in range(a.runs):
            runs.append(one_run(a, run, base, size, keys))

    failure = run_bench(all_runs, base, lambda d: shutil.rmtree(d, ignore_errors=True), log, a.dir,
                        "morris-replace-failure-logs-")
    keys = ["write", "replace_cmd_s", "time_to_recorded_s", "log_recorded_s", "time_to_healthy_s",
            "resync_pass_s", "bytes_copied", "victim_data_bytes", "others_data_bytes_mean", "rebuild_rate",
            "resync_rate", "read_other_lost", "local_cp"]
    m = {k: med(runs, k) for k in keys}
    ratio = m["resync_rate"] / m["local_cp"] if m.get("resync_rate") and m.get("local_cp") else None
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "command": " ".join([sys.executable] + sys.argv), "exe": a.exe, "size_bytes": size,
               "files": a.files, "servers": a.servers, "replicas": 2, "stripe_unit": "1M",
               "runs_completed": len(runs), "runs_requested": a.runs, "failure": failure,
               "elapsed_s": time.time() - t_all, "median": m, "resync_rate/local_cp": ratio}
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "raw": runs}, f, indent=1)
    if runs:
        print(f"\nmorris {a.servers} servers on loopback, --replicas 2, {a.files} files, {size // MiB} MiB, "
              f"median of {len(runs)} run(s)")
        rows = [("write (MiB/s)", "write", 1), ("volume replace command (s)", "replace_cmd_s", 1),
                ("replace -> copies recorded stale, log (s)", "log_recorded_s", 1),
                ("replace -> healthy, status (s)", "time_to_healthy_s", 1),
                ("resync pass, log (s)", "resync_pass_s", 1),
                ("bytes rebuilt (MiB)", "bytes_copied", MiB), ("victim holds (MiB)", "victim_data_bytes", MiB),
                ("each other server holds (MiB)", "others_data_bytes_mean", MiB),
                ("rebuild rate, replace -> healthy (MiB/s)", "rebuild_rate", 1),
                ("resync rate over its pass (MiB/s)", "resync_rate", 1),
                ("read, another server lost after (MiB/s)*", "read_other_lost", 1),
                ("local cp + sync, same bytes (MiB/s)", "local_cp", 1)]
        for label, k, div in rows:
            v = m[k]
            print(f"{label:<44}{'-' if v is None else f'{v / div:10.1f}':>10}   runs: "
                  + ", ".join("-" if r.get(k) is None else f"{r[k] / div:.1f}" for r in runs))
        print(f"\n{'resync rate / local cp':<44}{'-' if ratio is None else f'{ratio:10.2f}':>10}")
        print("* includes the pause until the other lost server's metadata range is taken over")
    finish(a.out, failure)


if __name__ == "__main__":
    main()
