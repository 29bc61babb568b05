"""test_routes.py: server ids, pinned prefixes, prefix VIPs, decap addresses and UDP migration, from config to maps.

The config keys are validated like every other key (one line naming file, key, value, expectation);
an apply makes the five maps exactly what the config and the health checks say, and a second apply
writes nothing; a real that health checks take down keeps its server id, loses its pins for that
VIP, and is listed down for UDP flow migration.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from balancer import config as cfg
from balancer import controller, routes
from balancer.controller import Instance
from balancer.errors import ConfigError
from lab.harness import unique_name

REPO = Path(__file__).resolve().parents[2]
OBJ = str(REPO / "build" / "bpf" / "balancer.o")

BASE = """
[datapath]
ring_size = 251
max_vips = 8
max_reals = 16
lru_size = 256

[[vips]]
address = "198.51.100.100"
port = 443
proto = "udp"
server_id_from = "quic"
udp_flow_migration = true
src_routes = [{ prefix = "192.0.2.0/24", real = "203.0.113.50" }]
reals = [
  { address = "203.0.113.18", server_id = 1024 },
  { address = "203.0.113.34", server_id = 197634 },
  { address = "203.0.113.50" },
]

[[vips]]
address = "198.51.100.128/25"
port = 80
proto = "tcp"
server_id_from = "tcp-option"
reals = [{ address = "203.0.113.18", server_id = 1024 }, { address = "203.0.113.34" }]

