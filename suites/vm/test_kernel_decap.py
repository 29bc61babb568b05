"""A real Linux kernel (Debian's cloud kernel in a qemu VM) decapsulates every encapsulation the LB emits.

Hand-built encapsulated packets leave the namespace through a raw socket towards the VM's own
address; the VM's tunl0 / ip6tnl0 / fou take the outer headers off, the inner packet reaches a
VIP on lo, and the answer goes straight back from the VIP to the inner source (the client
address on the namespace's lo), unencapsulated: direct server return.

Case ids are the catalogue's (balancer/encaps.py, outer stack first): `ip4-ipip` (4in4),
`ip6-ip4ip6` (4in6), `ip6-ip6ip6` (6in6), `ip4-gue1`/`ip6-gue1` (GUE variant 1, the IP packet right
after UDP), `ip4-gue0` (GUE variant 0, a 4-byte header); beside them two the LB does not emit but a
kernel real must take too: `ip6-gue0` and `ip4-fou` (IPIP-in-UDP on a plain FOU port). GUE cases
carry a computed outer UDP checksum, as the balancer sends by default; `-csum0` cases carry a zero
one over IPv4, as it sends for a VIP with gue_csum = "zero" (RFC 768). Zero over IPv6 needs the
operator's opt-in on the real too
(RFC 6935/6936; fou's udp6zerocsumrx), which the VM does not set, so it is not a case here.
"""

from __future__ import annotations

import itertools
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet

from balancer import _abi, encaps
from balancer.encaps import EncapCase
from lab.harness.vmlab import VmLab
from lab.nsexec import entered
from lab.packets.gue import GUE
from lab.remote.vm import VmReal

GUE_PORT = 6080
FOU_PORT = 6081
ECHO_PORT = 9000
HTTP_PORT = 80
REPLY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Encap:
    """One way of carrying a packet to the VM: the inner (VIP) family and the outer headers."""

    id: str
    inner_family: int
    outer_family: int
    wrap: Callable[[VmLab, Packet], Packet]


def _outer4(lab: VmLab) -> Packet:
    return IP(src=lab.router4, dst=lab.vm.addr)


def _outer6(lab: VmLab) -> Packet:
    assert lab.vm.addr6 is not None
    return IPv6(src=lab.router6, dst=lab.vm.addr6)


_PORTS = itertools.count(secrets.randbelow(4000))


def _sport() -> int:
    """A client port above Linux's ephemeral range (32768-60999): never one an earlier HTTP test's
    connection used, which the VM may still hold in TIME-WAIT (a SYN there gets a challenge ACK).
    Taken in turn from a random start, not drawn each time: the SYN tests leave their handshakes half
    open, and a draw that repeats an earlier test's port (4,000 ports, a few dozen draws a run) can
    get the VM's ACK for that half-open connection instead of a SYN-ACK (seen once in .ci/run)."""
    return 61000 + next(_PORTS) % 4000


def _wrapper(outer_family: int, inner_family: int, gue: int | None = None, csum0: bool = False,
             port: int = GUE_PORT) -> Callable[[VmLab, Packet], Packet]:
    """The outer headers of one case: IPIP when `gue` is None, else UDP to `port` with GUE variant `gue`."""
    def wrap(lab: VmLab, p: Packet) -> Packet:
        outer = _outer4(lab) if outer_family == 4 else _outer6(lab)
        if gue is None:
            return outer / p
        udp = UDP(sport=_sport(), dport=port, **({"chksum": 0} if csum0 else {}))
        if gue == 0:
            return outer / udp / GUE() / p
        return outer / udp / p
    return wrap


def _of(case: EncapCase, csum0: bool = False) -> Encap:
    """A catalogue case as the LB emits it (`-csum0`: with the outer UDP checksum zero)."""
    gue = {_abi.Encap.GUE1: 1, _abi.Encap.GUE0: 0}.get(case.mode)
    return Encap(f"{case}-csum0" if csum0 else case.id, _AF[case.vip_family], _AF[case.outer_family],
                 _wrapper(case.outer_family, case.vip_family, gue, csum0))


