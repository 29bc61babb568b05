"""The LB node's health hook decides what to announce: loaded, attached, and a live real per VIP address."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from balancer import config as cfg
from balancer import controller
from lab.frr import Health

INSTANCE = "hl-lb1"
VIP4, VIP6 = "198.51.100.100", "2001:db8:100::100"


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """lbctl's state and pin roots moved under tmp_path (no balancer is loaded)."""
    monkeypatch.setattr(controller, "STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setattr(controller, "PIN_ROOT", str(tmp_path / "pins"))
    return tmp_path


def instance_state(roots: Path, down: dict[str, list[str]], attached: bool = True) -> None:
    """Write what `lbctl load` leaves: the state file with the applied config, and the link pin."""
    reals4 = (cfg.Real(address=ipaddress.ip_address("203.0.113.18")),
              cfg.Real(address=ipaddress.ip_address("203.0.113.34")))  # fmt: skip
    reals6 = (cfg.Real(address=ipaddress.ip_address("2001:db8:e1::2")),)
    conf = cfg.Config(vips=(
        cfg.Vip(address=ipaddress.ip_address(VIP4), port=80, proto="tcp", reals=reals4),
        cfg.Vip(address=ipaddress.ip_address(VIP6), port=80, proto="tcp", reals=reals6),
    ))  # fmt: skip
    state = controller.State(instance=INSTANCE, object="balancer.o", interfaces={"lb1-rt": "native"},
                             config=cfg.dump(conf), down=down)  # fmt: skip
    path = controller.Instance.state_path(INSTANCE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(state.to_json())
    pin = Path(controller.Instance.pin_dir(INSTANCE)) / "link_lb1-rt"
    pin.parent.mkdir(parents=True, exist_ok=True)
    if attached:
        pin.touch()
    elif pin.exists():
        pin.unlink()


def vip_name(address: str) -> str:
    raw = json.loads(controller.Instance.state_path(INSTANCE).read_text())
    conf = cfg.loads(raw["config"])
    return next(v.name for v in conf.vips if str(v.address) == address)


def test_nothing_is_healthy_without_a_loaded_instance(roots: Path) -> None:
    assert Health(INSTANCE, "lb1-rt", [VIP4, VIP6]).healthy_vips() == set()


def test_a_loaded_attached_instance_serves_every_vip_with_a_live_real(roots: Path) -> None:
    instance_state(roots, down={})
    health = Health(INSTANCE, "lb1-rt", [VIP4, VIP6])
    assert health.healthy_vips() == {VIP4, VIP6}
    assert Health(INSTANCE, "lb1-rt", [VIP4]).healthy_vips() == {VIP4}  # only the lab's VIPs
    assert Health(INSTANCE, "other-if", [VIP4, VIP6]).healthy_vips() == set()  # attached elsewhere


def test_a_vip_whose_reals_are_all_down_is_withdrawn_and_comes_back(roots: Path) -> None:
    instance_state(roots, down={})
    health = Health(INSTANCE, "lb1-rt", [VIP4, VIP6])
    assert health.healthy_vips() == {VIP4, VIP6}
    instance_state(roots, down={vip_name(VIP4): ["203.0.113.18"]})
    assert health.healthy_vips() == {VIP4, VIP6}  # VIP4 still has one live real
    instance_state(roots, down={vip_name(VIP6): ["2001:db8:e1::2"], vip_name(VIP4): ["203.0.113.18"]})
    assert health.healthy_vips() == {VIP4}
    instance_state(roots, down={vip_name(VIP4): ["203.0.113.18", "203.0.113.34"]})
    assert health.healthy_vips() == {VIP6}
    instance_state(roots, down={})
    assert health.healthy_vips() == {VIP4, VIP6}


def test_detached_or_unloaded_is_unhealthy(roots: Path) -> None:
    instance_state(roots, down={})
    health = Health(INSTANCE, "lb1-rt", [VIP4, VIP6])
    assert health.healthy_vips() == {VIP4, VIP6}
    instance_state(roots, down={}, attached=False)
    assert health.healthy_vips() == set()
    instance_state(roots, down={})
    controller.Instance.state_path(INSTANCE).unlink()
    assert health.healthy_vips() == set()
