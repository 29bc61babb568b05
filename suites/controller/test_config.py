"""The controller configuration (balancer/config.py): defaults, every validation message, dump round trip."""

from __future__ import annotations

import dataclasses
import ipaddress
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer import config
from balancer.config import Config, DatapathConfig, EncapConfig, HealthCheck, MetricsConfig, Real, Vip
from balancer.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "balancer" / "examples" / "lb.toml"

VIP = """
[[vips]]
address = "198.51.100.100"
port = 80
proto = "tcp"
reals = [{ address = "203.0.113.18" }]
"""


def parse(text: str) -> Config:
    return config.loads(textwrap.dedent(text), "lb.toml")


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return str(info.value)


# ------------------------------------------------------------------------------------ example


def test_example_file_loads_with_the_default_lab() -> None:
    c = config.load(EXAMPLE)
    assert [v.name for v in c.vips] == [
        "198.51.100.100:80/tcp",
        "198.51.100.100:9000/udp",
        "[2001:db8:100::100]:80/tcp",
        "198.51.100.100:443/udp",
    ]
    assert [str(r.address) for r in c.vips[0].reals] == ["203.0.113.18", "203.0.113.34", "203.0.113.50"]
    assert [str(r.address) for r in c.vips[1].reals] == ["203.0.113.18", "203.0.113.34", "203.0.113.50"]
    assert [str(r.address) for r in c.vips[2].reals] == ["2001:db8:e1::2", "2001:db8:e2::2", "2001:db8:e3::2"]
    assert c.vips[1].encap == "gue1" and c.vips[1].outer_src == "fixed" and c.vips[1].gue_csum == "compute"
    assert c.vips[0].healthcheck == HealthCheck(port=80)
    assert c.datapath.interfaces == ("lb-rt",)
    quic = c.vips[3]
    assert (quic.server_id_from, quic.udp_flow_migration, [r.server_id for r in quic.reals]) == \
        ("quic", True, [101, 102, 103])
    assert [(d.address, d.action) for d in c.decap] == [(quic.address.__class__("198.51.100.2"), "balance")]


def test_gue_checksum_zero_is_a_vip_flag() -> None:
    from balancer import _abi
    from balancer.controller import vip_flags

    c = parse('[[vips]]\naddress = "2001:db8:100::100"\nport = 80\nproto = "tcp"\nencap = "gue1"\n'
              'gue_csum = "zero"')
    assert c.vips[0].gue_csum == "zero" and vip_flags(c.vips[0]) & _abi.VipFlag.GUE_CSUM_ZERO
    computed = parse('[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\nencap = "gue1"')
    assert computed.vips[0].gue_csum == "compute" and not vip_flags(computed.vips[0]) & _abi.VipFlag.GUE_CSUM_ZERO


@pytest.mark.parametrize(("hash_name", "port", "fields", "address"), [
    ("katran", 80, 0, "198.51.100.100"), ("katran", 0, "HASH_KATRAN_NO_DPORT", "198.51.100.100"),
    ("katran-no-sport", 80, "HASH_NO_SPORT", "198.51.100.100"),
    ("katran-no-sport", 0, "HASH_NO_SPORT|HASH_KATRAN_NO_DPORT", "198.51.100.100"),
    ("katran-dport-only", 0, "HASH_DPORT_ONLY", "198.51.100.100"), ("katran-src-dst-port", 0, 0, "198.51.100.100"),
    ("katran-src-dst-port", 80, 0, "198.51.100.100"), ("katran", 443, "HASH_KATRAN_NO_DPORT", "2001:db8:200::/96"),
    ("katran-src-dst-port", 443, 0, "2001:db8:200::/96")])
