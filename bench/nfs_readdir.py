#!/usr/bin/env python3
"""Lists one directory through an NFSv3 server with raw READDIR or
READDIRPLUS calls (stdlib ONC RPC over TCP, AUTH_UNIX root), following
cookies, and prints entries, calls and time: how listing a huge directory
through `morris nfs` scales (constant work per call, no rescans).

Usage: python3 bench/nfs_readdir.py HOST:PORT PATH [--plus] [--count BYTES]
(PORT serves both MOUNT and NFS, as `morris nfs` does.)
"""

import argparse
import socket
import struct
import sys
import time


class Rpc:
    def __init__(self, host, port):
        self.s = socket.create_connection((host, port))
        self.xid = 1

    def call(self, prog, proc, args):
        self.xid += 1
        cred = struct.pack(">5I", 0, 0, 0, 0, 0)  # stamp, machine "", uid 0, gid 0, no gids
        rec = struct.pack(">6I", self.xid, 0, 2, prog, 3, proc)
        rec += struct.pack(">2I", 1, len(cred)) + cred + struct.pack(">2I", 0, 0)
        rec += args
        self.s.sendall(struct.pack(">I", 0x80000000 | len(rec)) + rec)
        body = b""
        last = False
        while not last:
            mark = self._read(4)
            (m,) = struct.unpack(">I", mark)
            last = bool(m & 0x80000000)
            body += self._read(m & 0x7FFFFFFF)
        xid, mtype, stat = struct.unpack(">3I", body[:12])
        if (xid, mtype, stat) != (self.xid, 1, 0):
            sys.exit(f"rpc call {prog}/{proc} refused: {body[:24].hex()}")
        (vlen,) = struct.unpack(">I", body[16:20])
        at = 20 + (vlen + 3) // 4 * 4
        (accept,) = struct.unpack(">I", body[at : at + 4])
        if accept != 0:
            sys.exit(f"rpc call {prog}/{proc}: accept_stat {accept}")
        return body[at + 4 :]

    def _read(self, n):
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                sys.exit("connection closed")
            out += chunk
        return out


def opaque(b):
    return struct.pack(">I", len(b)) + b + b"\0" * ((4 - len(b) % 4) % 4)


def get_opaque(b, at):
    (n,) = struct.unpack(">I", b[at : at + 4])
    return b[at + 4 : at + 4 + n], at + 4 + (n + 3) // 4 * 4


def skip_attr(b, at):
    (follows,) = struct.unpack(">I", b[at : at + 4])
    return at + 4 + (84 if follows else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("path")
    ap.add_argument("--plus", action="store_true", help="READDIRPLUS (attributes and handles)")
    ap.add_argument("--count", type=int, default=65536, help="reply size per call (bytes)")
    a = ap.parse_args()
    host, port = a.addr.rsplit(":", 1)
    rpc = Rpc(host, int(port))
    r = rpc.call(100005, 1, opaque(b"/"))
    if r[:4] != b"\0\0\0\0":
        sys.exit("MNT failed")
    fh, _ = get_opaque(r, 4)
    for name in [p for p in a.path.split("/") if p]:
        r = rpc.call(100003, 3, opaque(fh) + opaque(name.encode()))
        if r[:4] != b"\0\0\0\0":
            sys.exit(f"LOOKUP {name} failed")
        fh, _ = get_opaque(r, 4)
    cookie, verf, calls, entries, slowest = 0, b"\0" * 8, 0, 0, 0.0
    start = time.monotonic()
    while True:
        t = time.monotonic()
        args = opaque(fh) + struct.pack(">Q", cookie) + verf
        if a.plus:
            r = rpc.call(100003, 17, args + struct.pack(">2I", a.count // 4, a.count))
        else:
            r = rpc.call(100003, 16, args + struct.pack(">I", a.count))
        slowest = max(slowest, time.monotonic() - t)
        calls += 1
        if r[:4] != b"\0\0\0\0":
            sys.exit(f"READDIR failed at cookie {cookie}: status {struct.unpack('>I', r[:4])[0]}")
        at = skip_attr(r, 4)
        verf = r[at : at + 8]
        at += 8
        while struct.unpack(">I", r[at : at + 4])[0] == 1:
            _, at = get_opaque(r, at + 12)
            (cookie,) = struct.unpack(">Q", r[at : at + 8])
            at += 8
            if a.plus:
                at = skip_attr(r, at)
                (has_fh,) = struct.unpack(">I", r[at : at + 4])
                at = get_opaque(r, at + 4)[1] if has_fh else at + 4
            entries += 1
        (eof,) = struct.unpack(">I", r[at + 4 : at + 8])
        if eof:
            break
    took = time.monotonic() - start
    kind = "READDIRPLUS" if a.plus else "READDIR"
    print(
        f"{kind}: {entries} entries in {calls} calls of {a.count} bytes, {took:.1f} s "
        f"({entries / took:,.0f} entries/s), slowest call {slowest * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
