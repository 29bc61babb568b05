"""Apply with Katran-compatible VIPs: Katran's ring and flags are written, and changing the ring's kind rewrites it."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from balancer import _abi, controller, katran_hash, maglev
from balancer import config as cfg
from balancer.controller import Instance
from balancer.datapath import vip_key
from balancer.errors import LbError
from lab.harness import unique_name

REPO = Path(__file__).resolve().parents[2]
OBJ = str(REPO / "build" / "bpf" / "balancer.o")
RING = 251
REALS = (("203.0.113.18", 1), ("203.0.113.34", 10), ("203.0.113.50", 3))


def _config(hash_name: str = "katran", ring: str = "v1", max_vips: int = 512) -> cfg.Config:
    vip = cfg.Vip(address=ipaddress.ip_address("198.51.100.100"), port=80, proto="tcp", hash=hash_name,  # type: ignore[arg-type]
                  katran_ring=ring,  # type: ignore[arg-type]
                  reals=tuple(cfg.Real(ipaddress.ip_address(a), w) for a, w in REALS))
    return cfg.Config(datapath=cfg.DatapathConfig(ring_size=RING, max_vips=4, max_reals=8, lru_size=64,
                                                  katran_max_vips=max_vips),
                      encap=cfg.EncapConfig(nexthop_mac="02:00:00:00:00:01"), vips=(vip,))


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Instance]:
    """Name: instance. Scope: function. Depends: built balancer object, bpffs.

    A balancer instance (loaded, not attached) with one VIP in Katran's default hash and V1 ring::

        def test_x(instance):
            instance.apply(_config(ring="v2"))
    """
    name = unique_name("tk", 4)
    monkeypatch.setattr(controller, "PIN_ROOT", "/sys/fs/bpf/lbctl-test")
    monkeypatch.setattr(controller, "STATE_ROOT", str(tmp_path / "state"))
    inst = Instance.load(name, [], config=_config(), obj=OBJ)
    try:
        yield inst
    finally:
        inst.unload()


def _katran_ring(inst: Instance, kind: katran_hash.RingKind) -> maglev.Ring:
    return katran_hash.build_ring([maglev.Backend(inst.state.real_ids[a], a, w) for a, w in REALS], RING, kind)


def _flags(inst: Instance) -> int:
    raw = inst.dp.maps["lb_vips"].lookup(vip_key("198.51.100.100", 80, "tcp"))
    assert raw is not None
    return int(_abi.VipMeta.from_buffer_copy(raw).flags)


def test_a_katran_vip_gets_katrans_ring_and_flag(instance: Instance) -> None:
    assert np.array_equal(instance.dp.ring_array(0), _katran_ring(instance, "v1"))
    assert _flags(instance) & _abi.VipFlag.HASH_KATRAN
    assert instance.status()["vips"][0]["ring"] == "katran-v1"
    assert instance.apply(_config()).writes == 0, "a second apply writes nothing"


def test_changing_the_ring_kind_rewrites_the_ring(instance: Instance) -> None:
    report = instance.apply(_config(ring="v2"))
    assert report.ring_slots > 0 and np.array_equal(instance.dp.ring_array(0), _katran_ring(instance, "v2"))
    instance.apply(_config(hash_name="5tuple"))
    l4lab = maglev.build_ring({instance.state.real_ids[a]: (a, w) for a, w in REALS}, RING)
    assert np.array_equal(instance.dp.ring_array(0), l4lab) and not _flags(instance) & _abi.VipFlag.HASH_KATRAN
    assert instance.status()["vips"][0]["ring"] == "l4lab"
    instance.apply(_config(hash_name="katran-no-sport"))
    assert np.array_equal(instance.dp.ring_array(0), _katran_ring(instance, "v1"))
    assert _flags(instance) & _abi.VipFlag.HASH_NO_SPORT


def test_a_drained_real_leaves_katrans_ring_as_katran_leaves_it(instance: Instance) -> None:
    instance.apply(_config(), down={"198.51.100.100:80/tcp": ["203.0.113.34"]})
    live = [maglev.Backend(instance.state.real_ids[a], a, w) for a, w in REALS if a != "203.0.113.34"]
    assert np.array_equal(instance.dp.ring_array(0), katran_hash.build_ring(live, RING, "v1"))


def test_katran_max_vips_is_a_load_time_setting(instance: Instance) -> None:
    with pytest.raises(LbError, match="cannot change katran_max_vips from 512 to 64 while loaded"):
        instance.apply(_config(max_vips=64))
    assert instance.config == _config()
