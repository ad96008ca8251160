"""A morris volume on loopback, for the benchmarks (stdlib only).

K `morris server` processes on 127.0.0.1 (own data dir and log each, under
`base`), `morris format`, FUSE mounts (`morris mount ADDR MNT` in the
foreground, a child process) through one server, NFS gateways (`morris nfs`)
through it, and `status` / `fsck` through the same server. Servers can be
killed (-9) and restarted with the same --data/--listen/--lease-ms. Used by
metadata.py, resync.py and consistency.py.

Every morris connection is authenticated: make_keys() makes the key files once
(`morris key new DIR`); servers, format, status, fsck and cache commands get
`--key DIR/volume.key`, mounts and NFS gateways `--key DIR/client.key`.
"""

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .util import drop_caches, free_port, is_mounted, wait_mounted


class BenchError(Exception):
    """A failed run: the scripts report it and exit non-zero."""


Keys = collections.namedtuple("Keys", "volume client")
Keys.__doc__ = """Paths of a volume's key files: `volume` (the volume key: servers, format,
status, fsck, cache) and `client` (the client key: mounts, NFS gateways)."""


def make_keys(exe, keys_dir):
    """The key files in keys_dir (usually RUN_BASE/keys): made by `exe key new keys_dir`
    unless keys_dir already holds volume.key and client.key (kept from an earlier run: reused).
    Returns Keys (absolute paths); raises BenchError if `key new` fails."""
    keys_dir = os.path.abspath(keys_dir)
    keys = Keys(os.path.join(keys_dir, "volume.key"), os.path.join(keys_dir, "client.key"))
    if not (os.path.isfile(keys.volume) and os.path.isfile(keys.client)):
        out = subprocess.run([exe, "key", "new", keys_dir], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise BenchError(f"`{exe} key new {keys_dir}` failed: {out.stdout}{out.stderr}")
    return keys


def require_root_fuse(script, exe):
    """Exits with `script: why` unless this runs as root, FUSE is there and exe is executable."""
    if os.geteuid() != 0:
        sys.exit(f"{script}: needs root (drop_caches, FUSE)")
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        sys.exit(f"{script}: FUSE (/dev/fuse, fusermount3) missing")
    if not os.access(exe, os.X_OK):
        sys.exit(f"{script}: {exe} not found / not executable")


def interrupt_on_signals(ignore_later=None):
    """SIGTERM, SIGHUP and SIGINT raise KeyboardInterrupt("signal N") in the main thread.
    With ignore_later(sig), only the first one does: later ones are handed to it
    instead, so that they cannot cut the cleanup short."""
    sigs = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def on_signal(sig, _frame):
        if ignore_later:
            for sg in sigs:
                signal.signal(sg, lambda s_, f_: ignore_later(s_))
        raise KeyboardInterrupt(f"signal {sig}")

    for sg in sigs:
        signal.signal(sg, on_signal)


def run_bench(body, base, remove, log, keep_in, keep_prefix):
    """Runs body(); returns None, or what failed it (a BenchError's text, or
    "interrupted (...)" for a KeyboardInterrupt). Before it returns, the logs of a
    failed run (every *.log below base) are copied into a new temp dir in keep_in,
    named keep_prefix..., which is logged; then remove(base) in any case."""
    failure = None
    try:
        body()
    except BenchError as e:
        failure = str(e)
    except KeyboardInterrupt as e:
        failure = f"interrupted ({e})"
    finally:
        if failure:
            keep = tempfile.mkdtemp(prefix=keep_prefix, dir=keep_in)
            log(f"logs of the failed run kept in {keep}")
            for dp, _, fs in os.walk(base):
                for fn in fs:
                    if fn.endswith(".log"):
                        shutil.copy(os.path.join(dp, fn),
                                    os.path.join(keep, os.path.relpath(dp, base).replace("/", "_") + "_" + fn))
        remove(base)
    return failure


def wait_or_kill(p, timeout, reap_timeout=120):
    """Waits up to timeout s for process p to exit, else kill -9s it and reaps it; a process
    that even SIGKILL does not end within reap_timeout s (a thread stuck in the kernel, e.g.
    a FUSE daemon blocked in a notify) is left behind with a message instead of hanging here."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        try:
            p.wait(timeout=reap_timeout)
        except subprocess.TimeoutExpired:
            print(f"process {p.pid} ({' '.join(map(str, p.args))[:80]}) not reaped {reap_timeout} s "
                  f"after SIGKILL: stuck in the kernel; left behind", file=sys.stderr, flush=True)


class Volume:
    """K servers + mounts; everything started here is ended here, by PID.

    replicas, stripe_unit  `format --replicas`, `--stripe-unit` (None: left out)
    lease_ms        every server's --lease-ms (None: the server's default)
    via             the server mounts, status and fsck go through (the scripts
                    never kill it)
    own_session     servers and mounts in their own session: a Ctrl-C on the
                    terminal then reaches only the script, which unmounts
                    before it stops the servers
    format_timeout  seconds `format` may take (None: no limit)
    quiet_umount    no stderr from the first, plain `fusermount3 -u` (a lazy
                    one follows when it fails)
    keys            the key files (make_keys(); None: made in base/keys)
    server_args     more `morris server` options, for every server
    """

    def __init__(self, exe, base, k, replicas, stripe_unit=None, lease_ms=None, via=0,
                 own_session=False, format_timeout=None, quiet_umount=False, keys=None, server_args=()):
        self.exe, self.base, self.k, self.lease_ms, self.via = exe, base, k, lease_ms, via
        self.server_args = list(server_args)
        self.own_session, self.quiet_umount = own_session, quiet_umount
        self.procs = [None] * k
        self.addrs, self.mounts, self.gateways = [], [], []
        os.makedirs(base, exist_ok=True)
        self.keys = keys or make_keys(exe, os.path.join(base, "keys"))
        for i in range(k):
            self.addrs.append(f"127.0.0.1:{free_port()}")
            self.start_server(i)
        for i in range(k):
            self.wait_port(i)
        cmd = [exe, "format", "--key", self.keys.volume, "--servers", ",".join(self.addrs)]
        if stripe_unit:
            cmd += ["--stripe-unit", stripe_unit]
        cmd += ["--replicas", str(replicas)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=format_timeout)
        if out.returncode != 0:
            raise BenchError(f"format failed: {out.stdout}{out.stderr}")

    def data_dir(self, i):
        return os.path.join(self.base, f"server-{i}")

    def log_path(self, i):
        return os.path.join(self.base, f"server-{i}.log")

    @property
    def mount_log(self):
        return os.path.join(self.base, "mount.log")

    @property
    def live(self):
        """Address of the server mounts, status and fsck go through."""
        return self.addrs[self.via]

    def start_server(self, i):
        cmd = [self.exe, "server", "--key", self.keys.volume, "--data", self.data_dir(i), "--listen", self.addrs[i]]
        if self.lease_ms:
            cmd += ["--lease-ms", str(self.lease_ms)]
        cmd += self.server_args
        with open(self.log_path(i), "ab") as lf:
            self.procs[i] = subprocess.Popen(cmd, stdout=lf, stderr=lf, start_new_session=self.own_session)

    def wait_port(self, i, timeout=20):
        host, port = self.addrs[i].split(":")
        end = time.time() + timeout
        while time.time() < end:
            if self.procs[i].poll() is not None:
                raise BenchError(f"server {i} exited with {self.procs[i].returncode}; see {self.log_path(i)}")
            try:
                socket.create_connection((host, int(port)), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise BenchError(f"server {i} ({self.addrs[i]}) did not listen within {timeout}s")

    def kill9(self, i):
        p = self.procs[i]
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        self.procs[i] = None

    def mount(self, path, extra=()):
        """Mounts the volume at `path` (`extra`: more `morris mount` options)."""
        os.makedirs(path, exist_ok=True)
        lf = open(self.mount_log, "ab")
        p = subprocess.Popen([self.exe, "mount", "--key", self.keys.client, *extra, self.live, path], stdout=lf, stderr=lf,
                             start_new_session=self.own_session)
        lf.close()
        self.mounts.append((path, p))
        return wait_mounted(path, p, self.mount_log, BenchError)

    def start_nfs(self, timeout=30):
        """Starts `morris nfs` through the `via` server on a free loopback port
        (no rpcbind registration, root not squashed, lock state under base);
        returns the port once its log says it serves."""
        port = free_port()
        log_path = os.path.join(self.base, f"nfs-{len(self.gateways)}.log")
        with open(log_path, "ab") as lf:
            # The benchmarks act as root through the gateway, as through
            # their mounts (the gateway squashes root by default).
            p = subprocess.Popen([self.exe, "nfs", "--key", self.keys.client, self.live,
                                  "--listen", f"127.0.0.1:{port}", "--no-rpcbind", "--no-root-squash",
                                  "--nlm-state", os.path.join(self.base, f"nlm-{port}.json")],
                                 stdout=lf, stderr=lf, stdin=subprocess.DEVNULL,
                                 start_new_session=self.own_session)
        self.gateways.append(p)
        end = time.time() + timeout
        while time.time() < end:
            with open(log_path, errors="replace") as f:
                if "nfs gateway serving" in f.read():
                    return port
            if p.poll() is not None:
                raise BenchError(f"morris nfs exited with {p.returncode}; see {log_path}")
            time.sleep(0.05)
        raise BenchError(f"morris nfs not serving within {timeout} s; see {log_path}")

    def umount(self, path):
        for i, (m, p) in enumerate(self.mounts):
            if m == path:
                if is_mounted(m):
                    subprocess.run(["fusermount3", "-u", m], check=False,
                                   stderr=subprocess.DEVNULL if self.quiet_umount else None)
                if is_mounted(m):
                    subprocess.run(["fusermount3", "-uz", m], check=False)
                wait_or_kill(p, 30)
                del self.mounts[i]
                return

    def remount_cold(self, path, times=None):
        """Fresh mount with every cache dropped; times[...] gets umount/sync+drop/mount seconds."""
        t0 = time.perf_counter()
        self.umount(path)
        t1 = time.perf_counter()
        drop_caches()
        t2 = time.perf_counter()
        m = self.mount(path)
        if times is not None:
            times.append({"umount_s": round(t1 - t0, 2), "sync_drop_s": round(t2 - t1, 2),
                          "mount_s": round(time.perf_counter() - t2, 2)})
        return m

    def status(self):
        out = subprocess.run([self.exe, "status", "--key", self.keys.volume, self.live, "--json"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise BenchError(f"status failed: {out.stderr}")
        return json.loads(out.stdout)

    def wait_healthy(self, timeout, what, check_alive=(), note=None, t0=None):
        """Polls status every 0.5 s until health == healthy; returns (seconds, timeline, last status),
        seconds counted from t0 (a perf_counter value; default: now).
        note(status) -> dict of more fields for each timeline entry."""
        t0 = time.perf_counter() if t0 is None else t0
        timeline = []
        while True:
            now = time.perf_counter() - t0
            if now > timeout:
                raise BenchError(f"TIMEOUT: volume not healthy {timeout:.0f}s after {what}; "
                                 f"last status {json.dumps(timeline[-1:])}")
            for i in check_alive:
                if self.procs[i].poll() is not None:
                    raise BenchError(f"server {i} exited ({self.procs[i].returncode}); see {self.log_path(i)}")
            try:
                st = self.status()
            except (BenchError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
                timeline.append({"t": round(now, 2), "error": str(e)})
                time.sleep(0.5)
                continue
            timeline.append({"t": round(now, 2), "health": st.get("health"), **(note(st) if note else {})})
            if st.get("health") == "healthy":
                return now, timeline, st
            time.sleep(0.5)

    def fsck(self):
        out = subprocess.run([self.exe, "fsck", "--key", self.keys.volume, self.live], capture_output=True, text=True,
                             timeout=600)
        return out.returncode, out.stdout + out.stderr

    def stop(self):
        for p in self.gateways:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in self.gateways:
            wait_or_kill(p, 20)
        self.gateways = []
        for m, _ in list(self.mounts):
            self.umount(m)
        for p in self.procs:
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            wait_or_kill(p, 20)
            self.procs[i] = None
