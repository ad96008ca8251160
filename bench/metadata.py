#!/usr/bin/env python3
"""Mirrored metadata (--replicas 2): what it costs, and the pause when a range's owner dies.

Loopback, one machine: K `morris server` processes (own data dir each, under a
temp dir on the normal disk), `morris format --replicas R`, one FUSE mount
(`morris mount ADDR MNT` in the foreground, a child process) through server 0,
which is never killed. Two parts:

cost      For each of --runs runs, alternating R=1, R=2 (fresh volume each,
          default --lease-ms), then the same workload on a local directory in
          the same temp dir. Page cache dropped before each. Workload, in one
          directory made for it (untimed), one op at a time:
            creates   N empty files (open O_CREAT|O_EXCL, close)    -> ops/s
            stats     os.stat of each, same mount right after the creates
                      (warm: the kernel may answer from its caches)  -> ops/s
            renames   each to a new name in the same directory     -> ops/s
            unlinks   each                                          -> ops/s
            mkdirs    N/10 directories                              -> ops/s
          and creates of N more files by --threads threads at once, in a
          second directory                                          -> ops/s
          (the kernel serializes creates in one directory), and again with
          one directory per thread                                  -> ops/s
          Per-op latencies (p50/p99/max) are kept in the JSON. Reports medians,
          R2/R1 and R1/local.

takeover  For each lease L in --leases (servers started with --lease-ms L),
          --takeover-runs times, R=2, fresh volume, after `status` says
          healthy: one thread loops over "create a 64-byte file in the root
          directory" and "stat it", timing every op; after --kill-after s it
          kill -9s server 1 (ROOT_ID mod K: the root's owner) just before a
          create, and goes on until --after-ops ops after the first op that
          succeeds after the kill. Any op error fails the bench (after the loop,
          with the mount log tail). Reports the longest op (the pause), kill ->
          end of the first successful op, the takeover time in the new
          primary's log, range 1's primary before / after (expected: server 2).
          Then restarts server 1 (same --data/--listen/--lease-ms) and polls
          `status --json` every 0.5 s until health == "healthy"; then a fresh
          mount must list every file created (64 bytes each) and fsck exit 0.

Before and after each phase the number of rustc / cargo processes and the load
average are recorded (the machine may be compiling). Prints tables, writes raw
+ summary JSON. Fails loudly (non-zero exit) on any error or timeout; always
unmounts and stops what it started (by PID) and removes its temp dir (logs of
a failed run are kept). Needs root (FUSE, drop_caches).
Usage:
  python3 bench/metadata.py [--n 2000] [--runs 3] [--leases 2000,10000]
                            [--parts cost,takeover] [--exe /work/bin/morris-meta]
"""

import argparse
import errno
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from lib import loopback  # noqa: E402
from lib.loopback import BenchError, interrupt_on_signals, make_keys, require_root_fuse, run_bench  # noqa: E402
from lib import util  # noqa: E402
from lib.util import drop_caches, finish, log_times, log_warnings, med  # noqa: E402

ROOT_ID = 1  # the root directory's inode id (owner of range ROOT_ID mod k)
PAYLOAD = b"m" * 64  # contents of every takeover-loop file


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def machine_state():
    """rustc/cargo processes running now (another engineer may be compiling) and the load average."""
    def count(name):
        out = subprocess.run(["pgrep", "-c", "-x", name], capture_output=True, text=True)
        return int(out.stdout.strip() or 0)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"rustc": count("rustc"), "cargo": count("cargo"), "loadavg": [float(x) for x in load]}


def run_with_timeout(fn, timeout, what):
    """Runs fn() in a daemon thread; returns its result, re-raises its exception, or raises
    BenchError after `timeout` s (an op stuck in FUSE cannot be interrupted otherwise: the
    cleanup then unmounts lazily and kills the mount, which fails the stuck syscall)."""
    box = {}

    def body():
        try:
            box["r"] = fn()
        except BaseException as e:  # noqa: B902 - handed to the caller
            box["e"] = e

    t = threading.Thread(target=body, daemon=True, name=what)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise BenchError(f"TIMEOUT: {what} still running after {timeout:.0f}s (an op hangs?)")
    if "e" in box:
        raise box["e"]
    return box["r"]