def test_katran_hashes_are_vip_flags(hash_name: str, port: int, fields: str | int, address: str) -> None:
    """Katran zeroes the destination port of a port-0 or CIDR VIP's flows unless the VIP hashes it."""
    from balancer import _abi
    from balancer.controller import ring_kind, vip_flags

    c = parse(f'[[vips]]\naddress = "{address}"\nport = {port}\nproto = "tcp"\nhash = "{hash_name}"\n'
              'katran_ring = "v2"')
    want = _abi.VipFlag.HASH_KATRAN | _abi.VipFlag.OUTER_SRC_FLOW
    for name in str(fields).split("|") if fields else ():
        want |= _abi.VipFlag[name]
    assert vip_flags(c.vips[0]) == want
    assert c.vips[0].katran and c.vips[0].katran_ring == "v2" and ring_kind(c.vips[0]) == "katran-v2"
    assert ring_kind(parse(VIP).vips[0]) == "l4lab" and not parse(VIP).vips[0].katran


def test_example_round_trips() -> None:
    c = config.load(EXAMPLE)
    assert config.loads(config.dump(c)) == c


# ------------------------------------------------------------------------------------ defaults


def test_empty_file_gives_the_documented_defaults() -> None:
    c = parse("")
    assert c == Config()
    assert c.datapath == DatapathConfig(
        interfaces=("lb-rt",),
        mode="native",
        mtu=1500,
        max_vips=64,
        max_reals=1024,
        ring_size=65537,
        lru_size=65536,
        fallback_size=16384,
        udp_timeout_s=30,
        frags=False,
        katran_max_vips=512,
    )
    assert c.encap == EncapConfig(
        nexthop_mac="auto",
        gue_port=6080,
        src4=ipaddress.IPv4Network("198.51.100.128/25"),
        src6=ipaddress.IPv6Network("2001:db8:1b:80::/64"),
    )
    assert c.metrics == MetricsConfig("127.0.0.1:9100")
    assert (c.metrics.host, c.metrics.port) == ("127.0.0.1", 9100)
    assert c.vips == ()


def test_vip_defaults_and_resolved_defaults() -> None:
    c = parse(
        VIP
        + """
        [vips.healthcheck]
        type = "http"
        [[vips]]
        address = "198.51.100.101"
        port = 0
        proto = "udp"
        encap = "gue0"
        """
    )
    a, b = c.vips
    assert a == Vip(
        address=ipaddress.ip_address("198.51.100.100"),
        port=80,
        proto="tcp",
        encap="ipip",
        hash="5tuple",
        lru=True,
        outer_src="flow",
        reals=(Real(ipaddress.ip_address("203.0.113.18"), 1),),
        healthcheck=HealthCheck(port=80, type="http", path="/"),
    )
    assert b.outer_src == "fixed", "GUE defaults to a fixed outer source"
    assert b.reals == () and b.healthcheck is None
    assert b.name == "198.51.100.101:0/udp" and b.family == 4


def test_ipv4_vip_may_have_ipv6_reals() -> None:
    c = parse(
        """
        [[vips]]
        address = "198.51.100.100"
        port = 80
        proto = "tcp"
        reals = [{ address = "2001:db8:e1::2", weight = 3 }]
        """
    )
    assert c.vips[0].reals[0].family == 6 and c.vips[0].reals[0].weight == 3


def test_normalisations() -> None:
    c = parse('[encap]\nnexthop_mac = "02:AB:cd:00:00:01"\nsrc4 = "198.51.100.7"\nsrc6 = "2001:DB8::1/128"\n')
    assert c.encap.nexthop_mac == "02:ab:cd:00:00:01"
    assert c.encap.src4 == ipaddress.IPv4Network("198.51.100.7/32")
    assert c.encap.src6 == ipaddress.IPv6Network("2001:db8::1/128")


