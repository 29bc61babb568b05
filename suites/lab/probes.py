"""Probes run inside a lab node (ICMP, ARP, HTTP, UDP, encapsulated UDP), and finding or removing a lab."""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct
import time
from pathlib import Path

from pyroute2 import IPRoute

from lab import netns, procs, programs
from lab.checksum import inet_checksum
from lab.nsexec import NETNS_DIR, entered
from lab.state import Undo, pin_dir, state_dir

ETH_P_ARP = 0x0806
PREFIX = "lbt-"  # every lab a test makes is named PREFIX + random hex


def ping(netns: str, dst: str, timeout: float = 2.0) -> int | None:
    """Send one ICMP(v6) echo from `netns` to `dst`; the reply's TTL / hop limit, or None on timeout."""
    addr = ipaddress.ip_address(dst)
    ident = os.getpid() & 0xFFFF
    if addr.version == 4:
        with entered(netns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        header = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"l4lab"
        packet = header[:2] + struct.pack("!H", inet_checksum(header)) + header[4:]
    else:
        with entered(netns):
            sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
        packet = struct.pack("!BBHHH", 128, 0, 0, ident, 1) + b"l4lab"  # the kernel fills the checksum
    with sock:
        sock.sendto(packet, (dst, 0))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            if addr.version == 4:
                data, peer = sock.recvfrom(2048)
                ihl = (data[0] & 0x0F) * 4
                if (
                    peer[0] == dst
                    and data[ihl] == 0
                    and struct.unpack("!H", data[ihl + 4 : ihl + 6])[0] == ident
                ):
                    return data[8]
            else:
                data, ancdata, _, peer = sock.recvmsg(2048, socket.CMSG_SPACE(4))
                if peer[0] == str(addr) and data[0] == 129 and struct.unpack("!H", data[4:6])[0] == ident:
                    for level, kind, value in ancdata:
                        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_HOPLIMIT:
                            return int(struct.unpack("i", value[:4])[0])
                    return -1
    return None


def arp_reply(netns: str, ifname: str, src_ip: str, target_ip: str, timeout: float = 0.5) -> str | None:
    """Broadcast an ARP request for `target_ip` out of `ifname` in `netns`; the replier's MAC, or None."""
    with entered(netns):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
    with sock:
        sock.bind((ifname, ETH_P_ARP))
        mac = sock.getsockname()[4][:6]
        arp = struct.pack(
            "!HHBBH6s4s6s4s",
            1, 0x0800, 6, 4, 1,
            mac, socket.inet_aton(src_ip), b"\0" * 6, socket.inet_aton(target_ip),
        )  # fmt: skip
        sock.send(b"\xff" * 6 + mac + struct.pack("!H", ETH_P_ARP) + arp)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            frame, meta = sock.recvfrom(2048)
            if meta[1] != ETH_P_ARP or len(frame) < 42:
                continue
            op = struct.unpack("!H", frame[20:22])[0]
            if op == 2 and frame[28:32] == socket.inet_aton(target_ip):
                return ":".join(f"{b:02x}" for b in frame[22:28])
    return None


def http_get(netns: str, host: str, port: int = 80, timeout: float = 3.0) -> str:
    """GET / on host:port from inside `netns`; the response body."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with entered(netns):
        sock = socket.socket(family, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(timeout)
        sock.connect((host, port))
        sock.sendall(f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head
    return body.decode()


def udp_exchange(netns: str, host: str, port: int, payload: bytes, timeout: float = 3.0) -> tuple[bytes, str]:
    """Send `payload` to host:port from inside `netns`; the reply and the address it came from."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with entered(netns):
        sock = socket.socket(family, socket.SOCK_DGRAM)
    with sock:
        sock.settimeout(timeout)
        sock.sendto(payload, (host, port))
        data, peer = sock.recvfrom(65535)
    return data, peer[0]


def addresses(netns: str, ifname: str) -> dict[str, int]:
    """Address -> IFA flags of every address on `ifname` inside `netns`."""
    with entered(netns):
        ipr = IPRoute()
    with ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        return {
            f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}": a.get_attr("IFA_FLAGS") or a["flags"]
            for a in ipr.get_addr(index=index)
        }


def lab_processes(lab: str) -> list[int]:
    """Pids of live processes started for `lab` (their command line carries `--lab LAB`)."""
    return [p.pid for p in procs.walk()
            if any(a == b"--lab" and b == lab.encode() for a, b in zip(p.argv, p.argv[1:], strict=False))]


def leftovers(lab: str) -> list[str]:
    """Everything of lab `lab` still on the machine: netns, pins, state, processes (empty when clean)."""
    left = [f"netns {p.name}" for p in NETNS_DIR.glob(f"{lab}-*")]
    if pin_dir(lab).exists():
        left.append(f"pins {pin_dir(lab)}")
    if state_dir(lab).exists():
        left.append(f"state {state_dir(lab)}")
    left += [f"process {pid}" for pid in lab_processes(lab)]
    # The lab's balancer instances are named <lab>-<node>; lab names are random, so the glob is ours.
    from balancer import controller

    left += [f"balancer pins {p}" for p in Path(controller.PIN_ROOT).glob(f"{lab}-*")]
    left += [f"balancer state {p}" for p in Path(controller.STATE_ROOT).glob(f"{lab}-*")]
    return left


def bpf_available() -> str | None:
    """None when the lab's BPF programs can be attached here, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "needs root"
    if not os.path.ismount("/sys/fs/bpf"):
        return "bpffs is not mounted on /sys/fs/bpf (run `make deps`)"
    for obj in ("pass.o", programs.DECAP_OBJECT):
        if not (programs.OBJECT_DIR / obj).is_file():
            return f"{programs.OBJECT_DIR / obj} is missing (run `make bpf`)"
    try:
        import balancer.datapath  # noqa: F401
    except ImportError as exc:
        return f"balancer.datapath cannot be imported: {exc}"
    return None


def remove_lab(lab: str) -> None:
    """Tear `lab` down from its journal, then remove any namespace of its name the journal missed."""
    if state_dir(lab).exists():
        netns.teardown(lab)
    for path in NETNS_DIR.glob(f"{lab}-*"):
        netns.undo_one(Undo("netns", path.name))


def encapsulated_udp(
    netns: str,
    encap: str,
    outer_dst: str,
    inner_src: str,
    inner_dst: str,
    sport: int,
    dport: int,
    payload: bytes,
) -> None:
    """Send a UDP datagram inner_src:sport -> inner_dst:dport from `netns`, encapsulated as an LB would.

    `encap` is "ipip" (IPv4 in IPv4), "ip6ip6" (IPv6 in IPv6) or "gue1" (the inner IP packet directly
    in UDP to port 6080); the kernel adds the outer header from a socket of the matching kind.
    """
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6

    ip_layer = IPv6(src=inner_src, dst=inner_dst) if ":" in inner_dst else IP(src=inner_src, dst=inner_dst)
    inner = bytes(ip_layer / UDP(sport=sport, dport=dport) / payload)
    kinds = {
        "ipip": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_IPIP),
        "ip6ip6": (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_IPV6),
        "gue1": (socket.AF_INET6 if ":" in outer_dst else socket.AF_INET, socket.SOCK_DGRAM, 0),
    }
    with entered(netns):
        sock = socket.socket(*kinds[encap])
    with sock:
        sock.sendto(inner, (outer_dst, 6080 if encap == "gue1" else 0))


def udp_listener(netns: str, host: str) -> socket.socket:
    """A UDP socket bound to host (any port) inside `netns`, with a 3 s timeout."""
    with entered(netns):
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(3.0)
    sock.bind((host, 0))
    return sock
