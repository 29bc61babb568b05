"""The default lab as built: routing via the router, the reals' DSR set-up, services, offloads, programs."""

from __future__ import annotations

import pytest

from lab import nsconf, topology
from lab.state import LabState
from suites.lab import probes
from suites.lab.probes import bpf_available

REALS = [
    (1, "203.0.113.18", "2001:db8:e1::2"),
    (2, "203.0.113.34", "2001:db8:e2::2"),
    (3, "203.0.113.50", "2001:db8:e3::2"),
]
VIP4, VIP6 = "198.51.100.100", "2001:db8:100::100"


@pytest.mark.parametrize(("i", "addr4", "addr6"), REALS, ids=["real1", "real2", "real3"])
def test_client_reaches_each_real_through_the_router(
    default_lab: LabState, i: int, addr4: str, addr6: str
) -> None:
    client = f"{default_lab.name}-client"
    # One hop: the router forwarded it (TTL / hop limit 64 left the real, 63 arrive).
    assert probes.ping(client, addr4) == 63
    assert probes.ping(client, addr6) == 63


def test_client_extra_addresses_are_usable_sources(default_lab: LabState) -> None:
    flags = probes.addresses(f"{default_lab.name}-client", "cl-rt")
    for addr in ("192.0.2.2/28", "192.0.2.5/28", "2001:db8:c::2/64", "2001:db8:c::5/64"):
        assert addr in flags


def test_nothing_is_tentative(default_lab: LabState) -> None:
    tentative = 0x40  # IFA_F_TENTATIVE
    for node, ifname in (("client", "cl-rt"), ("router", "rt-r1"), ("real1", "r1-rt"), ("real2", "lo")):
        for addr, flags in probes.addresses(f"{default_lab.name}-{node}", ifname).items():
            assert not flags & tentative, f"{addr} on {node}/{ifname} is tentative"


@pytest.mark.parametrize("i", [1, 2, 3])
def test_reals_hold_the_vips_on_lo(default_lab: LabState, i: int) -> None:
    lo = probes.addresses(f"{default_lab.name}-real{i}", "lo")
    assert f"{VIP4}/32" in lo and f"{VIP6}/128" in lo
    assert f"{VIP4}/32" not in probes.addresses(f"{default_lab.name}-real{i}", f"r{i}-rt")


@pytest.mark.parametrize("i", [1, 2, 3])
def test_reals_do_not_answer_arp_for_the_vip(default_lab: LabState, i: int) -> None:
    router = f"{default_lab.name}-router"
    src = f"203.0.113.{16 * i + 1}"
    # Control: the same probe gets an answer for the real's own address, so silence means suppression.
    assert probes.arp_reply(router, f"rt-r{i}", src, f"203.0.113.{16 * i + 2}") is not None
    assert probes.arp_reply(router, f"rt-r{i}", src, VIP4) is None


SYSCTLS = [
    ("router", "net.ipv4.ip_forward", "1"),
    ("router", "net.ipv6.conf.all.forwarding", "1"),
    ("router", "net.ipv4.conf.all.rp_filter", "0"),
    ("router", "net.ipv4.conf.default.rp_filter", "0"),
    ("router", "net.ipv4.conf.rt-r1.rp_filter", "0"),
    ("router", "net.ipv4.conf.rt-lb.rp_filter", "0"),
    ("real1", "net.ipv4.conf.all.arp_ignore", "1"),
    ("real1", "net.ipv4.conf.lo.arp_ignore", "1"),
    ("real1", "net.ipv4.conf.all.arp_announce", "2"),
    ("real2", "net.ipv4.conf.r2-rt.rp_filter", "0"),
    ("real3", "net.ipv4.conf.all.rp_filter", "0"),
    ("client", "net.ipv6.conf.cl-rt.accept_dad", "0"),
]


@pytest.mark.parametrize(("node", "key", "value"), SYSCTLS, ids=[f"{n}:{k}" for n, k, _ in SYSCTLS])
def test_sysctls_are_set(default_lab: LabState, node: str, key: str, value: str) -> None:
    assert nsconf.read_sysctl(f"{default_lab.name}-{node}", key) == value