[[decap]]
address = "198.51.100.7"
action = "balance"
"""


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        cfg.loads(text, "lb.toml")
    return str(err.value)


@pytest.mark.parametrize(("change", "message"), [
    (('proto = "udp"\nserver_id_from = "quic"', 'proto = "tcp"\nserver_id_from = "quic"'),
     'lb.toml: vips[0].server_id_from = "quic" needs proto = "udp" (the VIP is tcp)'),
    (("server_id = 197634", "server_id = 1024"),
     "lb.toml: vips[0].reals[1].server_id: server id 1024 names real 203.0.113.18 at "
     "vips[0].reals[0].server_id; give each real its own"),
    (('{ address = "203.0.113.18", server_id = 1024 }, { address = "203.0.113.34" }',
      '{ address = "203.0.113.18", server_id = 7 }'),
     "lb.toml: vips[1].reals[0].server_id: real 203.0.113.18 has server id 1024 at vips[0].reals[0].server_id; "
     "one real has one server id"),
    (("server_id = 197634", "server_id = 0"),
     "lb.toml: vips[0].reals[1].server_id must be 1..4294967295 (0 is no id) but got 0"),
    (('prefix = "192.0.2.0/24"', 'prefix = "2001:db8:c::/48"'),
     'lb.toml: vips[0].src_routes[0].prefix must be an IPv4 prefix such as "192.0.2.0/24" without host bits '
     '(the VIP\'s family) but got "2001:db8:c::/48"'),
    (('address = "198.51.100.128/25"', 'address = "198.51.100.129/25"'),
     'lb.toml: vips[1].address must be an IPv4 or IPv6 address, or a prefix such as "10.200.0.0/24" without '
     'host bits but got "198.51.100.129/25"'),
    (('action = "balance"', 'action = "forward"'),
     'lb.toml: decap[0].action must be "balance" | "local" | "egress" but got "forward"'),
])
def test_routing_keys_are_validated(change: tuple[str, str], message: str) -> None:
    assert error_of(BASE.replace(*change)) == message


def test_udp_flow_migration_is_refused_for_tcp() -> None:
    text = BASE.replace('server_id_from = "tcp-option"', 'server_id_from = "tcp-option"\nudp_flow_migration = true')
    assert error_of(text) == ("lb.toml: vips[1].udp_flow_migration applies only to proto = \"udp\": TCP sessions "
                              "stay with their real")


def test_dump_reads_back_equal() -> None:
    c = cfg.loads(BASE, "lb.toml")
    assert cfg.loads(cfg.dump(c), "dump") == c
    assert c.vips[1].name == "198.51.100.128/25:80/tcp" and c.decap[0].action == "balance"


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Instance]:
    """Name: instance. Scope: function. Depends: built balancer object, bpffs.

    A balancer instance loaded (not attached) under a unique pin directory, unloaded afterwards:
        instance.apply(cfg.loads(BASE))
    """
    name = unique_name("rt", 4)
    monkeypatch.setattr(controller, "PIN_ROOT", "/sys/fs/bpf/lbctl-test")
    monkeypatch.setattr(controller, "STATE_ROOT", str(tmp_path / "state"))
    inst = Instance.load(name, [], config=cfg.loads(BASE, "lb.toml"), obj=OBJ)
    try:
        yield inst
    finally:
        inst.unload()


def _entries(inst: Instance) -> dict[str, set[bytes]]:
    return {m: set(inst.dp.maps[m].keys()) for m in ("lb_server_ids", "lb_src_routes", "lb_vip_cidrs",
                                                     "lb_decaps", "lb_down_reals")}


def test_apply_writes_the_routing_maps_and_then_nothing(instance: Instance) -> None:
    ids = instance.state.real_ids
    nums = instance.state.vip_nums
    got = _entries(instance)
    assert got["lb_server_ids"] == {routes.server_id(1024, 0).key, routes.server_id(197634, 0).key}
    assert instance.dp.maps["lb_server_ids"].lookup(routes.server_id(1024, 0).key) == \
        routes.u32(ids["203.0.113.18"])
    assert got["lb_src_routes"] == {routes.src_route(nums["198.51.100.100:443/udp"], "192.0.2.0/24", 0).key}
    assert got["lb_vip_cidrs"] == {routes.vip_cidr("198.51.100.128/25", 80, "tcp", vip_num=0).key,
                                   routes.vip_cidr("198.51.100.128/25", 0, 0, vip_num=0).key}
    assert got["lb_decaps"] == {routes.decap("198.51.100.7", routes.DecapAction.BALANCE).key}
    assert got["lb_down_reals"] == set()
    settings = instance.dp.settings()
    assert (settings.cidr_vips, settings.decaps) == (2, 1)
    again = instance.apply(instance.config)
    assert again.writes == 0 and again.routes == 0


def test_a_real_down_keeps_its_server_id_loses_its_pins_and_migrates(instance: Instance) -> None:
    vip = "198.51.100.100:443/udp"
    c = instance.config
    before = _entries(instance)
    report = instance.apply(c, down={vip: ["203.0.113.18", "203.0.113.50"]})
    got = _entries(instance)
    assert got["lb_server_ids"] == before["lb_server_ids"], "a drained real keeps its server id"
    assert got["lb_src_routes"] == set(), "the pinned real is down: new flows from the prefix hash"
    ids, num = instance.state.real_ids, instance.state.vip_nums[vip]
    assert got["lb_down_reals"] == {routes.down_real(num, ids["203.0.113.18"]).key,
                                    routes.down_real(num, ids["203.0.113.50"]).key}
    assert report.routes == 3
    restored = instance.apply(c, down={})
    assert restored.routes == 3 and _entries(instance) == before


def test_a_real_removed_takes_its_server_id_and_a_prefix_vip_its_entries(instance: Instance) -> None:
    c = instance.config
    vips = (c.vips[0].__class__(**{**c.vips[0].__dict__, "reals": c.vips[0].reals[1:]}),)
    instance.apply(cfg.loads(cfg.dump(cfg.Config(datapath=c.datapath, vips=vips)), "edit"))
    got = _entries(instance)
    assert got["lb_server_ids"] == {routes.server_id(197634, 0).key}
    assert got["lb_vip_cidrs"] == set() and got["lb_decaps"] == set()
    assert (instance.dp.settings().cidr_vips, instance.dp.settings().decaps) == (0, 0)
