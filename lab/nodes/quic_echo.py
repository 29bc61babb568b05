"""A real QUIC server (aioquic) whose connection ids carry its server id, and the client that holds connections to it.

    python -m lab.nodes.quic_echo serve --node real1 --bind 198.51.100.100:443 --server-id 101
    python -m lab.nodes.quic_echo client --vip 198.51.100.100 --port 443 --conns 12

The server is what a QUIC service behind a Katran-style balancer runs (mvfst does it): every
connection id it issues is 8 bytes in Katran's v2 layout, first byte 0b10xxxxxx and the 24-bit
server id in bytes 1..3, so that the balancer routes the connection's short-header packets by
the id (bpf/include/route.h). On each stream it answers "<node> <server id> " + what it read. It
prints "ready" once bound and serves until SIGTERM (or its input's end with --until-eof).

The client opens --conns connections (one UDP socket each), asks each once which real answers,
prints {"event": "ready", "conns": [{index, addr, port, node}]}, then on each "round" line on stdin
asks every connection again (a new stream) and prints {"event": "round", "answers": {index: node or
"timeout" or the error}}; "stop" closes them and exits. TLS is a self-signed certificate made at
start (the client does not verify it: what is tested is routing, not PKI).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aioquic.asyncio import server as quic_server
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import StreamDataReceived

from lab.nodes.churn_client import ChurnClient

ALPN = ["l4lab-echo"]
CID_LEN = 8
ANSWER_TIMEOUT_S = 3.0


def server_cid(server_id: int) -> bytes:
    """An 8-byte connection id in Katran's v2 layout: 0b10 + 6 random bits, the 24-bit id, 4 random bytes."""
    rand = os.urandom(5)
    return bytes([0x80 | (rand[0] & 0x3F)]) + server_id.to_bytes(3, "big") + rand[1:]


def _id_connection(server_id: int) -> type[QuicConnection]:
    """aioquic's connection with every connection id it issues holding `server_id`."""

    class IdConnection(QuicConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if not self._is_client:  # the first id is read into these three at construction
                self._host_cids[0].cid = server_cid(server_id)
                self.host_cid = self._local_initial_source_connection_id = self._host_cids[0].cid

        def _replenish_connection_ids(self) -> None:
            known = len(self._host_cids)
            super()._replenish_connection_ids()
            for issued in self._host_cids[known:]:
                issued.cid = server_cid(server_id)

    return IdConnection


def _certificate(node: str, workdir: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    cert_path, key_path = workdir / f"{node}.crt", workdir / f"{node}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class _Echo(QuicConnectionProtocol):
    prefix = b""

    def quic_event_received(self, event: object) -> None:
        if isinstance(event, StreamDataReceived) and event.end_stream:
            self._quic.send_stream_data(event.stream_id, self.prefix + event.data, end_stream=True)
            self.transmit()


async def _serve(node: str, binds: Sequence[str], server_id: int, until_eof: bool) -> None:
    quic_server.QuicConnection = _id_connection(server_id)  # type: ignore[attr-defined]  # the server's factory
    config = QuicConfiguration(is_client=False, alpn_protocols=ALPN, connection_id_length=CID_LEN)
    with tempfile.TemporaryDirectory(prefix="l4lab-quic-") as workdir:
        cert, key = _certificate(node, Path(workdir))
        config.load_cert_chain(str(cert), str(key))

    class Echo(_Echo):
        prefix = f"{node} {server_id} ".encode()

    for spec in binds:
        host, _, port = spec.rpartition(":")
        await serve(host.strip("[]"), int(port), configuration=config, create_protocol=Echo)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, finish)
    def stdin_read() -> None:
        if not sys.stdin.read(1):
            finish()

    if until_eof:
        loop.add_reader(sys.stdin, stdin_read)
    await done


async def _ask(proto: QuicConnectionProtocol, text: str) -> str:
    """One stream: `text` out, the answer's node name back (or what went wrong)."""
    try:
        reader, writer = await proto.create_stream()
        writer.write(text.encode())
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), ANSWER_TIMEOUT_S)
        return answer.decode().split(" ", 1)[0] if answer else "empty"
    except TimeoutError:
        return "timeout"
    except (ConnectionError, OSError) as exc:
        return f"error: {exc}"


async def _client(vip: str, port: int, conns: int) -> None:
    config = QuicConfiguration(is_client=True, alpn_protocols=ALPN, verify_mode=ssl.CERT_NONE)
    config.idle_timeout = 60.0
    probe = socket.socket(socket.AF_INET6 if ":" in vip else socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect((vip, port))  # no packet: it only makes the kernel choose the flows' source address
    source = probe.getsockname()[0]
    probe.close()
    opened: list[tuple[Any, QuicConnectionProtocol]] = []
    for _ in range(conns):
        ctx = connect(vip, port, configuration=config, wait_connected=True)
        opened.append((ctx, await ctx.__aenter__()))
    first = await asyncio.gather(*(_ask(p, "who") for _, p in opened))
    rows = []
    for i, (_, p) in enumerate(opened):
        transport = p._transport
        assert transport is not None, "a connected protocol has its transport"
        local_port = transport.get_extra_info("sockname")[1]
        rows.append({"index": i, "addr": source, "port": local_port, "node": first[i]})
    print(json.dumps({"event": "ready", "conns": rows}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if line != "round":
            break
        answers = await asyncio.gather(*(_ask(p, "again") for _, p in opened))
        print(json.dumps({"event": "round", "answers": dict(enumerate(answers))}), flush=True)
    for ctx, _ in opened:
        ctx_exit = ctx.__aexit__(None, None, None)
        await asyncio.wait_for(ctx_exit, 2.0)


class QuicClient(ChurnClient):
    """The client above, running in a lab node: `.ready` its connections, `round()` asks them all again."""

    module = "lab.nodes.quic_echo"
    role: tuple[str, ...] = ("client",)
    what = "QUIC client"

    def round(self, timeout: float = 20.0) -> dict[int, str]:
        self._send("round")
        return {int(k): v for k, v in self._read("round", timeout)["answers"].items()}

    def close(self) -> None:
        """Input's end asks it to stop: it closes its connections (and the TCP client leaves and removes
        its cgroup) before anything is killed."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        super().close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.quic_echo")
    sub = ap.add_subparsers(dest="role", required=True)
    s = sub.add_parser("serve", help="the QUIC echo on a real")
    s.add_argument("--node", required=True)
    s.add_argument("--bind", action="append", required=True, metavar="ADDR:PORT")
    s.add_argument("--server-id", type=int, required=True, help="the 24-bit id its connection ids carry")
    s.add_argument("--until-eof", action="store_true", help="stop when standard input ends")
    c = sub.add_parser("client", help="connections to a VIP, asked again on each 'round'")
    c.add_argument("--vip", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--conns", type=int, default=12)
    args = ap.parse_args(argv)
    if args.role == "serve":
        asyncio.run(_serve(args.node, args.bind, args.server_id, args.until_eof))
    else:
        asyncio.run(_client(args.vip, args.port, args.conns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
