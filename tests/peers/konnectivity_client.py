#!/usr/bin/env python3
"""A konnectivity client on gRPC core (Python grpcio), as kube-apiserver speaks with `proxyProtocol: GRPC`.

The tests and the bench demo drive it (testbed::grpc_core): it opens one gRPC channel to the
front end, then reads one command per line on stdin and answers each with one JSON line on
stdout ({"ok": true, ...} or {"ok": false, "error": "..."}); the end of stdin ends it. Stubs are
generated at start from the konnectivity proto given (grpcio-tools), the file the server and the
tonic client are generated from.

Commands (ADDR is the dial's host:port):
  echo ADDR          dial; three messages echoed back; CLOSE_REQ answered by CLOSE_RSP
  bulk ADDR BYTES    dial; BYTES sent while as many are read back, both hashed; then a half-close
                     answered by CLOSE_RSP
  dial_error ADDR    dial; the DIAL_RSP's error text
  dial_cancel ADDR   DIAL_REQ then DIAL_CLS at once: the stream must end with no packet
  read_to_close ADDR dial; everything up to CLOSE_RSP and the stream's end (length, CRC-32C)
  http_get ADDR PATH dial; an HTTP/1.1 GET of PATH with Connection: close, then everything up
                     to CLOSE_RSP (the status line, the length, whether CLOSE_RSP came)
  many ADDR COUNT    COUNT dials at once, even ones on the long-lived channel, odd ones on a
                     channel of their own each; each echoes three messages and closes
"""

import argparse
import asyncio
import hashlib
import importlib
import json
import os
import random
import shutil
import sys
import tempfile

STEP = 10.0
CHUNK = 32 * 1024


