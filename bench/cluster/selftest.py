"""Self-test of the host/link control used by the partition and server-loss tests.

    python3 bench/cluster/selftest.py [--prefix mt- --subnet 10.78.0]

Builds 3 hosts, checks the shaping, then: link_down(h1) must cut h0<->h1 (a connect times out)
while h0<->h2 still works; link_up(h1) must restore it with the same tbf rate (re-verified);
stop_host(h2) must kill the processes inside h2; teardown must leave no namespace, link or
process behind. Exits non-zero on the first failure.
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cluster import Cluster  # noqa: E402

PROBE = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()\n"
         " print('ok')\nexcept OSError as e:\n print('fail', e)\n")
LISTEN = ("import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
          "s.bind(('0.0.0.0',5999));s.listen(64)\nwhile True:\n c,_=s.accept();c.close()\n")


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        raise SystemExit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default="mt-")
    ap.add_argument("--subnet", default="10.78.0")
    a = ap.parse_args()
    with Cluster(3, "100mbit", prefix=a.prefix, subnet=a.subnet) as cl:
        h0, h1, h2 = cl.hosts
        cl.verify()
        for h in (h1, h2):
            h.spawn(["python3", "-c", LISTEN])
        time.sleep(0.5)

        def probe(src, dst):
            return src.run(["python3", "-c", PROBE, dst.addr, "5999"]).stdout.strip()

        check(probe(h0, h1) == "ok" and probe(h0, h2) == "ok", "all hosts reachable")
        cl.link_down(h1)
        check(probe(h0, h1).startswith("fail"), "link_down(h1) cuts h0->h1")
        check(probe(h0, h2) == "ok", "h0->h2 unaffected")
        cl.link_up(h1)
        time.sleep(0.5)
        check(probe(h0, h1) == "ok", "link_up(h1) restores h0->h1")
        cl.verify(hosts=[h0, h1])
        check(cl.qdisc_ok(h1), "h1 still shaped after link_up")
        check(len(h2.pids()) >= 1, "h2 has a process")
        cl.stop_host(h2)
        check(h2.pids() == [], "stop_host(h2) killed every process in h2")
        check(probe(h0, h2).startswith("fail"), "h2's service is gone")
        ns = [h.ns for h in cl.hosts]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    check(not any(n in left for n in ns), "teardown removed the namespaces")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    check(f" {a.prefix}" not in links, "teardown removed the veths and the bridge")
    print("selftest passed")


if __name__ == "__main__":
    main()
