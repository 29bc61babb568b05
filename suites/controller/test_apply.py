"""Apply and reconcile against a loaded datapath: maps read back, idempotence, diffs, transactions."""

from __future__ import annotations

import ctypes
import dataclasses
import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from balancer import _abi, controller, maglev
from balancer import config as cfg
from balancer.controller import Instance
from balancer.datapath import Datapath
from balancer.errors import DatapathError, LbError
from balancer.libbpf import Map
from balancer.maplayout import SESSION_SETS, addr_words, session_key, vip_index_from, vip_key, vip_slot
from lab.harness import unique_name
from suites.sess4 import write_way

REPO = Path(__file__).resolve().parents[2]
OBJ = str(REPO / "build" / "bpf" / "balancer.o")
RING = 251  # a small prime ring keeps full read-backs fast


def _config(reals: list[tuple[str, int]], *, vip2: bool = True) -> cfg.Config:
    vips = [
        cfg.Vip(
            address=ipaddress.ip_address("198.51.100.100"),
            port=80,
            proto="tcp",
            reals=tuple(cfg.Real(ipaddress.ip_address(a), w) for a, w in reals),
        )
    ]
    if vip2:
        vips.append(
            cfg.Vip(
                address=ipaddress.ip_address("198.51.100.100"),
                port=9000,
                proto="udp",
                encap="gue1",
                outer_src="fixed",
                reals=tuple(cfg.Real(ipaddress.ip_address(a), 1) for a, _ in reals[:2]),
            )
        )
    return cfg.Config(
        datapath=cfg.DatapathConfig(
            ring_size=RING, max_vips=8, max_reals=16, lru_size=256, fallback_size=256
        ),
        encap=cfg.EncapConfig(nexthop_mac="02:00:00:00:00:01"),
        vips=tuple(vips),
    )


REALS = [("203.0.113.18", 1), ("203.0.113.34", 1), ("203.0.113.50", 2)]


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Instance]:
    """Name: instance. Scope: function. Depends: built balancer object, bpffs.

    A balancer instance loaded (not attached) under a unique pin directory, unloaded afterwards::

        def test_x(instance):
            instance.apply(config)
            assert instance.dp.vips()
    """
    name = unique_name("t", 4)
    monkeypatch.setattr(controller, "PIN_ROOT", "/sys/fs/bpf/lbctl-test")
    monkeypatch.setattr(controller, "STATE_ROOT", str(tmp_path / "state"))
    inst = Instance.load(name, [], config=_config(REALS), obj=OBJ)
    try:
        yield inst
    finally:
        inst.unload()
        assert not Path(Instance.pin_dir(name)).exists()


def _dump(m: Map) -> dict[bytes, bytes]:
    return dict(m.items())


def _snapshot(inst: Instance) -> dict[str, object]:
    return {
        "vips": _dump(inst.dp.maps["lb_vips"]),
        "vip index": inst.dp.vip_index().tobytes(),
        "reals": _dump(inst.dp.maps["lb_reals"]),
        "settings": inst.dp.maps["lb_settings"].lookup(b"\0" * 4),
        "rings": [inst.dp.ring(n) for n in range(3)],
    }


def test_apply_writes_what_the_config_says(instance: Instance) -> None:
    st = instance.state
    vips = instance.dp.vips()
    assert set(vips) == {("198.51.100.100", 80, 6), ("198.51.100.100", 9000, 17), ("198.51.100.100", 0, 0)}
    assert vips[("198.51.100.100", 9000, 17)].encap == _abi.Encap.GUE1
    assert vips[("198.51.100.100", 80, 6)].flags & _abi.VipFlag.OUTER_SRC_FLOW
    assert not vips[("198.51.100.100", 9000, 17)].flags & _abi.VipFlag.OUTER_SRC_FLOW
    for addr, rid in st.real_ids.items():
        assert instance.dp.real(rid) == (addr, int(_abi.RealFlag.PRESENT))
    num = st.vip_nums["198.51.100.100:80/tcp"]
    want = maglev.build_ring({st.real_ids[a]: (a, w) for a, w in REALS}, RING)
    assert instance.dp.ring(num) == want.tolist()
    counts = maglev.slot_counts(want)
    assert counts[st.real_ids["203.0.113.50"]] in (125, 126)  # weight 2 of 4 owns half the ring
    s = instance.dp.settings()
    assert bytes(s.nexthop_mac) == bytes.fromhex("020000000001") and s.configured == 1
    assert s.mtu == 1500


def test_second_apply_writes_nothing(instance: Instance) -> None:
    before = _snapshot(instance)
    report = instance.apply(_config(REALS))
    assert report.writes == 0
    assert _snapshot(instance) == before