# ---------------------------------------------------------------- cluster

class Volume(loopback.Volume):
    """K servers + one mount through server 0 (never killed here); everything started
    here is ended here, by PID. Servers and the mount run in their own session: a
    Ctrl-C on the terminal reaches only this script, which then unmounts before it
    stops the servers."""

    def __init__(self, exe, base, k, replicas, lease_ms=None, keys=None):
        super().__init__(exe, base, k, replicas, lease_ms=lease_ms, via=0, own_session=True,
                         format_timeout=60, quiet_umount=True, keys=keys)

    def wait_healthy(self, timeout, what, check_alive=()):
        """Polls status every 0.5 s until health == healthy; returns (seconds, timeline, last status)."""
        return super().wait_healthy(timeout, what, check_alive, note=lambda st: {"ranges": range_roles(st)})


def range_roles(st):
    """{range: {"primary": [server indexes], "copy": [...], "detail": [...]}} from status JSON."""
    out = {}
    for s in st.get("servers", []):
        for r in ((s.get("stats") or {}).get("ranges") or []):
            e = out.setdefault(str(r["range"]), {"primary": [], "copy": [], "detail": []})
            e["primary" if r.get("primary") else "copy"].append(s["index"])
            e["detail"].append({"server": s["index"], **{k: r.get(k) for k in
                                ("primary", "ready", "gen", "peer_in_sync", "takeovers")}})
    return out


def primary_of(st, rng):
    p = range_roles(st).get(str(rng), {}).get("primary", [])
    return p[0] if len(p) == 1 else p  # a list if none or several (that would be worth seeing)


def requests_by_op(st):
    """Requests served, summed over the servers, per operation."""
    tot = {}
    for s in st.get("servers", []):
        for op, n in ((s.get("stats") or {}).get("requests_by_op") or []):
            tot[op] = tot.get(op, 0) + n
    return tot


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


# ---------------------------------------------------------------- part 1: cost