# ------------------------------------------------------------------------------ error messages


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # datapath
        (
            "[datapath]\ninterfaces = []",
            "lb.toml: datapath.interfaces must be at least one interface name but got []",
        ),
        (
            '[datapath]\ninterfaces = "lb-rt"',
            'lb.toml: datapath.interfaces must be a list of interface names but got "lb-rt"',
        ),
        (
            '[datapath]\ninterfaces = ["lb-rt", "a-very-long-interface"]',
            "lb.toml: datapath.interfaces[1] must be an interface name of 1..15 characters "
            "without '/', ':' or spaces but got \"a-very-long-interface\"",
        ),
        (
            '[datapath]\ninterfaces = ["lb-rt", "lb-rt"]',
            'lb.toml: datapath.interfaces[1] must be an interface not listed before but got "lb-rt"',
        ),
        (
            '[datapath]\nmode = "skb"',
            'lb.toml: datapath.mode must be "native" | "generic" | "auto" but got "skb"',
        ),
        ("[datapath]\nmtu = 67", "lb.toml: datapath.mtu must be 68..9216 but got 67"),
        ("[datapath]\nmtu = 9217", "lb.toml: datapath.mtu must be 68..9216 but got 9217"),
        ('[datapath]\nmtu = "1500"', 'lb.toml: datapath.mtu must be an integer 68..9216 but got "1500"'),
        ("[datapath]\nmtu = 1500.0", "lb.toml: datapath.mtu must be an integer 68..9216 but got 1500.0"),
        ("[datapath]\nmtu = true", "lb.toml: datapath.mtu must be an integer 68..9216 but got true"),
        (
            "[datapath]\nring_size = 65536",
            "lb.toml: datapath.ring_size must be a prime number (Maglev needs one), such as 65537 "
            "but got 65536",
        ),
        (
            "[datapath]\nmax_vips = 100000",
            "lb.toml: datapath.max_vips must be at most 65535 with ring_size = 65537 "
            "(max_vips × ring_size slots must fit a 32-bit index) but got 100000",
        ),
        ("[datapath]\nmax_vips = 0", "lb.toml: datapath.max_vips must be 1..4294967295 but got 0"),
        ("[datapath]\nudp_timeout_s = 0", "lb.toml: datapath.udp_timeout_s must be 1..86400 but got 0"),
        ("[datapath]\nfrags = 1", "lb.toml: datapath.frags must be true or false but got 1"),
        (
            "[datapath]\nmtus = 1500",
            "lb.toml: datapath.mtus is not a known key; known keys here: egress, fallback_size, frags, interfaces, "
            "katran_max_vips, lru_size, max_reals, max_vips, mode, mtu, object, ring_size, udp_timeout_s",
        ),
        ("datapath = 3", "lb.toml: datapath must be a table but got 3"),
        (
            "[bgp]\nasn = 1",
            "lb.toml: bgp is not a known key; known keys here: datapath, decap, encap, metrics, vips",
        ),
        # encap
        (
            '[encap]\nnexthop_mac = "02:00:00:00:01"',
            'lb.toml: encap.nexthop_mac must be "auto" or a MAC address such as "02:00:00:00:00:01" '
            'but got "02:00:00:00:01"',
        ),
        (
            '[encap]\nnexthop_mac = "ff:ff:ff:ff:ff:ff"',
            "lb.toml: encap.nexthop_mac must be a unicast MAC address (the next hop's), not a multicast one "
            'but got "ff:ff:ff:ff:ff:ff"',
        ),
        ("[encap]\ngue_port = 0", "lb.toml: encap.gue_port must be 1..65535 but got 0"),
        (
            '[encap]\nsrc4 = "2001:db8::/64"',
            'lb.toml: encap.src4 must be an IPv4 prefix such as "198.51.100.128/25" '
            '(a single address = fixed source) but got "2001:db8::/64"',
        ),
        (
            '[encap]\nsrc4 = "198.51.100.129/25"',
            'lb.toml: encap.src4 must be a prefix without host bits, such as "198.51.100.128/25" '
            'but got "198.51.100.129/25"',
        ),
        (
            '[encap]\nsrc6 = "nope"',
            'lb.toml: encap.src6 must be an IPv6 prefix such as "2001:db8:1b:80::/64" '
            '(a single address = fixed source) but got "nope"',
        ),
        # metrics
        (
            '[metrics]\nlisten = "localhost:9100"',
            'lb.toml: metrics.listen must be host:port with an IP address, such as "127.0.0.1:9100" or '
            '"[::1]:9100" but got "localhost:9100"',
        ),
        (
            '[metrics]\nlisten = "127.0.0.1:0"',
            'lb.toml: metrics.listen must be host:port with an IP address, such as "127.0.0.1:9100" or '
            '"[::1]:9100" but got "127.0.0.1:0"',
        ),
        # vips
        ("vips = 1", "lb.toml: vips must be an array of tables but got 1"),
        ("vips = [1]", "lb.toml: vips[0] must be a table but got 1"),
        (
            '[[vips]]\nport = 80\nproto = "tcp"',
            'lb.toml: vips[0].address is missing; it must be an IPv4 or IPv6 address, or a prefix such as '
            '"10.200.0.0/24"',
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nproto = "tcp"',
            "lb.toml: vips[0].port is missing; it must be an integer 0..65535 (0 = every port)",
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 65536\nproto = "tcp"',
            "lb.toml: vips[0].port must be 0..65535 (0 = every port) but got 65536",
        ),
        (
            '[[vips]]\naddress = "198.51.100.300"\nport = 80\nproto = "tcp"',
            'lb.toml: vips[0].address must be an IPv4 or IPv6 address, or a prefix such as "10.200.0.0/24" '
            'but got "198.51.100.300"',
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "sctp"',
            'lb.toml: vips[0].proto must be "tcp" | "udp" but got "sctp"',
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\nencap = "gue"',
            'lb.toml: vips[0].encap must be "ipip" | "gue1" | "gue0" but got "gue"',
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\nhash = "sport"',
            'lb.toml: vips[0].hash must be "5tuple" | "no-sport" | "dport-only" | "katran" | "katran-no-sport" | '
            '"katran-dport-only" | "katran-src-dst-port" but got "sport"',
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\nhash = "katran"\nkatran_ring = "v3"',
            'lb.toml: vips[0].katran_ring must be "v1" | "v2" but got "v3"',
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\nkatran_ring = "v2"',
            'lb.toml: vips[0].katran_ring applies only to a katran hash (hash = "katran"...), not to '
            'hash = "5tuple"; remove it or set hash = "katran"',
        ),
        ("[datapath]\nkatran_max_vips = 0", "lb.toml: datapath.katran_max_vips must be 1..4294967295 but got 0"),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\nouter_src = "random"',
            'lb.toml: vips[0].outer_src must be "flow" | "fixed" but got "random"',
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\ngue_csum = "off"',
            'lb.toml: vips[0].gue_csum must be "compute" | "zero" but got "off"',
        ),
        (
            '[[vips]]\naddress = "198.51.100.100"\nport = 80\nprot = "tcp"',
            "lb.toml: vips[0].prot is not a known key; known keys here: address, encap, gue_csum, hash, "
            "healthcheck, katran_ring, lru, outer_src, port, proto, reals, server_id_from, src_routes, "
            "udp_flow_migration",
        ),
    ],
)
def test_error_messages(text: str, message: str) -> None:
    assert error_of(text) == message


