"""Multi-LB consistency, l4lab's white-box form: two LB nodes build the same ring, read back slot by slot.

Topology multi-lb: lb1 is given the reals in one order and lb2 in the reverse order: the rings
read back from both datapaths must be identical, slot by slot, as addresses. The black-box form,
for every DUT (each LB sends 4,096 flows to the same reals; a flow ECMP moves to the other LB keeps
its real and its connection), is test_dut_multilb.py.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from balancer import config as cfg
from balancer.controller import Instance
from balancer.encaps import IP4_IPIP
from lab.dut import Capability
from lab.frr import FRR_BIN
from lab.harness import Lab, LabBalancer, poll
from lab.lbconf import lb_link
from lab.nsexec import entered

pytestmark = [pytest.mark.topology("multi-lb"), pytest.mark.needs(Capability.MULTI_LB),
              pytest.mark.skipif(not (Path(FRR_BIN) / "bgpd").exists() or shutil.which("vtysh") is None,
                                 reason="FRR is missing: run bash scripts/setup.sh --extra frr")]
ECHO_PORT = 7011
LBS = ("lb1", "lb2")


@pytest.fixture(scope="module")
def lbs(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LabBalancer]]:
    """Name: lbs. Scope: module. Depends: lab (multi-lb).

    lbctl loaded on lb1 (reals in address order) and lb2 (reversed), IPv4 VIPs in IPIP::

        def test_x(lbs):
            lbs["lb2"].stats()
    """
    tmp = tmp_path_factory.mktemp("lbs")
    out: dict[str, LabBalancer] = {}
    try:
        for node in LBS:
            b = LabBalancer(lab, node, IP4_IPIP, tmp / f"{node}.toml")
            conf = b.config_for()
            http = conf.vips[0]  # the echo service's port is a VIP too, with the same reals
            conf = cfg.Config(datapath=conf.datapath, encap=conf.encap, metrics=conf.metrics,
                              vips=(*conf.vips, cfg.Vip(address=http.address, port=ECHO_PORT, proto="tcp",
                                                        encap=http.encap, outer_src=http.outer_src,
                                                        reals=http.reals)))
            if node == "lb2":
                conf = cfg.Config(datapath=conf.datapath, encap=conf.encap, metrics=conf.metrics,
                                  vips=tuple(_reversed_reals(v) for v in conf.vips))
            b.config_path.write_text(cfg.dump(conf))
            b.lbctl("load", "--interface", lb_link(lab.topology, node)[0], "--mode", "native",
                    "--config", str(b.config_path))
            out[node] = b
        _wait_paths(lab, _vip(lab), {"rt-lb1", "rt-lb2"})
        yield out
    finally:
        for b in out.values():
            b.lbctl("unload", check=False)


def _reversed_reals(vip: cfg.Vip) -> cfg.Vip:
    return cfg.Vip(address=vip.address, port=vip.port, proto=vip.proto, encap=vip.encap, hash=vip.hash,
                   lru=vip.lru, outer_src=vip.outer_src, reals=tuple(reversed(vip.reals)),
                   healthcheck=vip.healthcheck)


def _vip(lab: Lab) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == 4)


def _router_paths(lab: Lab, vip: str) -> set[str]:
    from pyroute2 import IPRoute

    with entered(lab.netns("router")):
        ipr = IPRoute()
    with ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        out: set[str] = set()
        for route in ipr.get_routes(family=socket.AF_INET):
            if route.get_attr("RTA_DST") != vip or route["dst_len"] != 32:
                continue
            hops = route.get_attr("RTA_MULTIPATH")
            if hops:
                out |= {names.get(h["oif"], str(h["oif"])) for h in hops}
            elif route.get_attr("RTA_OIF"):
                out.add(names.get(route.get_attr("RTA_OIF"), "?"))
        return out


def _wait_paths(lab: Lab, vip: str, want: set[str], timeout: float = 15.0) -> float:
    """Poll the router until its route to vip leaves by exactly want; when (monotonic) it did."""
    poll(timeout, lambda: _router_paths(lab, vip), f"the router's route to {vip} leaving by {sorted(want)}",
         until=lambda got: got == want, interval_s=0.005)
    return time.monotonic()


def _ring_addresses(instance: str, vip_name: str) -> list[str]:
    inst = Instance.open(instance)
    try:
        by_id = {rid: addr for addr, rid in inst.state.real_ids.items()}
        by_id[0] = "-"
        return [by_id[i] for i in inst.dp.ring(inst.state.vip_nums[vip_name])]
    finally:
        inst.close()


@pytest.mark.needs(Capability.RING_READBACK)
def test_reals_in_another_order_build_the_same_ring(lab: Lab, lbs: dict[str, LabBalancer]) -> None:
    configs = {node: cfg.load(b.config_path) for node, b in lbs.items()}
    names = [v.name for v in configs["lb1"].vips]
    assert [str(r.address) for r in configs["lb1"].vips[0].reals] == \
        list(reversed([str(r.address) for r in configs["lb2"].vips[0].reals])), "the orders must differ"
    for name in names:
        one, two = (_ring_addresses(lbs[n].instance, name) for n in LBS)
        assert len(one) == 65537 and "-" not in one
        differ = sum(a != b for a, b in zip(one, two, strict=True))
        assert differ == 0, f"{name}: {differ} of {len(one)} slots differ between lb1 and lb2"
