"""One nfs-ganesha NFSv3 server exporting a local directory through FSAL VFS (stdlib only).

    from lib.ganesha import Ganesha
    with Ganesha("/var/tmp/x/export", "/var/tmp/x/ganesha") as g:     # host, 127.0.0.1:2049
        subprocess.run(["nfs-cat", g.url("big")])                      # nfs://127.0.0.1/export/big?...
    g = Ganesha(d, w, netns="mc-h0", bind_addr="10.77.0.1"); g.start(); ...; g.stop()

How it runs (ganesha exits unless a portmapper answers, and port 111 may be taken on the host):

  * rpcbind: `unshare -m --propagation private` + a tmpfs on /run (so its /run/rpcbind.sock,
    lock and state files are private), then `rpcbind -f`.
      - netns=None: rpcbind additionally runs in a fresh, private network namespace of its own
        (`unshare -n`), so it never binds the host's port 111 and nothing on the host sees it.
      - netns="NS": the whole chain runs under `ip netns exec NS`, so rpcbind answers on NS:111
        (a portmapper for clients of that emulated host, as on a real machine).
  * ganesha.nfsd -F: started with `nsenter -t <rpcbind pid> -m [-n]`, i.e. in rpcbind's private
    mount namespace (it registers with rpcbind through the AF_UNIX socket /run/rpcbind.sock,
    which works across network namespaces) and, if netns is given, in NS too. With netns=None
    ganesha lives in the host network namespace but binds only bind_addr:port (NFS) and
    bind_addr:mount_port (MOUNT); NLM, RQUOTA, UDP, NFSv4 and Kerberos are disabled, so it
    opens no other port. dbus is absent in the private /run (ganesha logs CRIT lines about it;
    harmless). NFSv4 recovery state goes to WORKDIR/recov, the pid file, config and log to WORKDIR.
  * Readiness: start() polls, from inside the server's network namespace, an RPC NULL to NFS v3
    and a MOUNT v3 MNT of the export path (status must be OK) until both answer, or raises
    RuntimeError with the tail of WORKDIR/ganesha.log (default timeout 60 s).
  * stop(): SIGTERM to ganesha, then rpcbind (by PID, SIGKILL after a grace time); idempotent;
    also registered with atexit and called by __exit__.

Export: Export_Id 1, Path = export_dir, Pseudo "/export" (NFSv3 mounts use the pseudo path,
mount_path_pseudo = true), Access_Type RW, Squash None (root stays root), Protocols 3,
Transports TCP, SecType sys, MaxRead/MaxWrite/PrefRead/PrefWrite 1 MiB; Attr_Expiration_Time if
attr_expiration is given (ganesha trusts cached attributes 60 s by default, so a file removed or
changed in export_dir is not seen through NFS for up to a minute; 0 makes it look each time).
MOUNT port: self.mount_port: with netns given, 20048 (or port+1 if port is 20048); with
netns=None a free TCP port on bind_addr picked at start().

Manual test:  python3 bench/lib/ganesha.py DIR [--netns NS --bind ADDR] [--port P] [--mount-port M]
  serves DIR until Ctrl-C and prints the libnfs URL (try: nfs-ls URL, nfs-cat URL/FILE).
"""

import atexit
import os
import signal
import socket
import struct
import subprocess
import sys
import time

GANESHA = "/usr/bin/ganesha.nfsd"
RPCBIND = "/usr/sbin/rpcbind"
PSEUDO = "/export"
NFS_PROG, MOUNT_PROG = 100003, 100005


# ---- a tiny ONC RPC client over TCP (record marking), enough for NULL and MNT ----

def _rpc_call(host, port, prog, vers, proc, args=b"", timeout=2.0, xid=0x6d6f7272):
    # AUTH_SYS credential: stamp, machine name "probe", uid 0, gid 0, no groups.
    name = b"probe"
    body = struct.pack(">I", 0) + struct.pack(">I", len(name)) + name + b"\0" * (-len(name) % 4)
    body += struct.pack(">III", 0, 0, 0)
    msg = struct.pack(">IIIIII", xid, 0, 2, prog, vers, proc)
    msg += struct.pack(">II", 1, len(body)) + body + struct.pack(">II", 0, 0) + args
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">I", 0x80000000 | len(msg)) + msg)
        reply = b""
        last = False
        while not last:
            hdr = _recv_exact(s, 4)
            (mark,) = struct.unpack(">I", hdr)
            last = bool(mark & 0x80000000)
            reply += _recv_exact(s, mark & 0x7FFFFFFF)
    rxid, mtype, stat = struct.unpack(">III", reply[:12])
    if rxid != xid or mtype != 1:
        raise OSError("bad RPC reply header")
    if stat != 0:
        raise OSError(f"RPC call denied (reply_stat {stat})")
    flavor, vlen = struct.unpack(">II", reply[12:20])
    off = 20 + vlen + (-vlen % 4)
    (accept,) = struct.unpack(">I", reply[off:off + 4])
    if accept != 0:
        raise OSError(f"RPC accept_stat {accept} for prog {prog} v{vers} proc {proc}")
    return reply[off + 4:]


