"""Small helpers shared by the benchmark scripts."""

import datetime
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time


def parse_size(s):
    """'64M' / '1G' / '4KiB' / '65536' -> bytes."""
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_range(n):
    """A first port P such that P .. P+n-1 are free on 127.0.0.1 now, below
    the ephemeral range (so that no outgoing connection takes one meanwhile)."""
    import random
    for _ in range(200):
        p = random.randint(20000, 30000 - n)
        socks = []
        try:
            for q in range(p, p + n):
                s = socket.socket()
                s.bind(("127.0.0.1", q))
                socks.append(s)
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    sys.exit("no free ports")


def drop_caches():
    """Writes dirty pages back, then drops the page cache (needs root)."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def is_mounted(path):
    """True if `path` is a mount point of this mount namespace."""
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def wait_mounted(path, proc, log_path, error=RuntimeError, limit_s=30):
    """Waits until the mount process `proc` has mounted `path`; raises
    `error` if it exits first or `limit_s` passes."""
    for _ in range(int(limit_s / 0.05)):
        if is_mounted(path):
            return path
        if proc.poll() is not None:
            raise error(f"mount exited with {proc.returncode}; see {log_path}")
        time.sleep(0.05)
    raise error(f"mount did not come up within {limit_s} s")


def mounts_under(d):
    """Mount points of this mount namespace below directory d."""
    d = os.path.realpath(d) + "/"
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(d)]


def remove_tree(d, log=print):
    """rmtree, but never through a mount that is still there (that would delete inside it)."""
    for m in mounts_under(d):
        subprocess.run(["fusermount3", "-uz", m], check=False)
    left = mounts_under(d)
    if left:
        log(f"NOT removing {d}: still mounted: {left}")
        return
    shutil.rmtree(d, ignore_errors=True)


def log_warnings(d, limit=40):
    """WARN/ERROR lines of every *.log in directory d:
    {log name: {"count": n, "first": [first `limit` lines]}} (logs without any are left out)."""
    out = {}
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".log"):
            continue
        with open(os.path.join(d, fn), errors="replace") as f:
            lines = [ln.rstrip() for ln in f if " WARN " in ln or " ERROR " in ln]
        if lines:
            out[fn] = {"count": len(lines), "first": lines[:limit]}
    return out


def med(rows, key):
    """Median of row[key] over the rows that have it (None: none has)."""
    v = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(v) if v else None


def finish(out, failure):
    """Last words of a bench: where the JSON went; then, if it failed, why (stderr) and exit 1."""
    print(f"wrote {out}")
    if failure:
        print(f"\nFAILED: {failure}", file=sys.stderr)
        sys.exit(1)


def log_times(path, since_marker, patterns):
    """UTC timestamps (epoch secs) of the first line after since_marker containing each pattern."""
    out = {k: None for k in patterns}
    seen = False
    with open(path, errors="replace") as f:
        for line in f:
            if since_marker in line:
                seen = True
                continue
            if not seen:
                continue
            for k, pat in patterns.items():
                if out[k] is None and pat in line:
                    ts = line.split()[0].rstrip("Z")
                    try:
                        out[k] = datetime.datetime.fromisoformat(ts).replace(
                            tzinfo=datetime.timezone.utc).timestamp()
                    except ValueError:
                        pass
    return out
