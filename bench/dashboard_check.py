#!/usr/bin/env python3
"""Checks docs/grafana/morris.json against a real Prometheus: starts
`morris up` (metrics on), a Prometheus scraping its servers and mount every
second, puts some load on the mount, then runs every panel's query (the
dashboard's $server/$mount variables as `.*`) through Prometheus's HTTP API
and reports, per panel, whether it parsed and how many series it returned.
Exit 1 if any query fails to run or a panel that the load must fill is
empty. Needs Debian's `prometheus` package.

Usage: sudo python3 bench/dashboard_check.py [--exe target/release/morris]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.util import free_range  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=os.path.join(ROOT, "target/release/morris"))
    a = ap.parse_args()
    if not shutil.which("prometheus"):
        sys.exit("needs prometheus (apt install prometheus)")
    tmp = tempfile.mkdtemp(prefix="morris-dash-")
    port = free_range(10)
    mport, pport = port + 4, port + 9
    up = subprocess.Popen(
        [a.exe, "up", "--servers", "4", "--dir", f"{tmp}/data", "--mount", f"{tmp}/mnt",
         "--port", str(port), "--metrics-port", str(mport), "--no-allow-other"],
        stdout=open(f"{tmp}/up.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    prom = None
    try:
        for _ in range(100):
            if os.path.ismount(f"{tmp}/mnt"):
                break
            time.sleep(0.2)
        else:
            sys.exit("morris up did not mount: " + open(f"{tmp}/up.log").read())
        targets = [f"127.0.0.1:{mport + i}" for i in range(5)]
        open(f"{tmp}/prom.yml", "w").write(
            "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: morris\n"
            f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n")
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={tmp}/prom.yml", f"--storage.tsdb.path={tmp}/tsdb",
             f"--web.listen-address=127.0.0.1:{pport}"],
            stdout=open(f"{tmp}/prom.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        # Load: files written, read, listed, removed, for a while.
        end = time.time() + 40
        n = 0
        while time.time() < end:
            d = f"{tmp}/mnt/d{n % 3}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/f{n}", "wb") as f:
                f.write(os.urandom(256 << 10))
            with open(f"{d}/f{n}", "rb") as f:
                f.read()
            os.listdir(d)
            if n >= 20:
                os.unlink(f"{tmp}/mnt/d{(n - 20) % 3}/f{n - 20}")
            n += 1
        time.sleep(3)
        dash = json.load(open(os.path.join(ROOT, "docs/grafana/morris.json")))
        bad = 0
        # Panels the load above cannot fill (no NFS gateway, no failures).
        may_be_empty = ("NFS", "Checksums", "Recalls", "Stale", "Write-behind")
        for p in dash["panels"]:
            for t in p["targets"]:
                expr = t["expr"].replace("$server", ".*").replace("$mount", ".*")
                r = query(pport, expr)
                ok = r.get("status") == "success"
                series = len(r.get("data", {}).get("result", [])) if ok else 0
                empty_ok = p["title"].startswith(may_be_empty)
                verdict = "ok" if ok and (series > 0 or empty_ok) else "FAIL"
                if verdict == "FAIL":
                    bad += 1
                print(f"{verdict:4} {series:3} series  {p['title']}: {t['legendFormat']}"
                      + ("" if ok else f"  ({r.get('error')})"))
        print(f"{n} files written, read and listed; {bad} failed queries")
        return 1 if bad else 0
    finally:
        if prom:
            prom.send_signal(signal.SIGTERM)
            prom.wait(timeout=20)
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