def test_removing_a_real_rewrites_only_its_slots(instance: Instance) -> None:
    st = instance.state
    num = st.vip_nums["198.51.100.100:80/tcp"]
    old = np.array(instance.dp.ring(num))
    gone = st.real_ids["203.0.113.34"]
    report = instance.apply(_config([REALS[0], REALS[2]], vip2=False))
    new = np.array(instance.dp.ring(num))
    changed = np.flatnonzero(old != new)
    owned = np.flatnonzero(old == gone)
    assert gone not in new
    assert set(owned) <= set(changed)
    assert len(changed) - len(owned) <= RING * 0.05  # small ring: a few slots of collateral at most
    assert report.vips_removed == 1 and report.reals_removed == 1
    assert instance.dp.real(gone) is None
    assert ("198.51.100.100", 9000, 17) not in instance.dp.vips()


def test_ids_are_recycled_and_shared_across_vips(instance: Instance) -> None:
    st = instance.state
    first = dict(st.real_ids)
    assert sorted(first.values()) == [1, 2, 3]
    instance.apply(_config([REALS[0], REALS[2]], vip2=False))
    instance.apply(_config([REALS[0], REALS[2], ("203.0.113.66", 1)], vip2=False))
    assert instance.state.real_ids["203.0.113.66"] == first["203.0.113.34"]  # the freed id is reused


def test_replacing_every_vip_keeps_the_new_rings(instance: Instance) -> None:
    """VIPs removed and others added in one apply: the new rings survive the old ones' clearing."""
    v6 = cfg.Vip(address=ipaddress.ip_address("2001:db8:100::100"), port=80, proto="tcp",
                 reals=(cfg.Real(ipaddress.ip_address("2001:db8:e1::2")),
                        cfg.Real(ipaddress.ip_address("2001:db8:e2::2"))))
    instance.apply(dataclasses.replace(_config(REALS), vips=(v6,)))
    num = instance.state.vip_nums[v6.name]
    ids = {instance.state.real_ids[str(r.address)] for r in v6.reals}
    assert set(instance.dp.ring(num)) == ids
    instance.apply(_config(REALS))  # and back: the IPv4 VIPs again, the IPv6 one gone
    for vname, n in instance.state.vip_nums.items():
        assert 0 not in instance.dp.ring(n), vname


def test_weight_zero_drains_a_real(instance: Instance) -> None:
    st = instance.state
    num = st.vip_nums["198.51.100.100:80/tcp"]
    instance.apply(_config([REALS[0], (REALS[1][0], 0), REALS[2]]))
    assert st.real_ids["203.0.113.34"] not in instance.dp.ring(num)
    assert instance.dp.real(st.real_ids["203.0.113.34"]) is not None  # still known: sessions continue


def test_all_reals_down_leaves_an_empty_ring(instance: Instance) -> None:
    num = instance.state.vip_nums["198.51.100.100:80/tcp"]
    instance.apply(_config(REALS), down={"198.51.100.100:80/tcp": [a for a, _ in REALS]})
    assert set(instance.dp.ring(num)) == {0}  # the datapath drops with reason NO_REAL