def lat_summary(lat):
    s = sorted(lat)
    return {"p50_ms": 1e3 * s[len(s) // 2], "p99_ms": 1e3 * s[min(len(s) - 1, int(len(s) * 0.99))],
            "max_ms": 1e3 * s[-1]}


def timed_ops(fn, items):
    """fn(item) for each item, one at a time; returns (ops/s, latency summary)."""
    lat = []
    pc = time.perf_counter
    t0 = pc()
    for it in items:
        a = pc()
        fn(it)
        lat.append(pc() - a)
    el = pc() - t0
    return len(items) / el, lat_summary(lat)


def create_empty(p):
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def workload(root, n, threads):
    """The metadata workload in a new directory under root; returns {op: ops/s, op_lat: {...}}."""
    r = {}
    d = os.path.join(root, "seq")
    os.mkdir(d)
    r["dir_inode"] = os.stat(d).st_ino
    names = [os.path.join(d, f"f{i:06d}") for i in range(n)]
    renamed = [os.path.join(d, f"g{i:06d}") for i in range(n)]

    r["creates"], r["creates_lat"] = timed_ops(create_empty, names)
    if len(os.listdir(d)) != n:
        raise BenchError(f"{d}: {len(os.listdir(d))} entries after {n} creates")
    r["stats"], r["stats_lat"] = timed_ops(os.stat, names)
    r["renames"], r["renames_lat"] = timed_ops(lambda i: os.rename(names[i], renamed[i]), range(n))
    if sorted(os.listdir(d)) != sorted(os.path.basename(x) for x in renamed):
        raise BenchError(f"{d}: listing after renames is not the renamed names")
    r["unlinks"], r["unlinks_lat"] = timed_ops(os.unlink, renamed)
    if os.listdir(d):
        raise BenchError(f"{d}: {len(os.listdir(d))} entries left after unlinking all")
    dirs = [os.path.join(d, f"d{i:05d}") for i in range(max(1, n // 10))]
    r["mkdirs"], r["mkdirs_lat"] = timed_ops(os.mkdir, dirs)

    # Concurrent creates: `threads` threads, N files in all, one directory (the
    # kernel serializes creates in one directory: it holds the directory's lock
    # across the FUSE CREATE), then one directory per thread.
    pd = os.path.join(root, "par")
    os.mkdir(pd)
    per = [[os.path.join(pd, f"t{t}_{i:06d}") for i in range(t, n, threads)] for t in range(threads)]
    r["creates_par"] = parallel_creates(per, n, [pd])
    pdirs = [os.path.join(root, f"par{t}") for t in range(threads)]
    for x in pdirs:
        os.mkdir(x)
    per = [[os.path.join(pdirs[t], f"f{i:06d}") for i in range(t, n, threads)] for t in range(threads)]
    r["creates_par_dirs"] = parallel_creates(per, n, pdirs)
    return r


def parallel_creates(per, n, dirs):
    """One thread per list of paths, all started at once; returns creates/s over all."""
    threads = len(per)
    barrier = threading.Barrier(threads + 1)
    errs = []

    def worker(lst):
        barrier.wait()
        try:
            for p in lst:
                create_empty(p)
        except OSError as e:
            errs.append(repr(e))

    ths = [threading.Thread(target=worker, args=(lst,), daemon=True) for lst in per]
    for t in ths:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ths:
        t.join()
    el = time.perf_counter() - t0
    if errs:
        raise BenchError(f"parallel creates failed: {errs[:3]}")
    got = sum(len(os.listdir(x)) for x in dirs)
    if got != n:
        raise BenchError(f"{dirs[0]}...: {got} entries after {n} parallel creates")
    return n / el


OPS = ["creates", "stats", "renames", "unlinks", "mkdirs", "creates_par", "creates_par_dirs"]


def cost_variant(a, base, run, replicas, keys):
    """One fresh volume with `replicas`, the workload in its mount; replicas=0: local directory."""
    tag = f"run{run + 1}-{'local' if not replicas else f'R{replicas}'}"
    rd = os.path.join(base, tag)
    os.makedirs(rd)
    r = {"run": run + 1, "variant": "local" if not replicas else f"R{replicas}"}
    vol = None
    try:
        if replicas:
            vol = Volume(a.exe, os.path.join(rd, "volume"), a.servers, replicas, keys=keys)
            mnt = vol.mount(os.path.join(rd, "mnt"))
            if replicas > 1:
                r["healthy_after_s"], _, _ = vol.wait_healthy(60, "format")
            where = mnt
        else:
            where = os.path.join(rd, "local")
            os.makedirs(where)
        drop_caches()
        r["machine_before"] = machine_state()
        r.update(run_with_timeout(lambda: workload(where, a.n, a.threads), a.timeout, f"{tag} workload"))
        r["machine_after"] = machine_state()
        if vol:
            r["dir_owner"] = r["dir_inode"] % vol.k
            st = vol.status()
            r["requests_by_op"] = requests_by_op(st)
            r["health_after"] = st.get("health")
            vol.stop()
            r["log_warnings"] = log_warnings(vol.base)
            vol = None
    finally:
        if vol:
            vol.stop()
    remove_tree(rd)
    log(f"cost {tag}: " + ", ".join(f"{k} {r[k]:.0f}/s" for k in OPS)
        + f"  (rustc {r['machine_before']['rustc']}->{r['machine_after']['rustc']}, "
        f"load {r['machine_before']['loadavg'][0]:.1f})")
    return r


# ---------------------------------------------------------------- part 2: takeover

def takeover_loop(vol, mnt, victim, a, give_up):
    """Create/stat loop in the root directory; kill -9 `victim` before a create after
    a.kill_after s. Returns (ops, t_kill_rel, first_ok_index, wall clock of the kill)."""
    ops = []  # [kind, i, start (s since loop start), seconds, error or None]
    pc = time.perf_counter
    t_start = pc()
    t_kill = None
    wall_kill = None
    first_ok = None
    i = 0
    while True:
        kind = "create" if i % 2 == 0 else "stat"
        path = os.path.join(mnt, f"t{i // 2:06d}")
        if kind == "create" and t_kill is None and pc() - t_start >= a.kill_after:
            wall_kill = time.time()
            vol.kill9(victim)
            t_kill = pc() - t_start
        err = None
        t0 = pc()
        try:
            if kind == "create":
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    if os.write(fd, PAYLOAD) != len(PAYLOAD):
                        err = "short write"
                finally:
                    os.close(fd)
            else:
                sz = os.stat(path).st_size
                if sz != len(PAYLOAD):
                    err = f"stat: size {sz}, expected {len(PAYLOAD)}"
        except OSError as e:
            err = f"{errno.errorcode.get(e.errno, e.errno)}: {e!r}"
        t1 = pc()
        ops.append([kind, i, round(t0 - t_start, 6), round(t1 - t0, 6), err])
        if err:
            log(f"  op {i} ({kind} {os.path.basename(path)}) FAILED after {t1 - t0:.3f}s: {err}")
        if t_kill is not None:
            if err is None and first_ok is None:
                first_ok = len(ops) - 1
            if first_ok is not None and len(ops) - 1 - first_ok >= a.after_ops:
                break
            if t1 - t_start - t_kill > give_up:
                break  # judged by the caller (no success in time)
            if sum(1 for o in ops if o[4]) > 200:
                break
        i += 1
    return ops, t_kill, first_ok, wall_kill


def takeover_run(a, base, lease_ms, run, keys):
    tag = f"lease{lease_ms}-run{run + 1}"
    rd = os.path.join(base, tag)
    os.makedirs(rd)
    r = {"lease_ms": lease_ms, "run": run + 1}
    vol = Volume(a.exe, os.path.join(rd, "volume"), a.servers, 2, lease_ms, keys=keys)
    try:
        victim = ROOT_ID % vol.k
        succ = (victim + 1) % vol.k
        r.update(victim=victim, expected_new_primary=succ)
        mnt = vol.mount(os.path.join(rd, "mnt"))
        r["healthy_after_format_s"], _, st = vol.wait_healthy(60, "format")
        r["range1_primary_before"] = primary_of(st, ROOT_ID % vol.k)
        r["ranges_before"] = range_roles(st)
        marker = f"=== bench metadata.py {tag}: kill {time.time():.3f} ==="
        with open(vol.log_path(succ), "a") as lf:
            lf.write(marker + "\n")
        r["machine_before"] = machine_state()
        give_up = a.takeover_timeout if a.takeover_timeout is not None else 4 * lease_ms / 1e3 + 15
        ops, t_kill, first_ok, wall_kill = run_with_timeout(
            lambda: takeover_loop(vol, mnt, victim, a, give_up), a.kill_after + give_up + 60,
            f"takeover loop ({tag})")
        r["machine_after"] = machine_state()
        r["ops"] = ops
        r["t_kill_s"] = t_kill
        errors = [o for o in ops if o[4]]
        r["errors"] = errors
        after = [o for o in ops if o[2] >= t_kill]
        before = [o for o in ops if o[2] < t_kill]
        longest = max(after, key=lambda o: o[3])
        r["pause_s"] = longest[3]
        r["pause_op"] = longest[:3]
        r["kill_to_first_ok_s"] = (ops[first_ok][2] + ops[first_ok][3] - t_kill) if first_ok is not None else None
        r["first_ok_op"] = ops[first_ok][:2] if first_ok is not None else None
        r["ops_after_kill"] = len(after)
        for label, sel in (("before", before), ("recovered", ops[first_ok + 1:] if first_ok is not None else [])):
            for kind in ("create", "stat"):
                ls = [o[3] for o in sel if o[0] == kind and not o[4]]
                if ls:
                    r[f"{kind}_{label}_p50_ms"] = 1e3 * statistics.median(ls)
                    r[f"{kind}_{label}_max_ms"] = 1e3 * max(ls)
        r["expected_takeover_s"] = (lease_ms * 1.25 + 250) / 1e3  # lease + lease/4 + 250 ms
        r["expected_serving_s"] = r["expected_takeover_s"] + lease_ms / 1e3  # + one lease of grace
        lt = log_times(vol.log_path(succ), marker, {"took_over": "took it over"})
        r["kill_to_takeover_log_s"] = (lt["took_over"] - wall_kill) if lt["took_over"] else None
        log(f"takeover {tag}: killed server {victim} at {t_kill:.2f}s; {len(before)} ops before "
            f"(create p50 {r.get('create_before_p50_ms', float('nan')):.1f} ms); longest op after "
            f"{r['pause_s']:.2f}s ({longest[0]} #{longest[1]}); kill -> first ok "
            f"{r['kill_to_first_ok_s'] if r['kill_to_first_ok_s'] is None else round(r['kill_to_first_ok_s'], 2)}s; "
            f"takeover in log after {r['kill_to_takeover_log_s'] if r['kill_to_takeover_log_s'] is None else round(r['kill_to_takeover_log_s'], 2)}s "
            f"(expected {r['expected_takeover_s']:.2f}, serving {r['expected_serving_s']:.2f}); errors {len(errors)}")
        if errors:
            raise BenchError(
                f"{len(errors)} OP(S) FAILED during the takeover ({tag}); first: {errors[0]}\n"
                f"all failed ops [kind, i, start s, seconds, error]: {json.dumps(errors[:20])}\n"
                f"--- mount log tail ({vol.mount_log}):\n{tail(vol.mount_log)}\n"
                f"--- server {succ} log tail:\n{tail(vol.log_path(succ), 20)}")
        if first_ok is None:
            raise BenchError(f"TIMEOUT: no op succeeded within {give_up:.0f}s of killing server "
                             f"{victim} ({tag}); mount log tail:\n{tail(vol.mount_log)}")
        if len(ops) - 1 - first_ok < a.after_ops:
            raise BenchError(f"loop stopped early: only {len(ops) - 1 - first_ok} ops after the first success")

        st = vol.status()
        r["range1_primary_after"] = primary_of(st, ROOT_ID % vol.k)
        r["ranges_after"] = range_roles(st)
        r["health_after_takeover"] = st.get("health")
        if r["range1_primary_after"] != succ:
            log(f"takeover {tag}: UNEXPECTED: range 1 primary after the takeover is "
                f"{r['range1_primary_after']!r}, expected server {succ}")

        # Restart the victim; time until healthy.
        t0 = time.perf_counter()
        vol.start_server(victim)
        vol.wait_port(victim)
        r["restart_to_healthy_s"], r["restart_timeline"], st = vol.wait_healthy(
            a.timeout, f"restarting server {victim}", check_alive=[victim])
        r["restart_to_healthy_s"] = time.perf_counter() - t0  # including the process start
        r["range1_primary_healthy"] = primary_of(st, ROOT_ID % vol.k)
        r["ranges_healthy"] = range_roles(st)

        # Every file created must be there, through a fresh mount.
        t0 = time.perf_counter()
        vol.umount(mnt)
        r["umount_s"] = time.perf_counter() - t0
        mnt = vol.mount(mnt)
        created = {f"t{o[1] // 2:06d}" for o in ops if o[0] == "create" and not o[4]}

        def check():
            names = set(os.listdir(mnt))
            missing = sorted(created - names)
            bad = [n for n in sorted(created & names) if os.stat(os.path.join(mnt, n)).st_size != len(PAYLOAD)]
            return names, missing, bad

        names, missing, bad = run_with_timeout(check, 120, "listing after restart")
        r["files_created"], r["files_listed"] = len(created), len(names)
        if missing or bad:
            raise BenchError(f"after the takeover and restart: {len(missing)} created file(s) missing "
                             f"({missing[:10]}), {len(bad)} with the wrong size ({bad[:10]})")
        vol.umount(mnt)
        rc, out = vol.fsck()
        r["fsck_rc"], r["fsck_output"] = rc, out
        if rc != 0:
            raise BenchError(f"FSCK after the takeover not clean (rc={rc}):\n{out}")
        log(f"takeover {tag}: range {ROOT_ID % vol.k} primary {r['range1_primary_before']} -> "
            f"{r['range1_primary_after']} (healthy: {r['range1_primary_healthy']}); restart -> healthy "
            f"{r['restart_to_healthy_s']:.1f}s; {len(created)} files all listed; fsck rc 0; "
            f"rustc {r['machine_before']['rustc']}->{r['machine_after']['rustc']}")
        vol.stop()
        r["log_warnings"] = log_warnings(vol.base)
    finally:
        vol.stop()
    remove_tree(rd)
    return r


# ---------------------------------------------------------------- main

def remove_tree(d):
    """rmtree, but never through a mount that is still there (that would delete inside it)."""
    util.remove_tree(d, log)


def trim_ops(r, keep_before=20):
    """The JSON keeps every op from `keep_before` ops before the kill on (and every
    failed op); the thousands of ops before are summarized (count, p50, max)."""
    if "ops_before_window" in r:
        return
    ops, t_kill = r["ops"], r["t_kill_s"]
    first = next((j for j, o in enumerate(ops) if o[2] >= t_kill), len(ops))
    lo = max(0, first - keep_before)
    early = ops[:lo]
    r["ops_before_window"] = {kind: {"count": len(ls), "p50_s": statistics.median(ls) if ls else None,
                                     "max_s": max(ls) if ls else None}
                              for kind in ("create", "stat")
                              for ls in [[o[3] for o in early if o[0] == kind and not o[4]]]}
    r["ops"] = [o for o in early if o[4]] + ops[lo:]
    r["ops_fields"] = ["kind", "i", "start_s", "seconds", "error"]


def fmt(v, spec="10.0f"):
    return f"{'-':>{spec.split('.')[0]}}" if v is None else f"{v:{spec}}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="files per op kind in the cost part")
    ap.add_argument("--runs", type=int, default=3, help="runs of the cost part (each replicas value and local)")
    ap.add_argument("--replicas", default="1,2", help="replicas values of the cost part (1 first: ratios are to it)")
    ap.add_argument("--threads", type=int, default=8, help="threads of the concurrent creates")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--parts", default="cost,takeover")
    ap.add_argument("--leases", default="2000,10000", help="--lease-ms values of the takeover part")
    ap.add_argument("--takeover-runs", type=int, default=None, help="runs per lease (default: --runs)")
    ap.add_argument("--kill-after", type=float, default=3.0, help="seconds of the loop before kill -9")
    ap.add_argument("--after-ops", type=int, default=20, help="ops after the first success post-kill")
    ap.add_argument("--takeover-timeout", type=float, default=None,
                    help="seconds after the kill for an op to succeed (default 4 leases + 15)")
    ap.add_argument("--timeout", type=float, default=600, help="timeout of a workload / of reaching healthy")
    ap.add_argument("--exe", default=os.environ.get("MORRIS_EXE", "/work/bin/morris-meta"))
    ap.add_argument("--dir", default="/var/tmp", help="parent of the temp dir (on the disk under test)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-metadata.json"))
    a = ap.parse_args()
    parts = [p for p in a.parts.split(",") if p]
    leases = [int(x) for x in a.leases.split(",") if x]
    reps = [int(x) for x in a.replicas.split(",") if x]
    if not reps or reps[0] != 1:
        sys.exit("metadata.py: --replicas must start with 1 (the ratios are to it)")
    a.takeover_runs = a.runs if a.takeover_runs is None else a.takeover_runs

    require_root_fuse("metadata.py", a.exe)
    if set(parts) - {"cost", "takeover"}:
        sys.exit(f"metadata.py: unknown part(s) in --parts {a.parts}")
    if "takeover" in parts and a.servers < 3:
        sys.exit("metadata.py: the takeover part needs >= 3 servers (server 0 mounts, 1 dies, 2 takes over)")
    fmt_help = subprocess.run([a.exe, "format", "--help"], capture_output=True, text=True).stdout
    if "directories and leases" not in fmt_help:
        sys.exit(f"metadata.py: `{a.exe} format --help` does not mention metadata copies: "
                 "not a build with mirrored metadata")

    base = tempfile.mkdtemp(prefix="morris-metadata-", dir=a.dir)

    # Only the first signal interrupts; later ones must not cut the cleanup short.
    interrupt_on_signals(ignore_later=lambda sig: log(f"signal {sig} ignored: cleaning up"))
    cost, takeover = [], []
    phases = []  # machine state around each part
    t_all = time.time()

    def parts_run():
        keys = make_keys(a.exe, os.path.join(base, "keys"))  # once: every volume of the run uses them
        if "cost" in parts:
            ms0 = machine_state()
            for run in range(a.runs):
                for rep in (*reps, 0):
                    log(f"=== cost run {run + 1}/{a.runs}, {'local' if not rep else f'R={rep}'}, N={a.n}, dir {base}")
                    cost.append(cost_variant(a, base, run, rep, keys))
            phases.append({"part": "cost", "before": ms0, "after": machine_state()})
        if "takeover" in parts:
            for lease in leases:
                ms0 = machine_state()
                for run in range(a.takeover_runs):
                    log(f"=== takeover, lease {lease} ms, run {run + 1}/{a.takeover_runs}")
                    takeover.append(takeover_run(a, base, lease, run, keys))
                phases.append({"part": f"takeover lease {lease}", "before": ms0, "after": machine_state()})

    failure = run_bench(parts_run, base, remove_tree, log, a.dir, "morris-metadata-failure-logs-")

    # ---- summary
    variants = [f"R{x}" for x in reps] + ["local"]
    by = {v: [r for r in cost if r["variant"] == v] for v in variants}
    cost_med = {v: {k: med(rows, k) for k in OPS} for v, rows in by.items()}
    for v, rows in by.items():
        for k in OPS[:5]:
            for q in ("p50_ms", "p99_ms", "max_ms"):
                vals = [r[f"{k}_lat"][q] for r in rows if f"{k}_lat" in r]
                if vals:
                    cost_med[v][f"{k}_{q}"] = statistics.median(vals)

    def ratio(x, y):
        return x / y if x and y else None

    cost_ratios = {k: {**{f"{v}/R1": ratio(cost_med[v][k], cost_med["R1"][k]) for v in variants[1:-1]},
                       **{f"{v}/local": ratio(cost_med[v][k], cost_med["local"][k]) for v in variants[:-1]}}
                   for k in OPS} if cost else {}
    tk_keys = ["pause_s", "kill_to_first_ok_s", "kill_to_takeover_log_s", "expected_takeover_s",
               "expected_serving_s", "restart_to_healthy_s", "create_before_p50_ms", "create_recovered_p50_ms",
               "create_recovered_max_ms", "umount_s"]
    tk_med = {}
    for lease in sorted({r["lease_ms"] for r in takeover}):
        rows = [r for r in takeover if r["lease_ms"] == lease]
        tk_med[str(lease)] = {k: med(rows, k) for k in tk_keys}
        tk_med[str(lease)]["errors"] = sum(len(r["errors"]) for r in rows)
        tk_med[str(lease)]["range1_primary"] = [[r.get("range1_primary_before"), r.get("range1_primary_after"),
                                                 r.get("range1_primary_healthy")] for r in rows]
    commit = subprocess.run(["git", "-C", os.path.dirname(BENCH), "log", "-1", "--format=%h"],
                            capture_output=True, text=True).stdout.strip()
    summary = {"date": time.strftime("%Y-%m-%d"), "command": " ".join([sys.executable] + sys.argv),
               "exe": a.exe, "head_commit": commit, "servers": a.servers, "n": a.n, "threads": a.threads,
               "runs": a.runs, "takeover_runs": a.takeover_runs, "leases_ms": leases, "parts": parts,
               "stats_note": "stats: same mount right after the creates (warm caches)",
               "cost_runs_completed": len(cost), "takeover_runs_completed": len(takeover),
               "failure": failure, "elapsed_s": time.time() - t_all, "machine_phases": phases,
               "cost_median": cost_med, "cost_ratios": cost_ratios, "takeover_median": tk_med}
    for r in takeover:
        trim_ops(r)
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "raw": {"cost": cost, "takeover": takeover}}, f, indent=1)

    if cost:
        nr = len(by["R1"])
        print(f"\nMetadata ops/s, {a.servers} servers on loopback, one FUSE mount, N={a.n}, "
              f"median of {nr} run(s) (stats: warm, same mount)")
        mirrored = variants[1:-1]
        print(f"{'op':<26}{'local':>10}" + "".join(f"{'R=' + v[1:]:>10}" for v in variants[:-1])
              + "".join(f"{v + '/R1':>8}" for v in mirrored) + f"{'R1/local':>10}   runs "
              + " | ".join(variants))
        labels = {"creates": "create (1 thread)", "stats": "stat (warm)", "renames": "rename",
                  "unlinks": "unlink", "mkdirs": f"mkdir (N/10)", "creates_par": f"create ({a.threads} thr, 1 dir)",
                  "creates_par_dirs": f"create ({a.threads} thr, {a.threads} dirs)"}
        for k in OPS:
            m = {v: cost_med[v][k] for v in by}
            rr = cost_ratios[k]
            runs = " | ".join(", ".join(f"{r[k]:.0f}" for r in by[v]) for v in variants)
            print(f"{labels[k]:<26}{fmt(m['local'])}" + "".join(fmt(m[v]) for v in variants[:-1])
                  + "".join(fmt(rr[f"{v}/R1"], '8.2f') for v in mirrored)
                  + f"{fmt(rr['R1/local'], '10.3f')}   {runs}")
        print(f"\nper-op latency, median over runs of p50 / p99 (ms)")
        for k in OPS[:5]:
            print(f"{labels[k]:<26}" + "   ".join(
                f"{v} {fmt(cost_med[v].get(f'{k}_p50_ms'), '.3f')}/{fmt(cost_med[v].get(f'{k}_p99_ms'), '.3f')}"
                for v in variants))
    if takeover:
        print(f"\nTakeover of range {ROOT_ID % a.servers} (root's owner, server {ROOT_ID % a.servers}, "
              f"kill -9), R=2, create+stat loop in the root; median of {a.takeover_runs} run(s) per lease")
        hdr = (f"{'lease ms':>9}{'longest op s':>14}{'kill->ok s':>12}{'takeover(log) s':>17}"
               f"{'expect take/serve s':>21}{'errors':>8}{'restart->healthy s':>20}   range-1 primary before/after/healthy")
        print(hdr)
        for lease, m in tk_med.items():
            print(f"{lease:>9}{fmt(m['pause_s'], '14.2f')}{fmt(m['kill_to_first_ok_s'], '12.2f')}"
                  f"{fmt(m['kill_to_takeover_log_s'], '17.2f')}"
                  f"{m['expected_takeover_s']:>13.2f} / {m['expected_serving_s']:<5.2f}{m['errors']:>8}"
                  f"{fmt(m['restart_to_healthy_s'], '20.1f')}   {m['range1_primary']}")
        for r in takeover:
            print(f"  lease {r['lease_ms']} run {r['run']}: longest {r['pause_s']:.2f}s, kill->ok "
                  f"{r['kill_to_first_ok_s']:.2f}s, create p50 before {r.get('create_before_p50_ms', float('nan')):.1f} ms"
                  f" / after {r.get('create_recovered_p50_ms', float('nan')):.1f} ms, restart->healthy "
                  f"{r.get('restart_to_healthy_s', float('nan')):.1f}s")
    for p in phases:
        print(f"machine during {p['part']}: rustc {p['before']['rustc']} -> {p['after']['rustc']}, "
              f"cargo {p['before']['cargo']} -> {p['after']['cargo']}, load {p['before']['loadavg'][0]} -> "
              f"{p['after']['loadavg'][0]}")
    finish(a.out, failure)


if __name__ == "__main__":
    main()
