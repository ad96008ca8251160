"""BLAST on morris (after the CEFT-PVFS paper): a deterministic synthetic nucleotide database is
stored on morris (4 server hosts) and searched with blastn by 1, 2, 4 client hosts at once, each
with a 568-bp query; beside it, mpiBLAST style, every client host first copies the database from
morris to its local disk (copy time reported separately) and searches the local copy.

Database: --bases nucleotides (default 1 Gbp, i.e. a ~1 GiB FASTA) in sequences of 2-20 kbp,
from Python's random.Random(seed); the query is 568 bp cut from the middle of one sequence with
5 % of its bases substituted (seeded), so the expected top hit is known and checked. The search is
`blastn -task blastn` (word size 11, the classic blastn the CEFT paper ran through blastall), one
thread per host; every host's output must equal a reference search of the generated database.
"""

import hashlib
import os
import random
import shutil
import statistics
import subprocess
import time

from .experiments import (MiB, RESULTS, goodput_mib, log, med, mount_args, plot, tag_suffix, save, verify_after,
                          verify_or_die)
from .hosts import Cluster, fmt_rate, parse_rate
from .systems import Morris, cold

QUERY_LEN = 568
DB_NAME = "synth"


def generate(cache, bases, seed):
    """Build (once) FASTA + makeblastdb in cache/<bases>-<seed>/; returns (dbdir, query, meta)."""
    d = os.path.join(cache, f"{bases}-{seed}")
    dbdir = os.path.join(d, "db")
    q = os.path.join(d, "query.fa")
    done = os.path.join(d, "DONE")
    if os.path.exists(done):
        return dbdir, q, eval(open(done).read())  # our own file: {"sequences":..,"target":..}
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(dbdir)
    rng = random.Random(seed)
    table = bytes(b"ACGT"[i & 3] for i in range(256))
    fa = os.path.join(d, "db.fa")
    t = time.perf_counter()
    left, i = bases, 0
    target_idx = None
    with open(fa, "wb") as f:
        while left > 0:
            n = min(left, rng.randrange(2000, 20001))
            seq = rng.randbytes(n).translate(table)
            f.write(b">seq%07d synthetic seed=%d\n" % (i, seed))
            f.write(b"\n".join(seq[j:j + 80] for j in range(0, n, 80)) + b"\n")
            if target_idx is None and bases - left >= bases // 2 and n >= 4 * QUERY_LEN:
                target_idx, target_seq = i, seq
            left -= n
            i += 1
    if target_idx is None:  # tiny databases: use the last sequence
        target_idx, target_seq = i - 1, seq
    log(f"blast: generated {bases / 1e6:.0f} Mbp in {i} sequences in {time.perf_counter() - t:.0f} s")
    qrng = random.Random(seed + 1)
    start = len(target_seq) // 2 - QUERY_LEN // 2
    qs = bytearray(target_seq[start:start + QUERY_LEN])
    for p in qrng.sample(range(QUERY_LEN), QUERY_LEN // 20):
        qs[p] = b"ACGT"[(b"ACGT".index(qs[p]) + qrng.randrange(1, 4)) % 4]
    with open(q, "wb") as f:
        f.write(b">query568 from seq%07d\n" % target_idx + bytes(qs) + b"\n")
    t = time.perf_counter()
    subprocess.run(["makeblastdb", "-in", fa, "-dbtype", "nucl", "-out", os.path.join(dbdir, DB_NAME),
                    "-max_file_sz", "4GB", "-title", f"synthetic {bases} seed {seed}"],
                   check=True, capture_output=True)
    log(f"blast: makeblastdb took {time.perf_counter() - t:.0f} s")
    os.unlink(fa)
    meta = {"sequences": i, "target": f"seq{target_idx:07d}"}
    with open(done, "w") as f:
        f.write(repr(meta))
    return dbdir, q, meta


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def copy_tree(src, dst):
    os.makedirs(dst, exist_ok=True)
    for f in sorted(os.listdir(src)):
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))