def test_failed_apply_leaves_every_map_unchanged(instance: Instance, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _snapshot(instance)
    calls = {"n": 0}
    real_write = Datapath.write_ring_slots

    def failing_write(self: Datapath, vip_num: int, slots: Any, ids: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # settings, reals and the first VIP's ring are written by now
            half = len(slots) // 2
            real_write(self, vip_num, slots[:half], ids[:half])  # half written...
            raise DatapathError(f"write the ring of VIP #{vip_num}", 28)  # ...then a failure
        real_write(self, vip_num, slots, ids)

    monkeypatch.setattr(Datapath, "write_ring_slots", failing_write)
    new = _config([REALS[0], ("203.0.113.66", 3), ("203.0.113.82", 1)])
    new = dataclasses.replace(new, encap=dataclasses.replace(new.encap, gue_port=7000))
    with pytest.raises(DatapathError, match="No space left on device"):
        instance.apply(new)
    monkeypatch.setattr(Datapath, "write_ring_slots", real_write)
    assert calls["n"] > 2  # the rollback rewrote both rings' slots through write_ring_slots too
    assert _snapshot(instance) == before
    assert instance.apply(_config(REALS)).writes == 0  # the state file was not advanced either


def test_too_many_vips_is_refused_before_any_write(instance: Instance) -> None:
    before = _snapshot(instance)
    vips = tuple(
        cfg.Vip(
            address=ipaddress.ip_address(f"198.51.100.{10 + i}"),
            port=80,
            proto="tcp",
            reals=(cfg.Real(ipaddress.ip_address("203.0.113.18")),),
        )
        for i in range(9)
    )
    with pytest.raises(LbError, match="raise datapath.max_vips"):
        instance.apply(dataclasses.replace(_config(REALS), vips=vips))
    assert _snapshot(instance) == before


def test_reopened_instance_sees_the_running_state(instance: Instance) -> None:
    again = Instance.open(instance.name)
    try:
        assert again.state.real_ids == instance.state.real_ids
        assert {k: bytes(v) for k, v in again.dp.vips().items()} == {
            k: bytes(v) for k, v in instance.dp.vips().items()
        }
        assert again.apply(_config(REALS)).writes == 0
    finally:
        again.close()


def test_loading_twice_is_refused(instance: Instance) -> None:
    with pytest.raises(DatapathError, match="already loaded"):
        Instance.load(instance.name, [], config=_config(REALS), obj=OBJ)


def test_address_only_entry_follows_the_vips(instance: Instance) -> None:
    key = vip_key("198.51.100.100", 0, 0)
    assert instance.dp.maps["lb_vips"].lookup(key) is not None
    instance.apply(dataclasses.replace(_config(REALS), vips=()))
    assert instance.dp.maps["lb_vips"].lookup(key) is None
    assert instance.dp.vips() == {}


def _session(dst: str, dport: int, proto: int, sport: int, real_id: int) -> tuple[_abi.Flow, _abi.Session]:
    """(flow, session) of a session of 192.0.2.2:sport -> dst:dport."""
    raw, fam = addr_words(dst)
    src, _ = addr_words("192.0.2.2")
    flow = _abi.Flow(src=(ctypes.c_uint32 * 4).from_buffer_copy(src), dst=(ctypes.c_uint32 * 4).from_buffer_copy(raw),
                     sport=socket.htons(sport), dport=socket.htons(dport), proto=proto, family=fam)
    return flow, _abi.Session(real_id=real_id)


def test_removing_a_real_from_one_vip_flushes_only_that_vips_sessions(instance: Instance) -> None:
    """The real still serves the UDP VIP: its TCP sessions go (they fail fast), the UDP ones stay."""
    ids = instance.state.real_ids
    moved, other = ids["203.0.113.34"], ids["203.0.113.18"]
    entries = [_session("198.51.100.100", 80, 6, 40000, moved), _session("198.51.100.100", 80, 6, 40001, other),
               _session("198.51.100.100", 9000, 17, 40002, moved)]
    keys = [session_key(flow) for flow, _ in entries]
    assert {t for t, _ in keys} == {SESSION_SETS}, "IPv4 flows live in the IPv4 table"
    for way, (flow, sess) in zip((3, 2, 1), entries, strict=True):  # one set, filled as the datapath fills it
        write_way(instance.dp, 0, way, flow, sess)
    assert sorted((t, k) for t, k, _, _ in instance.dp.sessions()) == sorted(keys)
    new = _config([REALS[0], REALS[2]])  # .34 leaves the TCP VIP; the UDP VIP keeps REALS[:2]
    new = dataclasses.replace(new, vips=(new.vips[0], _config(REALS).vips[1]))
    report = instance.apply(new)
    assert report.sessions_flushed == 1
    left = {(t, k): bytes(sess) for t, k, _, sess in instance.dp.sessions()}
    assert left == {keys[1]: bytes(entries[1][1]), keys[2]: bytes(entries[2][1])}, "only the TCP session of .34 went"


def test_mapped_ring_is_the_kernel_map(instance: Instance) -> None:
    """Ring writes through the memory mapping are what the kernel's map holds (read by syscall), and
    a ring written by syscall reads back through the mapping; a reopened instance maps the same memory."""
    dp = instance.dp
    m = dp.maps["lb_ring"]
    num = 2
    base = num * dp.ring_size
    written = np.arange(1, dp.ring_size + 1, dtype=np.uint32) * 7
    dp.write_ring(num, written.tolist())
    after = (base - 1).to_bytes(4, "little")
    _keys, values = m.lookup_batch(after, dp.ring_size)
    assert np.array_equal(np.frombuffer(b"".join(values), dtype="<u4"), written), "the mapping and the map disagree"
    back = (written[::-1] + 1).astype("<u4")
    keys = (np.arange(dp.ring_size, dtype=np.int64) + base).astype("<u4").tobytes()
    m.update_batch_raw(keys, back.tobytes())
    assert np.array_equal(dp.ring_array(num), back), "a syscall write is not seen through the mapping"
    again = Instance.open(instance.name)
    try:
        assert np.array_equal(again.dp.ring_array(num), back), "the pinned map maps the same memory"
    finally:
        again.close()


def test_datapath_transaction_undoes_every_write_when_its_block_raises(instance: Instance) -> None:
    before = _snapshot(instance)
    dp = instance.dp
    num = instance.state.vip_nums["198.51.100.100:80/tcp"]
    new_ring = np.full(dp.ring_size, 7, dtype=np.uint32)
    with pytest.raises(RuntimeError, match="the block failed"), dp.transaction() as tx:
        tx.put_settings(nexthop_mac="02:00:00:00:00:99", gue_port=7000)
        tx.put_real(7, "203.0.113.99")
        tx.del_real(1)
        tx.write_ring_slots(num, np.arange(0, dp.ring_size, 2, dtype=np.uint32), new_ring)
        assert tx.put_vip("198.51.100.100", 80, "tcp", vip_num=num, encap=_abi.Encap.GUE0)
        assert not tx.put_vip("198.51.100.100", 80, "tcp", vip_num=num, encap=_abi.Encap.GUE0)  # same value
        tx.put_vip("198.51.100.200", 53, "udp", vip_num=2)
        tx.del_vip("198.51.100.100", 9000, "udp")
        assert tx.ring_slots == (dp.ring_size + 1) // 2
        assert dp.real(7) == ("203.0.113.99", _abi.RealFlag.PRESENT)  # written at once, not at the end
        assert dp.vip_index().tobytes() != before["vip index"]
        raise RuntimeError("the block failed")
    assert _snapshot(instance) == before
    with dp.transaction() as tx:
        tx.put_real(7, "203.0.113.99")
    assert dp.real(7) == ("203.0.113.99", _abi.RealFlag.PRESENT)


def _same_slot(count: int) -> list[str]:
    """IPv4 addresses whose TCP port-80 VIP keys share one lb_vip_index slot."""
    by_slot: dict[int, list[str]] = {}
    for n in range(1, 65536):
        addr = f"10.9.{n >> 8}.{n & 255}"
        same = by_slot.setdefault(vip_slot(vip_key(addr, 80, "tcp")), [])
        same.append(addr)
        if len(same) == count:
            return same
    raise AssertionError("no slot has that many keys")


def test_transaction_failing_in_a_vip_write_leaves_lb_vips_and_the_index_as_before(instance: Instance) -> None:
    """The VIP index changes with the transaction (a shared slot, a changed meta, a removal, new keys)
    until lb_vips is full and the kernel refuses the next VIP: lb_vips and lb_vip_index are both as
    before, and the index is exactly what lb_vips makes it."""
    dp = instance.dp
    before = _snapshot(instance)
    pair = _same_slot(2)
    room = dp.maps["lb_vips"].max_entries - len(list(dp.maps["lb_vips"].keys()))
    with pytest.raises(DatapathError, match="update map 'lb_vips'"), dp.transaction() as tx:
        for num, addr in enumerate(pair):
            tx.put_vip(addr, 80, "tcp", vip_num=num)
        assert dp.vip_index()[vip_slot(vip_key(pair[0], 80, "tcp")), -1] >> 24 == _abi.VipSlotState.SHARED
        assert tx.put_vip("198.51.100.100", 80, "tcp", vip_num=5, encap=_abi.Encap.GUE1)
        tx.del_vip("198.51.100.100", 9000, "udp")
        for n in range(room + 1):  # the last one does not fit
            tx.put_vip(f"10.8.0.{n + 1}", 443, "tcp", vip_num=n % 8)
    assert _snapshot(instance) == before
    assert np.array_equal(dp.vip_index(), vip_index_from(list(dp.maps["lb_vips"].items())))


def test_a_transaction_first_repairs_a_stale_vip_index(instance: Instance) -> None:
    """lb_vip_index is derived from lb_vips: what a controller killed between the two left behind
    (here: a VIP's slot emptied, another filled with a stray key) is rewritten when a transaction starts."""
    dp = instance.dp
    good = dp.vip_index().copy()
    slot = vip_slot(vip_key("198.51.100.100", 80, "tcp"))
    stray = (slot + 1) % len(good)
    dp.vip_index()[slot] = 0
    dp.vip_index()[stray] = np.frombuffer(bytes(12) + vip_key("10.7.0.1", 80, "tcp"), dtype="<u4")
    with dp.transaction() as tx:  # an empty transaction: starting one is what repairs the index
        assert np.array_equal(dp.vip_index(), good), "the index was rewritten when the transaction started"
        assert tx.ring_slots == 0
    assert np.array_equal(dp.vip_index(), good)


def test_datapath_transaction_refuses_real_id_zero(instance: Instance) -> None:
    with pytest.raises(DatapathError, match="real id 0 is reserved"), instance.dp.transaction() as tx:
        tx.put_real(0, "203.0.113.99")
