#!/usr/bin/env python3
"""A TCP relay that adds a fixed one-way delay in each direction (stdlib only, asyncio).

    python3 bench/lib/delay_relay.py --listen 10.77.0.1:12049 --to 10.77.0.1:2049 \\
                                     --listen 10.77.0.1:30048 --to 10.77.0.1:20048 --delay-ms 15
    python3 bench/lib/delay_relay.py --selftest

Why: the emulated cluster (bench/cluster) shapes links with tbf only; there is no netem on these
machines, so a far-away home ("30 ms added to each round trip") is emulated by putting this relay
in the path: every connection accepted on a --listen address is relayed to the matching --to
address, and every chunk of bytes read from either side is written to the other side `delay`
later. A request/response protocol (NFS over TCP) therefore sees its round trip grow by
2 x delay (15 ms each way = +30 ms per round trip). Several --listen/--to pairs may be given
(NFS needs two: the NFS port and the MOUNT port); they are paired in order.

How the delay is kept without costing throughput: per connection and direction, one task reads
whatever the socket has (up to 1 MiB) and appends (arrival time + delay, bytes) to a FIFO; a
second task takes the head, sleeps until its due time, then writes it and every other chunk
already due, and waits for the destination to drain. Bytes stay in order, and reading never
waits for the delay, so the bytes in flight through the relay are bounded only by --max-queue
(default 16 MiB per direction, far above rate x delay: 100 MB/s x 15 ms = 1.5 MB); when the
queue is full, reading pauses (TCP's flow control then holds the sender back). End of stream
(a half-close) is delayed like data; a reset or error on either side closes both.

What it does not emulate, and a real 30 ms path would: this is a split-TCP proxy, so each side's
TCP sees the short local round trip: slow start and congestion control do not see the 30 ms, and
the relay's queue acts as a large window (an untuned Linux receiver's buffer grows to 6 MiB,
i.e. 200 MB/s at 30 ms, so the window would not limit 800 Mbit/s either). Connection setup
(SYN, SYN-ACK) is not delayed either; only the bytes on it are. What it does emulate is what a
request/response client pays: every call waits one extra 30 ms round trip, so throughput depends
on how many calls are in flight.

--selftest (on loopback, a few seconds; prints the figures, exits non-zero on failure):
  * round trip: 64-byte ping-pongs to an echo server, direct and through the relay with
    --delay-ms 15; the added round trip (median) must be 30 ms within +-3 ms;
  * bulk: a sender paced at --selftest-mbit (default 800, the home link of bench/home.py) with
    a 16 MiB in-flight budget, to a counting sink, direct and through the relay with 15 ms each
    way; the relayed goodput must be >= 90 % of the direct one. Unpaced goodput (direct and
    relayed, delay 0 and 15 ms) is printed too: a Python relay copies far less than a kernel
    loopback TCP copy (several GB/s), which is why the check is made at the rate the benchmark
    needs rather than at loopback's.
The relay runs as a child process (its own interpreter and CPU), as in the benchmark.
"""

import argparse
import asyncio
import collections
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

CHUNK = 1 << 20
DEFAULT_MAX_QUEUE = 16 << 20


def parse_addr(s):
    """'HOST:PORT' (IPv6 as [ADDR]:PORT) -> (host, port)."""
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"bad address {s!r} (expected HOST:PORT)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class Stats:
    def __init__(self):
        self.conns = 0
        self.bytes = [0, 0]  # client->target, target->client