def run_blasts(jobs, query, task):
    """jobs: [(host, dbpath, outfile)]; all blastn start at once. Returns per-host dicts
    (wall seconds, cpu seconds of blastn, output sha256)."""
    procs = []
    t0 = time.perf_counter()
    for h, db, out in jobs:
        procs.append((h, out, h.spawn(["blastn", "-task", task, "-db", db, "-query", query, "-outfmt", "6",
                                       "-num_threads", "1", "-out", out],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    res = []
    for h, out, p in procs:
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"blastn in {h.ns} failed ({p.returncode}): {p.stderr.read().decode()[-1500:]}")
        res.append({"host": h.ns, "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
                    "sha256": hashlib.sha256(open(out, "rb").read()).hexdigest(),
                    "top_hit": (open(out).readline().split("\t") + ["", ""])[1]})
    return res


def run_copies(jobs):
    """jobs: [(host, src, dst)] copied at once (cp in each host); returns per-host seconds."""
    t0 = time.perf_counter()
    procs = [(h, h.spawn(["cp", "-r", src, dst], stderr=subprocess.PIPE)) for h, src, dst in jobs]
    out = []
    for h, p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"copy in {h.ns} failed: {p.stderr.read().decode()}")
        out.append(time.perf_counter() - t0)
    subprocess.run(["sync"], check=True)
    return out


def blast(a):
    rate = parse_rate(a.rate)
    ns = [int(x) for x in a.clients.split(",")]
    n_cli = max(ns)
    dbsrc, query, meta = generate(a.cache, a.bases, a.seed)
    db_bytes = dir_bytes(dbsrc)
    log(f"blast: database {db_bytes / MiB:.0f} MiB of BLAST files, query {query}")
    # Reference output: search the generated database once (warm, local) for the correctness check.
    ref = subprocess.run(["blastn", "-task", a.task, "-db", os.path.join(dbsrc, DB_NAME), "-query", query, "-outfmt", "6",
                          "-num_threads", "1"], check=True, capture_output=True)
    ref_sha = hashlib.sha256(ref.stdout).hexdigest()
    ref_top = (ref.stdout.decode().split("\n")[0].split("\t") + ["", ""])[1]
    if ref_top != meta["target"]:
        raise RuntimeError(f"blast reference search: top hit {ref_top!r}, expected {meta['target']}")
    raw = {"morris": {str(n): [] for n in ns}, "local": {str(n): [] for n in ns}}
    with Cluster(4 + n_cli, rate, prefix=a.prefix, subnet=a.subnet) as cl:
        srv, cli = cl.hosts[:4], cl.hosts[4:]
        ver = verify_or_die(cl, "before blast")
        mo = Morris(cl, srv, mount_args=mount_args(a))
        try:
            m = mo.mount(cli[0])
            t = time.perf_counter()
            copy_tree(dbsrc, os.path.join(m, "blastdb"))
            subprocess.run(["sync"], check=True)
            log(f"blast: stored the database on morris in {time.perf_counter() - t:.0f} s")
            mo.umount_all()
            for run in range(a.runs):
                for n in ns:
                    hosts = cli[:n]
                    # 1) search the database where it lies, on morris (fresh mounts, cold caches).
                    cold()
                    mnts = [mo.mount(h) for h in hosts]
                    r = run_blasts([(h, os.path.join(mp, "blastdb", DB_NAME), os.path.join(h.dir, "out-morris.tsv"))
                                    for h, mp in zip(hosts, mnts)], query, a.task)
                    raw["morris"][str(n)].append({"search": r})
                    # 2) mpiBLAST style: copy to each host's local disk (timed apart), then search it cold.
                    mo.umount_all()
                    cold()
                    mnts = [mo.mount(h) for h in hosts]
                    locs = [os.path.join(h.dir, "localdb") for h in hosts]
                    for lc in locs:
                        shutil.rmtree(lc, ignore_errors=True)
                    c = run_copies([(h, os.path.join(mp, "blastdb"), lc) for h, mp, lc in zip(hosts, mnts, locs)])
                    mo.umount_all()
                    cold()
                    r2 = run_blasts([(h, os.path.join(lc, DB_NAME), os.path.join(h.dir, "out-local.tsv"))
                                     for h, lc in zip(hosts, locs)], query, a.task)
                    raw["local"][str(n)].append({"copy_s": c, "search": r2})
                    for lc in locs:
                        shutil.rmtree(lc, ignore_errors=True)
                    for x in r + r2:
                        if x["sha256"] != ref_sha:
                            raise RuntimeError(f"blastn output in {x['host']} differs from the reference search")
                    log(f"run {run + 1}/{a.runs} {n} hosts: morris search {max(x['wall_s'] for x in r):.1f} s "
                        f"(cpu {statistics.mean(x['cpu_s'] for x in r):.1f} s); local copy {max(c):.1f} s + "
                        f"search {max(x['wall_s'] for x in r2):.1f} s (cpu {statistics.mean(x['cpu_s'] for x in r2):.1f} s)")
            ver_after = verify_after(cl, "blast", locals())
        finally:
            mo.stop()
    summary = {"morris": {}, "local": {}}
    for n in ns:
        rm, rl = raw["morris"][str(n)], raw["local"][str(n)]
        summary["morris"][str(n)] = {"search_s": med([max(x["wall_s"] for x in r["search"]) for r in rm]),
                                     "cpu_s": med([statistics.mean(x["cpu_s"] for x in r["search"]) for r in rm])}
        summary["local"][str(n)] = {"search_s": med([max(x["wall_s"] for x in r["search"]) for r in rl]),
                                    "cpu_s": med([statistics.mean(x["cpu_s"] for x in r["search"]) for r in rl]),
                                    "copy_s": med([max(r["copy_s"]) for r in rl])}
        summary["morris"][str(n)]["cpu_share"] = summary["morris"][str(n)]["cpu_s"] / summary["morris"][str(n)]["search_s"]
    link = goodput_mib(rate)
    lines = [f"BLAST (blastn -task {a.task}, 568-bp query) on {4 + n_cli} emulated hosts, links {fmt_rate(rate)} "
             f"(goodput {link:.1f} MiB/s), {a.bases / 1e6:.0f} Mbp synthetic db = {db_bytes / MiB:.0f} MiB of "
             f"BLAST files on 4 morris servers; seconds, slowest host, median of {a.runs} runs",
             f"{'hosts':>6}{'morris search':>15}{'blastn cpu':>12}{'local search':>14}{'blastn cpu':>12}"
             f"{'copy to local':>15}{'copy+local':>12}"]
    for n in ns:
        sm, sl = summary["morris"][str(n)], summary["local"][str(n)]
        lines.append(f"{n:>6}{sm['search_s']:>15.1f}{sm['cpu_s']:>12.1f}{sl['search_s']:>14.1f}{sl['cpu_s']:>12.1f}"
                     f"{sl['copy_s']:>15.1f}{sl['copy_s'] + sl['search_s']:>12.1f}")
    lines.append(f"db read time at one link's goodput: {db_bytes / MiB / link:.1f} s; the machine has 2 cores, "
                 f"so {max(ns)} concurrent blastn share them (CPU-bound when cpu ~ search time)")
    print("\n".join(lines))
    p = save("blast" + tag_suffix(a), {"args": vars(a), "rate_bps": rate, "db_bases": a.bases, "db_bytes": db_bytes,
                       "link_goodput_mib_s": link, "reference_sha256": ref_sha, "target": meta["target"],
                       "summary": summary, "raw": raw, "verify_before": ver, "verify_after": ver_after,
                       "table": lines})
    plot("blast" + tag_suffix(a), p)