@pytest.mark.parametrize(
    ("reals", "message"),
    [
        (
            '[{ address = "203.0.113.18", weight = 65536 }]',
            "vips[0].reals[0].weight must be 0..65535 but got 65536",
        ),
        (
            '[{ address = "203.0.113.18", weight = -1 }]',
            "vips[0].reals[0].weight must be 0..65535 but got -1",
        ),
        (
            '[{ address = "203.0.113.18", weight = 1.5 }]',
            "vips[0].reals[0].weight must be an integer 0..65535 but got 1.5",
        ),
        (
            '[{ address = "203.0.113.18", port = 8080 }]',
            "vips[0].reals[0].port is not a known key; known keys here: address, server_id, weight",
        ),
        ("[{ weight = 1 }]", "vips[0].reals[0].address is missing; it must be an IPv4 or IPv6 address"),
        ('["203.0.113.18"]', 'vips[0].reals[0] must be a table but got "203.0.113.18"'),
        (
            '[{ address = "203.0.113.18" }, { address = "203.0.113.34" }, { address = "203.0.113.18" }]',
            "vips[0].reals[2].address must be an address not already listed (reals[0]) "
            'but got "203.0.113.18"',
        ),
    ],
)
def test_real_error_messages(reals: str, message: str) -> None:
    text = f'[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\nreals = {reals}\n'
    assert error_of(text) == f"lb.toml: {message}"