async def _forward(src, dst, delay, max_queue, stats, idx):
    """Copy src -> dst, each chunk written `delay` s after it was read; EOF delayed as data."""
    loop = asyncio.get_running_loop()
    q = collections.deque()
    queued = 0
    ready = asyncio.Event()
    space = asyncio.Event()
    space.set()

    async def pump_in():
        nonlocal queued
        while True:
            data = await src.read(CHUNK)
            q.append((loop.time() + delay, data))
            queued += len(data)
            ready.set()
            if not data:
                return
            while queued >= max_queue:
                space.clear()
                await space.wait()

    async def pump_out():
        nonlocal queued
        while True:
            while not q:
                ready.clear()
                await ready.wait()
            wait = q[0][0] - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            now = loop.time()
            eof = False
            while q and q[0][0] <= now:
                _, data = q.popleft()
                if not data:
                    eof = True
                    break
                queued -= len(data)
                stats.bytes[idx] += len(data)
                dst.write(data)
            space.set()
            await dst.drain()
            if eof:
                if dst.can_write_eof():
                    dst.write_eof()
                return

    tin = asyncio.ensure_future(pump_in())
    tout = asyncio.ensure_future(pump_out())
    try:
        # pump_out ends after writing the EOF that pump_in queued last; an error in either ends both.
        done, _ = await asyncio.wait({tin, tout}, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            t.result()
        await tout
    finally:
        for t in (tin, tout):
            t.cancel()


async def _handle(creader, cwriter, target, delay, max_queue, stats):
    stats.conns += 1
    try:
        treader, twriter = await asyncio.open_connection(*target, limit=CHUNK)
    except OSError as e:
        print(f"delay_relay: cannot connect to {target[0]}:{target[1]}: {e}", file=sys.stderr, flush=True)
        cwriter.transport.abort()
        return
    for w in (cwriter, twriter):
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    up = asyncio.ensure_future(_forward(creader, twriter, delay, max_queue, stats, 0))
    down = asyncio.ensure_future(_forward(treader, cwriter, delay, max_queue, stats, 1))
    try:
        done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
        if any(t.exception() for t in done):
            raise next(t.exception() for t in done if t.exception())
        await asyncio.gather(up, down)
        for w in (cwriter, twriter):
            w.close()
    except (OSError, asyncio.IncompleteReadError):
        for w in (cwriter, twriter):
            w.transport.abort()
    finally:
        for t in (up, down):
            t.cancel()


async def serve(pairs, delay, max_queue, ready_cb=None):
    """Relay each (listen, target) pair until cancelled."""
    stats = Stats()
    servers = []
    for listen, target in pairs:
        srv = await asyncio.start_server(
            lambda r, w, t=target: _handle(r, w, t, delay, max_queue, stats),
            host=listen[0], port=listen[1], limit=CHUNK, reuse_address=True, backlog=128)
        servers.append((srv, target))
    bound = []
    for srv, target in servers:
        h, p = srv.sockets[0].getsockname()[:2]
        bound.append(((h, p), target))
    if ready_cb:
        ready_cb(bound)
    try:
        await asyncio.gather(*(srv.serve_forever() for srv, _ in servers))
    finally:
        for srv, _ in servers:
            srv.close()


def run(pairs, delay, max_queue):
    def ready(bound):
        for (h, p), (th, tp) in bound:
            print(f"relay {h}:{p} -> {th}:{tp} delay {delay * 1e3:g} ms each way", flush=True)
        print("ready", flush=True)

    loop = asyncio.new_event_loop()
    main = loop.create_task(serve(pairs, delay, max_queue, ready))
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, main.cancel)
    try:
        loop.run_until_complete(main)
    except asyncio.CancelledError:
        pass
    finally:
        loop.close()


# ------------------------------------------------------------------------------------ self-test

