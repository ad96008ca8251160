"""The papers' experiments on an emulated cluster (see cli.py for the commands)."""

import json
import os
import statistics
import subprocess
import sys
import time

from .hosts import PAYLOAD_EFF, Cluster, ShapingError, fmt_rate, parse_rate
from .systems import (MiB, Morris, MooseFS, build_nfsread, cold, concurrent_reads, fuse_reader,
                      ganesha_class, nfs_reader, write_file)

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DOCS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs")
DATE = time.strftime("%Y-%m-%d")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def goodput_mib(rate_bps):
    """Payload MiB/s a TCP stream can get through a link shaped to rate_bps."""
    return rate_bps * PAYLOAD_EFF / 8 / MiB


def command_line():
    return "python3 bench/cluster " + " ".join(sys.argv[1:])


def tag_suffix(a):
    t = getattr(a, "tag", "") or ""
    return "-" + t.lstrip("-") if t else ""


def mount_args(a):
    ra = getattr(a, "morris_readahead", None)
    return ["--readahead", ra] if ra else []


def binary_id():
    """(path, mtime, sha256 prefix) of the morris binary the runs exec."""
    import hashlib
    exe = os.environ.get("MORRIS_EXE", "/work/bin/morris")
    try:
        h = hashlib.sha256()
        with open(exe, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        return {"path": exe, "mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(exe))),
                "sha256": h.hexdigest()[:16]}
    except OSError as e:
        return {"path": exe, "error": str(e)}


BINARY_AT_START = binary_id()


def save(name, data):
    os.makedirs(RESULTS, exist_ok=True)
    p = os.path.join(RESULTS, f"{name}.json")
    now = binary_id()
    data = {"experiment": name, "date": DATE, "command": command_line(), "morris_binary": BINARY_AT_START,
            **({"morris_binary_changed_during_run_to": now} if now != BINARY_AT_START else {}), **data}
    if now != BINARY_AT_START:
        log(f"WARNING: {now['path']} was replaced during the run; figures mix two builds")
    with open(p, "w") as f:
        json.dump(data, f, indent=1)
    log(f"wrote {p}")
    return p


def plot(name, json_path):
    from . import plots
    out = os.path.join(DOCS, f"cluster-{name}.png")
    plots.plot(json_path, out)
    log(f"wrote {out}")


def verify_or_die(cl, when):
    try:
        return cl.verify(log=log)
    except ShapingError as e:
        raise ShapingError(f"{when}: {e}") from None


def setup_ganesha(cl, host, size, seed):
    Ganesha = ganesha_class()
    exp = os.path.join(host.dir, "nfs-export")
    os.makedirs(exp, exist_ok=True)
    write_file(os.path.join(exp, "big"), size, seed=seed)
    g = Ganesha(exp, os.path.join(host.dir, "ganesha"), netns=host.ns, bind_addr=host.addr, port=2049)
    g.start()
    return g


def verify_after(cl, name, state):
    """Re-check the links after the runs; if off, keep the raw figures aside (NAME.rejected.json,
    for diagnosis only) and refuse to report."""
    try:
        return verify_or_die(cl, f"after {name}")
    except ShapingError:
        keep = {k: state[k] for k in ("raw", "ops") if k in state}
        save(f"{name}.rejected", {"why": "link shaping check after the runs failed", **keep})
        raise


class Sys:
    """One file system under test with a uniform 'mount clients / readers / unmount' face."""

    def __init__(self, name, readers, umount=lambda: None):
        self.name, self.readers, self.umount = name, readers, umount


def morris_sys(mo, name="morris"):
    def readers(clients):
        return [fuse_reader(h, os.path.join(mo.mount(h), "big")) for h in clients]
    return Sys(name, readers, mo.umount_all)


def mfs_sys(mfs):
    def readers(clients):
        return [fuse_reader(h, os.path.join(mfs.mount(h), "big")) for h in clients]
    return Sys("moosefs", readers, mfs.umount_all)


def nfs_sys(g, nfsread, depth):
    def readers(clients):
        return [nfs_reader(h, g.url("big"), nfsread, depth) for h in clients]
    return Sys("nfs", readers)


def run_read(system, clients, size):
    cold()
    try:
        jobs = system.readers(clients)
        return concurrent_reads(jobs, expect_size=size)
    finally:
        system.umount()


# ================================================================================== Fig. 4
def fig4(a):
    """MORRIS Fig. 4: 4 servers, 1..4 client hosts reading the same file at once."""
    systems = a.systems.split(",")
    size, rate = a.size, parse_rate(a.rate)
    n_cli = 4
    n_hosts = 4 + n_cli + (1 if "moosefs" in systems else 0)
    raw = {s: {str(n): [] for n in range(1, n_cli + 1)} for s in systems}
    ops = []
    with Cluster(n_hosts, rate, prefix=a.prefix, subnet=a.subnet) as cl:
        srv, cli = cl.hosts[:4], cl.hosts[4:4 + n_cli]
        ver = verify_or_die(cl, "before fig4")
        sysobjs = []
        stoppers = []
        try:
            if "morris" in systems:
                mo = Morris(cl, srv, mount_args=mount_args(a))
                stoppers.append(mo.stop)
                log(f"writing {size / MiB:.0f} MiB into morris from {cli[0].ns} ...")
                write_file(os.path.join(mo.mount(cli[0]), "big"), size, seed=a.seed)
                mo.umount_all()
                sysobjs.append(morris_sys(mo))
            if "nfs" in systems:
                g = setup_ganesha(cl, srv[0], size, a.seed)
                stoppers.append(g.stop)
                sysobjs.append(nfs_sys(g, build_nfsread(cl.workdir), a.nfs_depth))
            if "moosefs" in systems:
                mfs = MooseFS(cl, cl.hosts[8], srv)
                stoppers.append(mfs.stop)
                m = mfs.mount(cli[0])
                cli[0].run(["mfssetgoal", "-r", "1", m])
                log(f"writing {size / MiB:.0f} MiB into MooseFS ...")
                write_file(os.path.join(m, "big"), size, seed=a.seed)
                mfs.umount_all()
                sysobjs.append(mfs_sys(mfs))
            for run in range(a.runs):
                for n in range(1, n_cli + 1):
                    for s in sysobjs:
                        before = mo.op_counts() if s.name == "morris" and n == n_cli else None
                        r = run_read(s, cli[:n], size)
                        if before is not None:
                            after = mo.op_counts()
                            ops.append({srvname: {k: v - before.get(srvname, {}).get(k, 0) for k, v in d.items()
                                                  if v != before.get(srvname, {}).get(k, 0)}
                                        for srvname, d in after.items()})
                        raw[s.name][str(n)].append(r)
                        log(f"run {run + 1}/{a.runs} {s.name:<12} {n} readers: per-client "
                            + " ".join(f"{x:.1f}" for x in r["per_client"])
                            + f"  aggregate {r['aggregate']:.1f} MiB/s  cpu {r['cpu']['busy']:.0%}")
            ver_after = verify_after(cl, "fig4", locals())
        finally:
            for st in reversed(stoppers):
                st()
    link = goodput_mib(rate)
    summary = {}
    for s in systems:
        summary[s] = {}
        for n in range(1, n_cli + 1):
            rs = raw[s][str(n)]
            summary[s][str(n)] = {
                "per_client": med([statistics.mean(r["per_client"]) for r in rs]),
                "per_client_min": med([min(r["per_client"]) for r in rs]),
                "aggregate": med([r["aggregate"] for r in rs]),
                "cpu_busy": med([r["cpu"]["busy"] for r in rs]),
            }
        one, four = summary[s]["1"], summary[s][str(n_cli)]
        summary[s]["per_client_ratio"] = four["per_client"] / one["per_client"]
        summary[s]["aggregate_ratio"] = four["aggregate"] / one["aggregate"]
    lines = [f"Fig. 4 on {n_hosts} emulated hosts, every link {fmt_rate(rate)} (TCP goodput {link:.1f} MiB/s), "
             f"file {size / MiB:.0f} MiB, cold client cache, median of {a.runs} runs",
             f"{'readers':>8} " + " ".join(f"{s + ' per-client':>22}{s + ' aggr':>17}" for s in systems)]
    for n in range(1, n_cli + 1):
        lines.append(f"{n:>8} " + " ".join(f"{summary[s][str(n)]['per_client']:>22.1f}{summary[s][str(n)]['aggregate']:>17.1f}"
                                           for s in systems))
    for s in systems:
        lines.append(f"{s}: per-client at {n_cli} readers = {summary[s]['per_client_ratio']:.1%} of 1 reader; "
                     f"aggregate x{summary[s]['aggregate_ratio']:.2f}")
    goals = {}
    if "morris" in systems:
        goals = {"per_client_4_over_1 >= 0.95": summary["morris"]["per_client_ratio"] >= 0.95,
                 "aggregate_4_over_1 >= 3.8": summary["morris"]["aggregate_ratio"] >= 3.8}
        lines.append("morris goals: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in goals.items()))
    print("\n".join(lines))
    p = save("fig4" + tag_suffix(a), {"args": vars(a), "rate_bps": rate, "link_goodput_mib_s": link, "size": size,
                      "summary": summary, "goals": goals, "raw": raw, "morris_ops_4_readers": ops,
                      "verify_before": ver, "verify_after": ver_after, "table": lines})
    plot("fig4" + tag_suffix(a), p)


# ================================================================================== Fig. 5
def fig5(a):
    """MORRIS Fig. 5: 6 client hosts, 1, 2 and 4 server hosts, total throughput vs one NFS server."""
    systems = a.systems.split(",")
    size, rate = a.size, parse_rate(a.rate)
    n_cli = 6
    ks = [int(x) for x in a.servers.split(",")]
    n_srv = max(ks)
    raw = {}
    with Cluster(n_srv + n_cli, rate, prefix=a.prefix, subnet=a.subnet) as cl:
        srv, cli = cl.hosts[:n_srv], cl.hosts[n_srv:]
        ver = verify_or_die(cl, "before fig5")
        sysobjs, stoppers = [], []
        try:
            if "morris" in systems:
                for k in ks:
                    mo = Morris(cl, srv[:k], port=7700 + k, mount_args=mount_args(a))
                    stoppers.append(mo.stop)
                    log(f"writing {size / MiB:.0f} MiB into morris with {k} servers ...")
                    write_file(os.path.join(mo.mount(cli[0], name=f"morris{k}"), "big"), size, seed=a.seed)
                    mo.umount_all()
                    s = morris_sys(mo, name=f"morris-{k}srv")

                    def readers(clients, mo=mo, k=k):
                        return [fuse_reader(h, os.path.join(mo.mount(h, name=f"morris{k}"), "big")) for h in clients]
                    s.readers = readers
                    sysobjs.append(s)
            if "nfs" in systems:
                g = setup_ganesha(cl, srv[0], size, a.seed)
                stoppers.append(g.stop)
                sysobjs.append(nfs_sys(g, build_nfsread(cl.workdir), a.nfs_depth))
            for s in sysobjs:
                raw[s.name] = []
            for run in range(a.runs):
                for s in sysobjs:
                    r = run_read(s, cli, size)
                    raw[s.name].append(r)
                    log(f"run {run + 1}/{a.runs} {s.name:<14} 6 readers: total {r['aggregate']:.1f} MiB/s "
                        f"per-client " + " ".join(f"{x:.1f}" for x in r["per_client"]) + f"  cpu {r['cpu']['busy']:.0%}")
            ver_after = verify_after(cl, "fig5", locals())
        finally:
            for st in reversed(stoppers):
                st()
    link = goodput_mib(rate)
    summary = {}
    for name, rs in raw.items():
        k = 1 if name == "nfs" else int(name.split("-")[1].rstrip("srv"))
        summary[name] = {"servers": k, "total": med([r["aggregate"] for r in rs]),
                         "per_client": med([statistics.mean(r["per_client"]) for r in rs]),
                         "server_links_capacity": k * link, "client_links_capacity": n_cli * link,
                         "cpu_busy": med([r["cpu"]["busy"] for r in rs])}
        summary[name]["of_server_links"] = summary[name]["total"] / (k * link)
        summary[name]["of_client_links"] = summary[name]["total"] / (n_cli * link)
    lines = [f"Fig. 5 on {n_srv + n_cli} emulated hosts, every link {fmt_rate(rate)} (goodput {link:.1f} MiB/s), "
             f"6 client hosts, file {size / MiB:.0f} MiB, cold client cache, median of {a.runs} runs",
             f"{'system':<14}{'servers':>8}{'total MiB/s':>13}{'per-client':>12}{'of server links':>17}{'of client links':>17}"]
    for name, s in summary.items():
        lines.append(f"{name:<14}{s['servers']:>8}{s['total']:>13.1f}{s['per_client']:>12.1f}"
                     f"{s['of_server_links']:>17.0%}{s['of_client_links']:>17.0%}")
    mor = [summary[f"morris-{k}srv"]["total"] for k in ks if f"morris-{k}srv" in summary]
    goals = {}
    if len(mor) > 1:
        grows = all(b > a_ * 1.5 for a_, b in zip(mor, mor[1:]))
        goals = {"total grows with servers (each step >1.5x) until client links are full": grows}
        lines.append("morris goal: " + ("met" if grows else "MISSED"))
    print("\n".join(lines))
    p = save("fig5" + tag_suffix(a), {"args": vars(a), "rate_bps": rate, "link_goodput_mib_s": link, "size": size,
                      "summary": summary, "goals": goals, "raw": raw, "verify_before": ver,
                      "verify_after": ver_after, "table": lines})
    plot("fig5" + tag_suffix(a), p)


# ================================================================================== single client
def single(a):
    """One client host with a link 4x faster than each of 4 servers' reads one file."""
    size, rate = a.size, parse_rate(a.rate)
    crate = rate * a.factor
    raw = []
    ops = []
    with Cluster(5, rate, rates={4: crate}, prefix=a.prefix, subnet=a.subnet) as cl:
        srv, c = cl.hosts[:4], cl.hosts[4]
        ver = verify_or_die(cl, "before single")
        mo = Morris(cl, srv, mount_args=mount_args(a))
        try:
            log(f"writing {size / MiB:.0f} MiB into morris ...")
            write_file(os.path.join(mo.mount(c), "big"), size, seed=a.seed)
            mo.umount_all()
            s = morris_sys(mo)
            for run in range(a.runs):
                before = mo.op_counts()
                r = run_read(s, [c], size)
                after = mo.op_counts()
                ops.append({sn: {k: v - before.get(sn, {}).get(k, 0) for k, v in d.items()
                                 if v != before.get(sn, {}).get(k, 0)} for sn, d in after.items()})
                raw.append(r)
                log(f"run {run + 1}/{a.runs}: {r['aggregate']:.1f} MiB/s cpu {r['cpu']['busy']:.0%}")
            ver_after = verify_after(cl, "single", locals())
        finally:
            mo.stop()
    link = goodput_mib(crate)
    m = med([r["aggregate"] for r in raw])
    summary = {"throughput": m, "client_link_goodput": link, "of_client_link": m / link,
               "of_client_link_rate": m / (crate / 8 / MiB), "cpu_busy": med([r["cpu"]["busy"] for r in raw])}
    goals = {"of_client_link >= 0.90": summary["of_client_link"] >= 0.90}
    lines = [f"Single client: 4 servers at {fmt_rate(rate)}, client link {fmt_rate(crate)} "
             f"(goodput {link:.1f} MiB/s), file {size / MiB:.0f} MiB, cold, median of {a.runs} runs",
             f"morris read {m:.1f} MiB/s = {summary['of_client_link']:.1%} of the client link's TCP goodput "
             f"({summary['of_client_link_rate']:.1%} of its raw rate); machine CPU busy {summary['cpu_busy']:.0%}",
             "goal >= 90%: " + ("met" if goals["of_client_link >= 0.90"] else "MISSED")]
    print("\n".join(lines))
    p = save("single" + tag_suffix(a), {"args": vars(a), "rate_bps": rate, "client_rate_bps": crate, "size": size,
                        "summary": summary, "goals": goals, "raw": raw, "ops": ops,
                        "verify_before": ver, "verify_after": ver_after, "table": lines})
    plot("single" + tag_suffix(a), p)