def test_ipv6_vip_with_ipv4_real_is_rejected() -> None:
    text = (
        VIP
        + """
        [[vips]]
        address = "2001:db8:100::100"
        port = 80
        proto = "tcp"
        reals = [{ address = "203.0.113.18" }]
        """
    )
    assert error_of(text) == (
        "lb.toml: vips[1].reals[0]: an IPv6 VIP cannot be encapsulated to IPv4 real 203.0.113.18; "
        "use an IPv6 real"
    )


def test_duplicate_vips_are_rejected() -> None:
    text = VIP + '\n[[vips]]\naddress = "198.51.100.101"\nport = 80\nproto = "tcp"\n' + VIP
    assert error_of(text) == (
        "lb.toml: vips[2]: VIP 198.51.100.100:80/tcp is already defined as vips[0]; "
        "merge the two or change address, port or proto"
    )


def test_same_address_and_port_with_other_proto_or_wildcard_is_allowed() -> None:
    udp = VIP.replace('"tcp"', '"udp"')
    wildcard = VIP.replace("port = 80", "port = 0")
    assert len(parse(VIP + udp + wildcard).vips) == 3


def test_duplicate_ipv6_vips_are_found_in_any_spelling() -> None:
    a = '[[vips]]\naddress = "2001:db8:100::100"\nport = 80\nproto = "tcp"\n'
    b = '[[vips]]\naddress = "2001:DB8:100:0::100"\nport = 80\nproto = "tcp"\n'
    assert error_of(a + b).startswith(
        "lb.toml: vips[1]: VIP [2001:db8:100::100]:80/tcp is already defined as vips[0]"
    )


def test_max_vips_must_hold_the_vips() -> None:
    text = "[datapath]\nmax_vips = 1\n" + VIP + VIP.replace("port = 80", "port = 443")
    assert error_of(text) == "lb.toml: datapath.max_vips must be at least the number of VIPs (2) but got 1"


def test_max_reals_must_hold_the_distinct_reals_and_id_0() -> None:
    text = "[datapath]\nmax_reals = 2\n" + VIP.replace(
        '[{ address = "203.0.113.18" }]', '[{ address = "203.0.113.18" }, { address = "203.0.113.34" }]'
    )
    assert error_of(text) == (
        "lb.toml: datapath.max_reals must be at least 3 "
        "(the 2 distinct real addresses, plus id 0 = no real) but got 2"
    )


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ("port = 0", "vips[0].healthcheck.port must be 1..65535 but got 0"),
        ('type = "icmp"', 'vips[0].healthcheck.type must be "tcp" | "http" | "udp" but got "icmp"'),
        ('via = "gre"', 'vips[0].healthcheck.via must be "direct" | "tunnel" but got "gre"'),
        ('path = "/health"', 'vips[0].healthcheck.path applies only to type = "http"'),
        (
            'type = "http"\npath = "health"',
            'vips[0].healthcheck.path must be an HTTP path starting with "/", without spaces or control '
            'characters but got "health"',
        ),
        (
            'type = "http"\npath = "/a\\u007f"',
            'vips[0].healthcheck.path must be an HTTP path starting with "/", without spaces or control '
            'characters but got "/a\\u007f"',
        ),
        ("interval_s = 0", "vips[0].healthcheck.interval_s must be a number of seconds 0.01..3600 but got 0"),
        (
            'interval_s = "1s"',
            'vips[0].healthcheck.interval_s must be a number of seconds 0.01..3600 but got "1s"',
        ),
        (
            "interval_s = nan",
            "vips[0].healthcheck.interval_s must be a number of seconds 0.01..3600 but got nan",
        ),
        (
            "interval_s = 1\ntimeout_s = 2",
            "vips[0].healthcheck.timeout_s must be at most interval_s (1.0) but got 2.0",
        ),
        ("rise = 0", "vips[0].healthcheck.rise must be 1..1000 but got 0"),
        ("fall = 1001", "vips[0].healthcheck.fall must be 1..1000 but got 1001"),
        (
            "retries = 3",
            "vips[0].healthcheck.retries is not a known key; "
            "known keys here: fall, interval_s, path, port, rise, timeout_s, type, via",
        ),
    ],
)
def test_healthcheck_error_messages(check: str, message: str) -> None:
    assert error_of(VIP + "[vips.healthcheck]\n" + check + "\n") == f"lb.toml: {message}"


