"""iperf3 through the VIP: a bulk TCP stream per encap, answered by one real directly (figures printed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from balancer import config as cfg
from balancer.encaps import IP4_GUE1, IP4_IPIP, IP6_IP6IP6
from lab.harness import Lab, LabBalancer, poll
from lab.lbconf import real_addresses
from lab.nsexec import nsenter_argv

pytestmark = [pytest.mark.topology("default"),
              pytest.mark.skipif(shutil.which("iperf3") is None,
                                 reason="iperf3 is missing: run bash scripts/setup.sh --extra tools")]
PORT = 5201


@pytest.mark.parametrize("encap", [IP4_IPIP, IP4_GUE1, IP6_IP6IP6])
def test_iperf3_through_the_vip(lab: Lab, balancer: LabBalancer) -> None:
    conf = balancer.config_for()
    first = conf.vips[0]
    balancer.apply(cfg.Config(datapath=conf.datapath, encap=conf.encap, metrics=conf.metrics,
                              vips=(*conf.vips, cfg.Vip(address=first.address, port=PORT, proto="tcp",
                                                        encap=first.encap, outer_src=first.outer_src,
                                                        hash="no-sport", reals=first.reals))))
    # hash = no-sport: iperf3's control and data connections come from one address but two ports,
    # and must reach the same real
    vip = str(first.address)
    servers = {node: subprocess.Popen(nsenter_argv(lab.netns(node), ["iperf3", "-s", "-1", "-B", vip, "-p",
                                                                      str(PORT), "-J"]),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for node in sorted(real_addresses(lab.topology, balancer.family))}
    try:
        for node in servers:  # every server listens before the client connects (polled, bounded)
            poll(15.0, lambda: f":{PORT} " in lab.run(node, ["ss", "-ltnH"], timeout=10).stdout,  # noqa: B023
                 f"iperf3 on {node} listening", interval_s=0.02)
        done = lab.run("client", ["iperf3", "-c", vip, "-p", str(PORT), "-t", "2", "-J"], check=False, timeout=30)
        assert done is not None and done.returncode == 0, done.stdout[-1500:] if done else "no run"
        result = json.loads(done.stdout)
        assert "error" not in result, result["error"]
        gbps = result["end"]["sum_received"]["bits_per_second"] / 1e9
        retrans = result["end"]["sum_sent"].get("retransmits", 0)
        served = [n for n, p in servers.items() if p.poll() is not None or _wait(p)]
    finally:
        for p in servers.values():
            if p.poll() is None:
                p.kill()
            p.wait()
    assert gbps > 0 and len(served) == 1, f"served by {served}"
    sys.stdout.write(f"\n{balancer.encap_id}: iperf3 {gbps:.2f} Gbit/s through the VIP, {retrans} retransmits, "
                     f"served by {served[0]}\n")


def _wait(p: subprocess.Popen[str]) -> bool:
    """Whether a one-shot iperf3 server finished (it ends right after its one test)."""
    try:
        p.wait(timeout=3)
    except subprocess.TimeoutExpired:
        return False
    return True