def load_stubs(proto):
    """Generate the proto's Python modules into a temporary directory and import them."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="konnectivity-stubs-")
    try:
        # A module name of its own (the proto's file name has a hyphen).
        shutil.copy(proto, os.path.join(out, "konnectivity.proto"))
        rc = protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}", "konnectivity.proto"])
        if rc != 0:
            raise SystemExit(f"protoc failed on {proto} ({rc})")
        sys.path.insert(0, out)
        return importlib.import_module("konnectivity_pb2"), importlib.import_module("konnectivity_pb2_grpc")
    finally:
        # Imported: the files are no longer needed.
        shutil.rmtree(out, ignore_errors=True)


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli), the checksum the Rust test kit uses."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = crc_table()


class Failed(Exception):
    pass


class Client:
    def __init__(self, grpc, pb, pbg, args):
        self.grpc, self.pb, self.pbg, self.args = grpc, pb, pbg, args
        self.next_random = random.SystemRandom().randrange(1, 1 << 40)
        self.channel = self.open_channel()
        self.stub = pbg.ProxyServiceStub(self.channel)

    def open_channel(self):
        a = self.args
        # No proxy from the environment; no retries that would hide a refused stream.
        opts = [("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0)]
        if a.authority is not None:
            opts.append(("grpc.default_authority", a.authority))
        if a.ca:
            read = lambda p: open(p, "rb").read()
            creds = self.grpc.ssl_channel_credentials(read(a.ca), read(a.key), read(a.cert))
            opts.append(("grpc.ssl_target_name_override", a.server_name))
            return self.grpc.aio.secure_channel(a.target, creds, options=opts)
        return self.grpc.aio.insecure_channel(a.target, options=opts)

    def random(self):
        self.next_random += 7919
        return self.next_random

    # -------------------------------------------------------------- packets

    def dial_req(self, address, rnd):
        pb = self.pb
        d = pb.DialRequest(protocol="tcp", address=address, random=rnd)
        return pb.Packet(type=pb.DIAL_REQ, dialRequest=d)

    def data(self, cid, b):
        pb = self.pb
        return pb.Packet(type=pb.DATA, data=pb.Data(connectID=cid, data=b))

    def close_req(self, cid):
        pb = self.pb
        return pb.Packet(type=pb.CLOSE_REQ, closeRequest=pb.CloseRequest(connectID=cid))

    def close_dial(self, rnd):
        pb = self.pb
        return pb.Packet(type=pb.DIAL_CLS, closeDial=pb.CloseDial(random=rnd))

    async def next(self, call):
        """The next packet from the server, or None at the stream's end."""
        p = await asyncio.wait_for(call.read(), STEP)
        return None if p is self.grpc.aio.EOF else p

    async def dial(self, address, stub=None):
        """A `Proxy` stream and its DIAL_RSP."""
        call = (stub or self.stub).Proxy()
        rnd = self.random()
        await call.write(self.dial_req(address, rnd))
        p = await self.next(call)
        if p is None or p.WhichOneof("payload") != "dialResponse":
            raise Failed(f"expected DIAL_RSP, got {p}")
        if p.dialResponse.random != rnd:
            raise Failed(f"DIAL_RSP for dial {p.dialResponse.random} instead of {rnd}")
        return call, p.dialResponse

    async def dialled(self, address, stub=None):
        call, rsp = await self.dial(address, stub)
        if rsp.error:
            raise Failed(f"dial of {address} refused: {rsp.error}")
        if rsp.connectID == 0:
            raise Failed("DIAL_RSP without a connect id")
        return call, rsp.connectID

    async def read_exact(self, call, cid, n):
        got = bytearray()
        while len(got) < n:
            p = await self.next(call)
            if p is None or p.WhichOneof("payload") != "data":
                raise Failed(f"after {len(got)} of {n} bytes: {p}")
            if p.data.connectID != cid:
                raise Failed(f"DATA for {p.data.connectID} on {cid}")
            got += p.data.data
        return bytes(got)

    async def read_to_close(self, call, cid):
        """DATA up to CLOSE_RSP, then the stream's end: (bytes, whether CLOSE_RSP came)."""
        data, closed = bytearray(), False
        while True:
            p = await self.next(call)
            if p is None:
                return bytes(data), closed
            kind = p.WhichOneof("payload")
            if kind == "data":
                data += p.data.data
            elif kind == "closeResponse":
                if p.closeResponse.connectID != cid:
                    raise Failed(f"CLOSE_RSP for {p.closeResponse.connectID} on {cid}")
                closed = True
            else:
                raise Failed(f"unexpected {p}")

    async def echo_and_close(self, call, cid, messages):
        for m in messages:
            await call.write(self.data(cid, m))
            back = await self.read_exact(call, cid, len(m))
            if back != m:
                raise Failed(f"echo of {len(m)} bytes differs")
        await call.write(self.close_req(cid))
        rest, closed = await self.read_to_close(call, cid)
        if not closed or rest:
            raise Failed(f"after CLOSE_REQ: CLOSE_RSP {closed}, {len(rest)} more bytes")

    # -------------------------------------------------------------- commands

    async def cmd_echo(self, address):
        call, cid = await self.dialled(address)
        await self.echo_and_close(call, cid, [b"hello", b"kubectl exec", bytes(40000)])
        return {"connect_id": cid}

    async def cmd_bulk(self, address, n):
        n = int(n)
        call, cid = await self.dialled(address)
        rnd = random.Random(cid)

        async def send():
            h, left = hashlib.sha256(), n
            while left:
                b = rnd.randbytes(min(CHUNK, left))
                h.update(b)
                await call.write(self.data(cid, b))
                left -= len(b)
            return h.hexdigest()

        async def receive():
            h, got = hashlib.sha256(), 0
            while got < n:
                p = await self.next(call)
                if p is None or p.WhichOneof("payload") != "data" or not p.data.data:
                    raise Failed(f"after {got} bytes: {p}")
                h.update(p.data.data)
                got += len(p.data.data)
            return h.hexdigest(), got

        sent, (back, got) = await asyncio.gather(send(), receive())
        if got != n or sent != back:
            raise Failed(f"{got} of {n} bytes back, checksum {'differs' if sent != back else 'equal'}")
        # The end of our send side is a half-close: the echo ends its side, which ends ours.
        await call.done_writing()
        rest, closed = await self.read_to_close(call, cid)
        if not closed or rest:
            raise Failed(f"after the half-close: CLOSE_RSP {closed}, {len(rest)} more bytes")
        return {"bytes": got, "sha256": back}

    async def cmd_dial_error(self, address):
        call, rsp = await self.dial(address)
        if not rsp.error:
            raise Failed(f"{address} was dialled (connect id {rsp.connectID})")
        rest = await self.next(call)
        if rest is not None:
            raise Failed(f"after the refusal: {rest}")
        return {"error": rsp.error}

    async def cmd_dial_cancel(self, address):
        call = self.stub.Proxy()
        rnd = self.random()
        await call.write(self.dial_req(address, rnd))
        await call.write(self.close_dial(rnd))
        p = await self.next(call)
        if p is not None:
            raise Failed(f"after DIAL_CLS: {p}")
        return {"packets": 0}

    async def cmd_read_to_close(self, address):
        call, cid = await self.dialled(address)
        data, closed = await self.read_to_close(call, cid)
        if not closed:
            raise Failed(f"no CLOSE_RSP after {len(data)} bytes")
        return {"bytes": len(data), "crc32c": crc32c(data)}

    async def cmd_http_get(self, address, path):
        call, cid = await self.dialled(address)
        await call.write(self.data(cid, f"GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode()))
        data, closed = await self.read_to_close(call, cid)
        status = data.split(b"\r\n", 1)[0].decode("latin-1")
        return {"status": status, "bytes": len(data), "closed": closed}

    async def cmd_many(self, address, count):
        count = int(count)

        async def one(i):
            own = None
            stub = self.stub
            if i % 2:
                own = self.open_channel()
                stub = self.pbg.ProxyServiceStub(own)
            try:
                call, cid = await self.dialled(address, stub)
                msg = f"stream {i} says hello".encode()
                await self.echo_and_close(call, cid, [msg] * 3)
            except Failed as e:
                raise Failed(f"stream {i}: {e}") from None
            finally:
                if own is not None:
                    await own.close()

        await asyncio.gather(*(one(i) for i in range(count)))
        return {"streams": count}

    async def run(self, line):
        words = line.split()
        if not words:
            raise Failed("empty command")
        f = getattr(self, "cmd_" + words[0], None)
        if f is None:
            raise Failed(f"unknown command {words[0]!r}")
        return await f(*words[1:])


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proto", required=True, help="konnectivity-client.proto")
    ap.add_argument("--target", required=True, help="gRPC target: unix:/path or host:port")
    ap.add_argument("--authority", help="the :authority to send (grpc.default_authority); default: gRPC core's")
    ap.add_argument("--ca", help="mTLS: the server's CA (PEM)")
    ap.add_argument("--cert", help="mTLS: the client certificate (PEM)")
    ap.add_argument("--key", help="mTLS: the client key (PEM)")
    ap.add_argument("--server-name", help="mTLS: the name the server's certificate must carry")
    args = ap.parse_args()
    import grpc
    import grpc.aio

    pb, pbg = load_stubs(args.proto)
    client = Client(grpc, pb, pbg, args)
    print(json.dumps({"ok": True, "ready": True, "grpcio": grpc.__version__}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        try:
            out = {"ok": True, **await client.run(line)}
        except Failed as e:
            out = {"ok": False, "error": str(e)}
        except grpc.aio.AioRpcError as e:
            out = {"ok": False, "error": f"gRPC {e.code().name}: {e.details()}"}
        except asyncio.TimeoutError:
            out = {"ok": False, "error": f"no packet from the server within {STEP}s"}
        print(json.dumps(out), flush=True)
    await client.channel.close()


if __name__ == "__main__":
    asyncio.run(main())