def _recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise OSError("connection closed")
        buf += b
    return buf


def probe(host, port, mount_port, path):
    """NFS v3 NULL + MOUNT v3 MNT(path); raises OSError unless both succeed."""
    _rpc_call(host, port, NFS_PROG, 3, 0)
    p = path.encode()
    res = _rpc_call(host, mount_port, MOUNT_PROG, 3, 1, struct.pack(">I", len(p)) + p + b"\0" * (-len(p) % 4))
    (status,) = struct.unpack(">I", res[:4])
    if status != 0:
        raise OSError(f"MNT {path} -> mountstat3 {status}")
    # Be polite: UMNT (ganesha keeps no mount list for v3 anyway).
    try:
        _rpc_call(host, mount_port, MOUNT_PROG, 3, 3, struct.pack(">I", len(p)) + p + b"\0" * (-len(p) % 4))
    except OSError:
        pass


def _free_port(addr):
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _port_free(addr, port):
    # SO_REUSEADDR, as ganesha binds: only a listener makes the port busy, not the
    # TIME_WAIT left by connections of a server just stopped (so it can start again at once).
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
            return True
        except OSError:
            return False


def _tail(path, n=30):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])
    except OSError as e:
        return f"(no log: {e})"


class Ganesha:
    """One nfs-ganesha NFSv3 server (FSAL VFS) exporting export_dir; see the module docstring."""

    def __init__(self, export_dir: str, workdir: str, netns: str | None = None,
                 bind_addr: str = "127.0.0.1", port: int = 2049, attr_expiration: int | None = None):
        self.export_dir = os.path.realpath(export_dir)
        self.workdir = os.path.realpath(workdir)
        self.netns = netns
        self.bind_addr = bind_addr
        self.port = port
        self.mount_port = None if netns is None else (20048 if port != 20048 else port + 1)
        self.attr_expiration = attr_expiration
        self.start_timeout = 60.0
        self.conf = os.path.join(self.workdir, "ganesha.conf")
        self.log = os.path.join(self.workdir, "ganesha.log")
        self.rpcbind_log = os.path.join(self.workdir, "rpcbind.log")
        self._rpcbind = None
        self._ganesha = None
        self._logs = []

    # -- public API --

    def start(self) -> None:
        if self._ganesha is not None:
            raise RuntimeError("Ganesha already started")
        if os.geteuid() != 0:
            raise RuntimeError("Ganesha needs root (namespaces, open_by_handle_at)")
        for exe in (GANESHA, RPCBIND, "/usr/bin/unshare", "/usr/bin/nsenter"):
            if not os.access(exe, os.X_OK):
                raise RuntimeError(f"{exe} missing (apt-get install nfs-ganesha nfs-ganesha-vfs rpcbind util-linux)")
        if not os.path.isdir(self.export_dir):
            raise RuntimeError(f"export dir {self.export_dir} does not exist")
        os.makedirs(os.path.join(self.workdir, "recov"), exist_ok=True)
        if self.netns is None:
            if self.mount_port is None:
                self.mount_port = _free_port(self.bind_addr)
            for p in (self.port, self.mount_port):
                if not _port_free(self.bind_addr, p):
                    raise RuntimeError(f"{self.bind_addr}:{p} is already in use on the host")
        elif subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True).returncode != 0:
            raise RuntimeError(f"network namespace {self.netns} does not exist")
        with open(self.conf, "w") as f:
            f.write(self._config())
        atexit.register(self.stop)
        try:
            self._start_rpcbind()
            self._start_ganesha()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def url(self, path: str = "") -> str:
        if self.mount_port is None:
            raise RuntimeError("url() before start(): the MOUNT port is picked at start()")
        p = (PSEUDO + "/" + path.lstrip("/")).rstrip("/")
        return f"nfs://{self.bind_addr}{p}?version=3&nfsport={self.port}&mountport={self.mount_port}"

    def stop(self) -> None:
        for attr in ("_ganesha", "_rpcbind"):
            p = getattr(self, attr)
            if p is None:
                continue
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
                except ProcessLookupError:
                    pass
            setattr(self, attr, None)
        for f in self._logs:
            f.close()
        self._logs = []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def pids(self):
        """PIDs of the running ganesha.nfsd and rpcbind (for CPU accounting)."""
        return {k: p.pid for k, p in (("ganesha", self._ganesha), ("rpcbind", self._rpcbind))
                if p is not None and p.poll() is None}

    # -- internals --

    def _config(self):
        return f"""# written by bench/lib/ganesha.py
NFS_CORE_PARAM {{
    Bind_Addr = {self.bind_addr};
    NFS_Port = {self.port};
    MNT_Port = {self.mount_port};
    Protocols = 3;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
    mount_path_pseudo = true;
}}
NFSV4 {{
    RecoveryRoot = "{self.workdir}/recov";
    Graceless = true;
}}
NFS_KRB5 {{
    Active_krb5 = false;
}}
EXPORT {{
    Export_Id = 1;
    Path = "{self.export_dir}";
    Pseudo = "{PSEUDO}";
    Access_Type = RW;
    Squash = None;
    Protocols = 3;
    Transports = TCP;
    SecType = sys;{self._attr_expiration_line()}
    MaxRead = 1048576;
    MaxWrite = 1048576;
    PrefRead = 1048576;
    PrefWrite = 1048576;
    FSAL {{
        Name = VFS;
    }}
}}
"""

    def _attr_expiration_line(self):
        if self.attr_expiration is None:
            return ""
        return f"\n    Attr_Expiration_Time = {int(self.attr_expiration)};"

    def _open_log(self, path):
        f = open(path, "ab")
        self._logs.append(f)
        return f

    def _start_rpcbind(self):
        inner = ("mount -t tmpfs -o size=16m,mode=755 morris-ganesha-run /run && "
                 + ("exec unshare -n -- " if self.netns is None else "exec ") + f"{RPCBIND} -f")
        argv = ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", inner]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns] + argv
        log = self._open_log(self.rpcbind_log)
        # Every wrapper exec()s, so the PID is rpcbind's own.
        self._rpcbind = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        sock = f"/proc/{self._rpcbind.pid}/root/run/rpcbind.sock"
        deadline = time.time() + 10
        while time.time() < deadline:
            if self._rpcbind.poll() is not None:
                raise RuntimeError(f"rpcbind exited with {self._rpcbind.returncode}:\n{_tail(self.rpcbind_log)}")
            try:
                if os.path.exists(sock) and os.readlink(f"/proc/{self._rpcbind.pid}/exe") == RPCBIND:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"rpcbind did not create {sock} within 10 s:\n{_tail(self.rpcbind_log)}")

    def _start_ganesha(self):
        ns = ["-m"] + (["-n"] if self.netns is not None else [])
        argv = ["nsenter", "-t", str(self._rpcbind.pid), *ns, "--", GANESHA, "-F",
                "-f", self.conf, "-L", self.log, "-p", os.path.join(self.workdir, "ganesha.pid"), "-N", "NIV_EVENT"]
        out = self._open_log(os.path.join(self.workdir, "ganesha.out"))
        self._ganesha = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def _wait_ready(self):
        deadline = time.time() + self.start_timeout
        last = None
        while time.time() < deadline:
            if self._ganesha.poll() is not None:
                raise RuntimeError(f"ganesha.nfsd exited with {self._ganesha.returncode}; "
                                   f"tail of {self.log}:\n{_tail(self.log)}")
            try:
                self._probe()
                return
            except (OSError, subprocess.SubprocessError) as e:
                last = e
            time.sleep(0.2)
        raise RuntimeError(f"ganesha did not answer NFS NULL + MNT {PSEUDO} on {self.bind_addr}:{self.port}/"
                           f"{self.mount_port} within {self.start_timeout:.0f} s (last error: {last}); "
                           f"tail of {self.log}:\n{_tail(self.log)}")

    def _probe(self):
        if self.netns is None:
            probe(self.bind_addr, self.port, self.mount_port, PSEUDO)
            return
        # The namespace may not be reachable from here: probe from inside it.
        r = subprocess.run(["nsenter", "-t", str(self._ganesha.pid), "-n", "--", sys.executable,
                            os.path.abspath(__file__), "--probe", self.bind_addr, str(self.port),
                            str(self.mount_port), PSEUDO], capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise OSError(r.stderr.strip()[-500:] or f"probe exited {r.returncode}")


def _main():
    import argparse
    if len(sys.argv) == 6 and sys.argv[1] == "--probe":
        try:
            probe(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        except OSError as e:
            sys.exit(f"probe: {e}")
        return
    ap = argparse.ArgumentParser(description="serve DIR with nfs-ganesha until Ctrl-C")
    ap.add_argument("dir")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--netns", default=None)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=2049)
    ap.add_argument("--mount-port", type=int, default=None,
                    help="MOUNT port (default: 20048 with --netns, else a free port)")
    ap.add_argument("--attr-expiration", type=int, default=None,
                    help="seconds ganesha trusts cached attributes (default: ganesha's, 60); "
                         "0: changes made in DIR are seen at once, as with a kernel server")
    a = ap.parse_args()
    import tempfile
    wd = a.workdir or tempfile.mkdtemp(prefix="ganesha-", dir="/var/tmp")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    g = Ganesha(a.dir, wd, netns=a.netns, bind_addr=a.bind, port=a.port,
                attr_expiration=a.attr_expiration)
    if a.mount_port is not None:
        g.mount_port = a.mount_port
    with g:
        print(g.url(), "pids", g.pids, "workdir", wd, flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    _main()