def test_tx_checksum_offload_is_off_only_towards_the_lb(default_lab: LabState) -> None:
    router = f"{default_lab.name}-router"
    assert nsconf.tx_checksum(router, "rt-lb") is False
    assert nsconf.tx_checksum(router, "rt-r1") is True


@pytest.mark.parametrize("i", [1, 2, 3])
@pytest.mark.parametrize("vip", [VIP4, VIP6], ids=["ip4", "ip6"])
def test_reals_serve_http_and_udp_echo_on_the_vips(default_lab: LabState, i: int, vip: str) -> None:
    real = f"{default_lab.name}-real{i}"
    assert probes.http_get(real, vip) == f"real{i}\n"
    reply, source = probes.udp_exchange(real, vip, 9000, b"hello")
    assert reply == f"real{i} hello".encode()
    assert source == vip  # DSR: the reply leaves from the VIP, not the real's own address


def test_services_answer_only_on_the_vips(default_lab: LabState) -> None:
    with pytest.raises(ConnectionRefusedError):
        probes.http_get(f"{default_lab.name}-real1", "203.0.113.18")


@pytest.mark.skipif(bpf_available() is not None, reason=str(bpf_available()))
def test_programs_are_attached_and_pinned(default_lab: LabState) -> None:
    progs = {(p.node, p.ifname, p.hook, p.program) for p in default_lab.programs}
    assert progs == {
        ("router", "rt-lb", "xdp-native", "xdp_pass"),
        ("real1", "r1-rt", "tc-ingress", "decap_tc"),
        ("real2", "r2-rt", "tc-ingress", "decap_tc"),
        ("real3", "r3-rt", "tc-ingress", "decap_tc"),
    }
    for prog in default_lab.programs:
        assert prog.pin.startswith(f"/sys/fs/bpf/l4lab/{default_lab.name}/{prog.node}/")
    report = netns_status(default_lab)
    router = next(n for n in report["nodes"] if n["name"] == "router")
    assert {i["ifname"]: i["xdp_attached"] for i in router["interfaces"]}["rt-lb"] is True
    assert all(p["pinned"] for n in report["nodes"] for p in n["programs"])


def netns_status(lab: LabState) -> dict[str, object]:
    from lab import status

    return status.collect(lab.name)


def test_topology_of_the_state_is_the_default(default_lab: LabState) -> None:
    assert default_lab.topology == "default"
    assert topology.load(default_lab.topology).name == "default"


DECAP_CASES = [
    ("ip4-ipip", "ipip", "203.0.113.18", "192.0.2.2", VIP4, 1),
    ("ip4-gue1", "gue1", "203.0.113.34", "192.0.2.3", VIP4, 2),
    ("ip6-ip6ip6", "ip6ip6", "2001:db8:e3::2", "2001:db8:c::2", VIP6, 3),
]


@pytest.mark.skipif(bpf_available() is not None, reason=str(bpf_available()))
@pytest.mark.parametrize(
    ("encap", "outer_dst", "client_addr", "vip", "i"),
    [c[1:] for c in DECAP_CASES],
    ids=[c[0] for c in DECAP_CASES],
)
def test_real_decapsulates_and_answers_the_client_directly(
    default_lab: LabState, encap: str, outer_dst: str, client_addr: str, vip: str, i: int
) -> None:
    """The LB's job done by hand from the router: the real decaps, its echo goes straight to the client."""
    with probes.udp_listener(f"{default_lab.name}-client", client_addr) as client:
        port = client.getsockname()[1]
        probes.encapsulated_udp(
            f"{default_lab.name}-router", encap, outer_dst, client_addr, vip, port, 9000, b"dsr"
        )
        data, peer = client.recvfrom(2048)
    assert data == f"real{i} dsr".encode()
    assert peer[0] == vip and peer[1] == 9000