_AF = {4: socket.AF_INET, 6: socket.AF_INET6}
# Every catalogue case, the IPv4 GUE cases again with a zero checksum, and what the LB does not emit
# but a kernel real must still take: GUE variant 0 over IPv6 and IPIP-in-UDP on a plain FOU port.
ENCAPS = [
    *(_of(case) for case in encaps.CASES),
    *(_of(case, csum0=True) for case in encaps.CASES if case.gue and case.outer_family == 4),
    Encap("ip6-gue0", socket.AF_INET6, socket.AF_INET6, _wrapper(6, 6, gue=0)),
    Encap("ip4-fou", socket.AF_INET, socket.AF_INET, _wrapper(4, 4, gue=1, port=FOU_PORT)),
]


def addresses(lab: VmLab, family: int) -> tuple[str, str]:
    """(client, VIP) of the inner packet for a family."""
    return (lab.client4, lab.vip4) if family == socket.AF_INET else (lab.client6, lab.vip6)


def inner_ip(family: int, src: str, dst: str) -> Packet:
    return IP(src=src, dst=dst) if family == socket.AF_INET else IPv6(src=src, dst=dst)


def send_raw(lab: VmLab, encap: Encap, packet: Packet) -> None:
    """Send a complete outer IP packet from the lab namespace towards the VM (routing picks the tap)."""
    dst = lab.vm.addr if encap.outer_family == socket.AF_INET else lab.vm.addr6
    with entered(lab.netns), socket.socket(encap.outer_family, socket.SOCK_RAW,
                                                  socket.IPPROTO_RAW) as raw:
        raw.sendto(bytes(packet), (dst, 0))


@pytest.mark.parametrize("encap", ENCAPS, ids=[e.id for e in ENCAPS])
def test_udp_to_vip_is_decapsulated_and_answered_from_vip(vm_lab: VmLab, encap: Encap) -> None:
    client, vip = addresses(vm_lab, encap.inner_family)
    cport = _sport()
    payload = f"{encap.id} {secrets.token_hex(8)}".encode()
    with entered(vm_lab.netns):
        sock = socket.socket(encap.inner_family, socket.SOCK_DGRAM)
    with sock:
        sock.bind((client, cport))
        sock.settimeout(1.0)
        inner = inner_ip(encap.inner_family, client, vip) / UDP(sport=cport, dport=ECHO_PORT) / payload
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            # UDP may lose a datagram (e.g. while the just-booted VM resolves its neighbours): resend
            # the same one every second until the echo comes back or the deadline passes.
            send_raw(vm_lab, encap, encap.wrap(vm_lab, inner))
            try:
                data, peer = sock.recvfrom(65535)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"{encap.id}: no UDP echo from {vip}:{ECHO_PORT} to {client}:{cport} within "
                        f"{REPLY_TIMEOUT_S} s; VM console:\n{vm_lab.vm.console()}"
                    )
    assert (peer[0], peer[1]) == (vip, ECHO_PORT), f"{encap.id}: echo came from {peer}, not the VIP"
    assert data == payload


def _recv_tcp(sock: socket.socket, family: int) -> tuple[str, Packet] | None:
    """One TCP segment from a raw socket as (source address, TCP layer), or None on timeout."""
    try:
        data, peer = sock.recvfrom(65535)
    except TimeoutError:
        return None
    if family == socket.AF_INET:  # IPv4 raw sockets deliver the IP header, IPv6 ones do not
        packet = IP(data)
        return str(packet.src), packet[TCP]
    return str(peer[0]), TCP(data)


