"""Command line of the emulated-cluster benchmarks (run as `python3 bench/cluster CMD ...`).

  verify  [--hosts N --rate R]        build N hosts, run the link shaping check, tear down
  fig4    [--size 1G --rate 200mbit --runs 3 --systems morris,nfs,moosefs]
  fig5    [--size 256M --rate 200mbit --runs 3 --servers 1,2,4 --systems morris,nfs]
  single  [--size 1G --rate 200mbit --factor 4 --runs 3]
  blast   [--bases 1G --rate 200mbit --runs 3 --clients 1,2,4]
  cleanup                             remove leftovers (mc-* namespaces, veths, bridge, mounts)
  plot    RESULT.json OUT.png

Every experiment checks the link shaping before and after (refuses to report if off), prints a
table, writes bench/cluster/results/NAME.json and docs/cluster-NAME.png.
"""
import argparse
import sys

from lib.util import parse_size  # bench/ is on sys.path (see __main__.py)

from .hosts import Cluster, ShapingError, cleanup_leftovers, require_root_and_tools


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bench/cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--hosts", type=int, default=4)
    v.add_argument("--rate", default="200mbit")
    v.add_argument("--prefix", default="mc-")
    v.add_argument("--subnet", default="10.77.0")
    for name, size, extra in (("fig4", "1G", "morris,nfs,moosefs"), ("fig5", "256M", "morris,nfs"),
                              ("single", "1G", None), ("blast", None, None)):
        p = sub.add_parser(name)
        p.add_argument("--rate", default="200mbit", help="every host's link rate (tbf), e.g. 200mbit")
        p.add_argument("--runs", type=int, default=3)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--prefix", default="mc-", help="name prefix of namespaces/bridge/veths (one cluster per prefix)")
        p.add_argument("--subnet", default="10.77.0", help="the hosts' /24 (hosts are SUBNET.1, .2, ...)")
        if size:
            p.add_argument("--size", type=parse_size, default=parse_size(size))
        p.add_argument("--tag", default="", help="variant name: results/NAME-TAG.json, docs/cluster-NAME-TAG.png (e.g. ra8M)")
        p.add_argument("--morris-readahead", default=None, help="`morris mount --readahead` for every morris mount")
        if extra:
            p.add_argument("--systems", default=extra)
            p.add_argument("--nfs-depth", type=int, default=4, help="1 MiB READs in flight per libnfs reader")
        if name == "fig5":
            p.add_argument("--servers", default="1,2,4")
        if name == "single":
            p.add_argument("--factor", type=int, default=4, help="client link = factor x server link")
        if name == "blast":
            p.add_argument("--bases", type=parse_size, default=parse_size("1G"), help="database size in bases")
            p.add_argument("--clients", default="1,2,4")
            p.add_argument("--task", default="blastn", help="blastn -task (blastn = word size 11, as blastall -p blastn)")
            p.add_argument("--cache", default="/var/tmp/mc-blastdb-cache",
                           help="where the generated database is kept between invocations")
    c = sub.add_parser("cleanup")
    c.add_argument("--prefix", default="mc-")
    pl = sub.add_parser("plot")
    pl.add_argument("json")
    pl.add_argument("png")
    a = ap.parse_args(argv)
    if a.cmd == "plot":
        from . import plots
        plots.plot(a.json, a.png)
        return 0
    extra = {"fig4": ("nfs-cat", "gcc", "ganesha.nfsd", "rpcbind", "mfsmaster", "mfschunkserver", "mfsmount"),
             "fig5": ("gcc", "ganesha.nfsd", "rpcbind"), "blast": ("makeblastdb", "blastn")}.get(a.cmd, ())
    require_root_and_tools(extra)
    if a.cmd == "cleanup":
        import fcntl
        with open(f"/run/lock/{a.prefix}cluster.lock", "a+") as lf:
            try:
                fcntl.flock(lf, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"error: a cluster with prefix {a.prefix!r} is running; not cleaning up", file=sys.stderr)
                return 1
            cleanup_leftovers(a.prefix)
        return 0
    try:
        if a.cmd == "verify":
            with Cluster(a.hosts, a.rate, prefix=a.prefix, subnet=a.subnet) as cl:
                cl.verify()
            return 0
        from . import experiments
        if a.cmd == "blast":
            from . import blast
            blast.blast(a)
        else:
            getattr(experiments, a.cmd)(a)
    except ShapingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}); everything torn down", file=sys.stderr)
        return 130
    return 0