def _start_relay(listen_port_pairs, delay_ms, started):
    """Start the relay as a child process (appended to `started` at once, so that it is stopped
    whatever happens next); returns its bound ports."""
    argv = [sys.executable, os.path.abspath(__file__), "--delay-ms", str(delay_ms)]
    for lp, tp in listen_port_pairs:
        argv += ["--listen", f"127.0.0.1:{lp}", "--to", f"127.0.0.1:{tp}"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    started.append(p)
    ports = []
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError("relay exited before it was ready")
        if line.strip() == "ready":
            return ports
        ports.append(int(line.split()[1].rsplit(":", 1)[1]))


def _stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _listener():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def _echo_server():
    s = _listener()

    def serve_one(c):
        with c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                b = c.recv(65536)
                if not b:
                    return
                c.sendall(b)

    def loop():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(c,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return s


def _rtts(port, n=100, size=64):
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x" * size
    out = []
    with c:
        for _ in range(n):
            t = time.perf_counter()
            c.sendall(msg)
            got = 0
            while got < size:
                b = c.recv(size - got)
                if not b:
                    raise RuntimeError("echo connection closed")
                got += len(b)
            out.append(time.perf_counter() - t)
    return out


def _sink_server():
    """Counts bytes per connection; results[i] = (bytes, first byte time, last byte time)."""
    s = _listener()
    results = []

    def loop():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            buf = bytearray(CHUNK)
            n, t0, t1 = 0, None, None
            with c:
                while True:
                    k = c.recv_into(buf)
                    if not k:
                        break
                    t1 = time.perf_counter()
                    if t0 is None:
                        t0 = t1
                    n += k
            results.append((n, t0, t1))

    threading.Thread(target=loop, daemon=True).start()
    return s, results


def _bulk(port, results, total, rate_Bps=None):
    """Send `total` bytes (paced at rate_Bps if given); returns goodput at the sink (B/s)."""
    before = len(results)
    c = socket.create_connection(("127.0.0.1", port))
    buf = b"\0" * (256 << 10)
    sent = 0
    t0 = time.perf_counter()
    with c:
        while sent < total:
            n = min(len(buf), total - sent)
            c.sendall(buf[:n])
            sent += n
            if rate_Bps:
                ahead = t0 + sent / rate_Bps - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
        c.shutdown(socket.SHUT_WR)
        c.recv(1)  # until the sink (or the relay on its behalf) closes
    while len(results) == before:
        time.sleep(0.01)
    n, a, b = results[-1]
    if n != total:
        raise RuntimeError(f"sink got {n} bytes of {total}")
    return n / (b - a)


def selftest(mbit=800.0):
    ok = True
    delay_ms = 15
    echo = _echo_server()
    eport = echo.getsockname()[1]
    sink, res = _sink_server()
    sport = sink.getsockname()[1]
    relays = []
    try:
        re15, rs15 = _start_relay([(0, eport), (0, sport)], delay_ms, relays)
        (rs0,) = _start_relay([(0, sport)], 0, relays)

        direct = _rtts(eport)
        relayed = _rtts(re15)
        d_med, r_med = statistics.median(direct), statistics.median(relayed)
        added = (r_med - d_med) * 1e3
        lo, hi = (min(relayed) - d_med) * 1e3, (max(relayed) - d_med) * 1e3
        good = abs(added - 2 * delay_ms) <= 3.0
        ok &= good
        print(f"round trip: direct {d_med * 1e3:.3f} ms, relayed {r_med * 1e3:.3f} ms (median of 100); "
              f"added {added:.2f} ms (range {lo:.2f}..{hi:.2f}), expected {2 * delay_ms} +- 3: "
              f"{'ok' if good else 'FAILED'}")

        rate = mbit * 1e6 / 8
        total = int(rate * 3)  # 3 s of data at the paced rate
        pd = _bulk(sport, res, total, rate)
        pr = _bulk(rs15, res, total, rate)
        good = pr >= 0.9 * pd
        ok &= good
        print(f"bulk paced at {mbit:g} Mbit/s, {total / 2**20:.0f} MiB: direct {pd * 8 / 1e6:.0f} Mbit/s, "
              f"through the relay (+{delay_ms} ms each way) {pr * 8 / 1e6:.0f} Mbit/s = {pr / pd:.1%} "
              f"(need >= 90 %): {'ok' if good else 'FAILED'}")

        big = 1 << 30
        ud = _bulk(sport, res, big)
        u0 = _bulk(rs0, res, big)
        u15 = _bulk(rs15, res, big)
        print(f"bulk unpaced, 1 GiB: direct {ud * 8 / 1e6:.0f} Mbit/s, relay delay 0: {u0 * 8 / 1e6:.0f} "
              f"({u0 / ud:.0%}), relay delay {delay_ms} ms: {u15 * 8 / 1e6:.0f} ({u15 / ud:.0%}); "
              f"the relay's own ceiling, informational")
    finally:
        for p in relays:
            _stop(p)
        echo.close()
        sink.close()
    print("selftest", "passed" if ok else "FAILED")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", action="append", type=parse_addr, default=[], metavar="HOST:PORT",
                    help="address to accept on (repeatable; port 0 picks one, printed at start)")
    ap.add_argument("--to", action="append", type=parse_addr, default=[], metavar="HOST:PORT",
                    help="where the matching --listen relays to (repeatable, same order)")
    ap.add_argument("--delay-ms", type=float, default=15.0,
                    help="one-way delay added in each direction (default 15: +30 ms per round trip)")
    ap.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                    help="bytes held per connection and direction before reading pauses")
    ap.add_argument("--selftest", action="store_true", help="measure the relay on loopback and exit")
    ap.add_argument("--selftest-mbit", type=float, default=800.0, help="paced rate of the bulk check")
    a = ap.parse_args()
    if a.selftest:
        sys.exit(0 if selftest(a.selftest_mbit) else 1)
    if not a.listen or len(a.listen) != len(a.to):
        ap.error("give one --to for each --listen (at least one pair)")
    if a.delay_ms < 0:
        ap.error("--delay-ms must be >= 0")
    run(list(zip(a.listen, a.to)), a.delay_ms / 1e3, a.max_queue)


if __name__ == "__main__":
    main()