@pytest.mark.parametrize("encap", ENCAPS, ids=[e.id for e in ENCAPS])
def test_tcp_syn_to_vip_gets_syn_ack_from_vip(vm_lab: VmLab, encap: Encap) -> None:
    client, vip = addresses(vm_lab, encap.inner_family)
    cport = _sport()
    seq = secrets.randbelow(2**32)
    with entered(vm_lab.netns):
        sniff = socket.socket(encap.inner_family, socket.SOCK_RAW, socket.IPPROTO_TCP)
    with sniff:
        inner = inner_ip(encap.inner_family, client, vip) / TCP(
            sport=cport, dport=HTTP_PORT, flags="S", seq=seq
        )
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        next_send = time.monotonic()
        while (left := deadline - time.monotonic()) > 0:
            if time.monotonic() >= next_send:  # the same SYN again each second, as a TCP stack would
                send_raw(vm_lab, encap, encap.wrap(vm_lab, inner))
                next_send = time.monotonic() + 1.0
            sniff.settimeout(max(0.01, min(left, next_send - time.monotonic())))
            got = _recv_tcp(sniff, encap.inner_family)
            if got is None:
                continue
            src, tcp = got
            if tcp.sport == HTTP_PORT and tcp.dport == cport:
                assert src == vip, f"{encap.id}: SYN-ACK came from {src}, not the VIP"
                assert tcp.flags == "SA", f"{encap.id}: expected SYN-ACK, got flags {tcp.flags}"
                assert tcp.ack == (seq + 1) % 2**32
                return
    pytest.fail(
        f"{encap.id}: no SYN-ACK from {vip}:{HTTP_PORT} to {client}:{cport} within "
        f"{REPLY_TIMEOUT_S} s; VM console:\n{vm_lab.vm.console()}"
    )


def test_unencapsulated_http_get_to_vm_address(vm_lab: VmLab) -> None:
    with entered(vm_lab.netns):
        conn = socket.create_connection((vm_lab.vm.addr, HTTP_PORT), timeout=REPLY_TIMEOUT_S)
    with conn:
        conn.sendall(f"GET / HTTP/1.0\r\nHost: {vm_lab.vm.addr}\r\n\r\n".encode())
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    status, _, body = reply.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.") and b" 200 " in status.split(b"\r\n")[0], status
    assert f"l4lab real server {vm_lab.vm.name}".encode() in body


def test_packet_for_a_port_without_fou_is_not_decapsulated(vm_lab: VmLab) -> None:
    """Control: IP-in-UDP to a port with no fou listener must not reach the VIP (the oracle can fail)."""
    cport = _sport()
    with entered(vm_lab.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.bind((vm_lab.client4, cport))
        sock.settimeout(1.0)
        inner = IP(src=vm_lab.client4, dst=vm_lab.vip4) / UDP(sport=cport, dport=ECHO_PORT) / b"x"
        outer = IP(src=vm_lab.router4, dst=vm_lab.vm.addr) / UDP(sport=_sport(), dport=GUE_PORT + 100)
        send_raw(vm_lab, ENCAPS[0], outer / inner)
        with pytest.raises(TimeoutError):
            sock.recvfrom(65535)


def test_vm_reported_ready_and_boot_time(vm_lab: VmLab) -> None:
    vm = vm_lab.vm
    assert vm.boot_seconds is not None and vm.guest_uptime is not None
    ready = [line for line in vm.console().splitlines() if line.startswith("L4LAB-READY")]
    assert ready == [f"L4LAB-READY name={vm.name} uptime={vm.guest_uptime:.2f}"]
    # The guest's clock starts after qemu does, so its uptime is below the host's wall time.
    assert 0 < vm.guest_uptime < vm.boot_seconds
    print(f"vm boot: {vm.boot_seconds:.2f} s wall, guest uptime {vm.guest_uptime:.2f} s")


def test_vm_real_fixture_serves_http_on_its_own_address(vm_real: VmReal, vm_lab: VmLab) -> None:
    """The plugin's vm_real is the booted VM: its HTTP server answers with a page naming it. (Here, not
    in test_vm_lifecycle.py: vm_lab boots one VM per module, and this module has it booted already.)"""
    import http.client

    conn = http.client.HTTPConnection(vm_real.addr, 80, timeout=5)
    with entered(vm_lab.netns):
        conn.connect()  # the socket is made in the lab's namespace
    try:
        conn.request("GET", "/")
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    assert vm_real.name in body and vm_real.boot_seconds is not None