def test_wildcard_vip_healthcheck_needs_a_port() -> None:
    text = VIP.replace("port = 80", "port = 0") + '[vips.healthcheck]\ntype = "tcp"\n'
    assert (
        error_of(text)
        == "lb.toml: vips[0].healthcheck.port is required when the VIP's port is 0 (every port)"
    )
    ok = parse(VIP.replace("port = 80", "port = 0") + "[vips.healthcheck]\nport = 8080\n")
    assert ok.vips[0].healthcheck is not None and ok.vips[0].healthcheck.port == 8080


def test_invalid_toml_names_the_file_and_position() -> None:
    message = error_of("[datapath\nmtu = 1")
    assert message.startswith("lb.toml: not valid TOML: ")
    assert "line 1" in message


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert str(info.value) == f"{path}: cannot read the file: No such file or directory; check the path"


def test_non_utf8_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "lb.toml"
    path.write_bytes(b'[metrics]\nlisten = "\xff"\n')
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert str(info.value) == f"{path}: not UTF-8 text (invalid start byte); save it as UTF-8"


def test_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "lb.toml"
    path.write_text(VIP)
    assert config.load(str(path)).vips[0].port == 80


def test_config_objects_are_frozen() -> None:
    c = config.load(EXAMPLE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.vips[0].port = 81  # type: ignore[misc]


# ---------------------------------------------------------------------------------- round trip

_printable = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
_addresses4 = st.builds(lambda n: ipaddress.IPv4Address(0xCB007100 + n), st.integers(1, 254))
_addresses6 = st.builds(lambda n: ipaddress.IPv6Address(0x20010DB8 << 96 | n), st.integers(1, 2**64))


@st.composite
def _vip(draw: st.DrawFn, index: int) -> Vip:
    v6 = draw(st.booleans())
    address = (
        ipaddress.ip_address(f"2001:db8:100::{index + 1:x}")
        if v6
        else ipaddress.IPv4Address(0xC6336400 + index)
    )
    real_addrs = draw(
        st.lists(_addresses6 if v6 else st.one_of(_addresses4, _addresses6), max_size=6, unique=True)
    )
    port = draw(st.integers(0, 65535))
    check = None
    if draw(st.booleans()):
        kind = draw(st.sampled_from(config.CHECK_TYPES))
        interval = draw(st.floats(0.01, 3600, allow_nan=False))
        check = HealthCheck(
            port=draw(st.integers(1, 65535)),
            type=kind,
            path="/" + draw(st.text(_printable, max_size=20)) if kind == "http" else "/",
            interval_s=interval,
            timeout_s=draw(st.floats(0.001, min(interval, 3600), allow_nan=False)),
            rise=draw(st.integers(1, 1000)),
            fall=draw(st.integers(1, 1000)),
            via=draw(st.sampled_from(config.CHECK_VIAS)),
        )
    hash_name = draw(st.sampled_from(config.HASHES))
    return Vip(
        address=address,
        port=port,
        proto=draw(st.sampled_from(config.PROTOS)),
        encap=draw(st.sampled_from(config.ENCAPS)),
        hash=hash_name,
        katran_ring=draw(st.sampled_from(config.KATRAN_RINGS)) if hash_name.startswith("katran") else "v1",
        lru=draw(st.booleans()),
        outer_src=draw(st.sampled_from(config.OUTER_SRCS)),
        gue_csum=draw(st.sampled_from(config.GUE_CSUMS)),
        reals=tuple(Real(a, draw(st.integers(0, 65535))) for a in real_addrs),
        healthcheck=check,
    )


@st.composite
def _config(draw: st.DrawFn) -> Config:
    n = draw(st.integers(0, 4))
    return Config(
        datapath=DatapathConfig(
            interfaces=tuple(
                draw(
                    st.lists(
                        st.from_regex(r"[a-z][a-z0-9-]{0,14}", fullmatch=True),
                        min_size=1,
                        max_size=3,
                        unique=True,
                    )
                )
            ),
            mode=draw(st.sampled_from(config.MODES)),
            mtu=draw(st.integers(68, 9216)),
            max_vips=draw(st.integers(4, 1000)),
            ring_size=draw(st.sampled_from([13, 1009, 65537])),
            frags=draw(st.booleans()),
            udp_timeout_s=draw(st.integers(1, 86400)),
            katran_max_vips=draw(st.integers(1, 2**32 - 1)),
        ),
        encap=EncapConfig(
            nexthop_mac=draw(st.from_regex(r"[0-9a-f][02468ace](:[0-9a-f]{2}){5}", fullmatch=True)),
            gue_port=draw(st.integers(1, 65535)),
            src4=ipaddress.IPv4Network(f"198.51.100.128/{draw(st.integers(25, 32))}"),
            src6=ipaddress.IPv6Network(f"2001:db8:1b:80::/{draw(st.integers(64, 128))}"),
        ),
        vips=tuple(draw(_vip(i)) for i in range(n)),
        metrics=MetricsConfig(draw(st.sampled_from(["127.0.0.1:9100", "[::1]:9100", "0.0.0.0:1"]))),
    )


@settings(max_examples=150, deadline=None)
@given(c=_config())
def test_dump_then_load_is_identity(c: Config) -> None:
    text = config.dump(c)
    assert config.loads(text) == c
    assert config.dump(config.loads(text)) == text


def test_dump_escapes_strings() -> None:
    c = parse(VIP + '[vips.healthcheck]\ntype = "http"\npath = "/a\\"b\\\\c/é"\n')
    assert c.vips[0].healthcheck is not None and c.vips[0].healthcheck.path == '/a"b\\c/é'
    assert config.loads(config.dump(c)) == c
    odd = Config(datapath=DatapathConfig(interfaces=("a\x7fb", "é\\x")))
    assert config.loads(config.dump(odd)) == odd


def test_edited_config_round_trips() -> None:
    """What `lbctl vip add` does: replace a frozen config, dump it, load it back."""
    c = config.load(EXAMPLE)
    vip = dataclasses.replace(
        c.vips[0], port=443, reals=(*c.vips[0].reals, Real(ipaddress.ip_address("203.0.113.66"), 0))
    )
    edited = dataclasses.replace(c, vips=(*c.vips, vip))
    assert config.loads(config.dump(edited)) == edited


def test_nexthop_auto_and_its_address() -> None:
    c = parse('[encap]\nnexthop = "2001:db8:1b::1"\n')
    assert (c.encap.nexthop_mac, c.encap.nexthop) == ("auto", ipaddress.IPv6Address("2001:db8:1b::1"))
    assert config.loads(config.dump(c)) == c and 'nexthop = "2001:db8:1b::1"' in config.dump(c)
    assert "nexthop =" not in config.dump(parse(""))  # unset: not written
    assert error_of('[encap]\nnexthop_mac = "02:00:00:00:00:01"\nnexthop = "192.0.2.1"\n') == \
        'lb.toml: encap.nexthop applies only to nexthop_mac = "auto" (it names the address whose MAC is ' \
        "looked up); remove one of the two"
    assert error_of('[encap]\nnexthop = "router"\n').startswith("lb.toml: encap.nexthop must be an IPv4 or IPv6")
