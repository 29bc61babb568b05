"""Generated configs through `lbctl apply` against one loaded datapath.

Hypothesis builds a valid config (VIPs of both families, encaps, hashes, reals and weights, outer
sources, GUE port, next-hop MAC, metrics), then, in about half the examples, breaks one key of it.
`lbctl apply` runs in this process (its `main`, the same code as the command) on a datapath loaded
once for the module and not attached (no traffic moves a counter):

* a broken config is refused in one line that names the broken key, with exit 2 (or 1 when only
  the loaded datapath refuses it: another ring_size), and the maps and the state are unchanged;
* a valid config is applied (exit 0), and applying it again writes nothing.

Examples are bounded (L4LAB_APPLY_EXAMPLES, 300 by default: about 30 s here).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from balancer import cli, controller, preflight
from balancer import config as cfg
from balancer.controller import Instance
from balancer.libbpf import map_from_pin
from lab.harness import unique_name

EXAMPLES = int(os.environ.get("L4LAB_APPLY_EXAMPLES", "300"))
DATAPATH = {"interfaces": ["gen0"], "ring_size": 251, "max_vips": 8, "max_reals": 16, "lru_size": 64,
            "fallback_size": 64}
# At most 4 VIPs and 7 distinct reals per config: an apply keeps the numbers it frees out of use
# until the next apply, so old and new must fit max_vips = 8 and max_reals - 1 = 15 together.
V4_VIPS = [f"198.51.100.{i}" for i in (10, 11)]
V6_VIPS = ["2001:db8:100::10", "2001:db8:100::11"]
V4_REALS = [f"203.0.113.{i}" for i in range(2, 6)]
V6_REALS = [f"2001:db8:200::{i}" for i in range(2, 5)]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"


def render(doc: dict[str, Any]) -> str:
    """TOML text of doc: top-level tables, then [[vips]] with inline reals."""
    out = []
    for table, items in doc.items():
        if table != "vips":
            out.append(f"[{table}]")
            out += [f"{k} = {_toml(v)}" for k, v in items.items()]
    for vip in doc.get("vips", []):
        out.append("[[vips]]")
        out += [f"{k} = {_toml(v)}" for k, v in vip.items()]
    return "\n".join(out) + "\n"


@st.composite
def valid_doc(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.tuples(st.sampled_from(V4_VIPS + V6_VIPS), st.integers(0, 65535),
                                   st.sampled_from(cfg.PROTOS)),
                         min_size=0, max_size=4, unique=True))
    reals4 = draw(st.lists(st.sampled_from(V4_REALS), max_size=4, unique=True))
    reals6 = draw(st.lists(st.sampled_from(V6_REALS), max_size=3, unique=True))
    vips = []
    for address, port, proto in keys:
        pool = reals6 if ":" in address else reals4 + reals6
        picked = draw(st.lists(st.sampled_from(pool), max_size=len(pool), unique=True)) if pool else []
        vip: dict[str, Any] = {"address": address, "port": port, "proto": proto}
        for key, options in (("encap", cfg.ENCAPS), ("hash", cfg.HASHES), ("outer_src", cfg.OUTER_SRCS)):
            if draw(st.booleans()):
                vip[key] = draw(st.sampled_from(options))
        if draw(st.booleans()):
            vip["lru"] = draw(st.booleans())
        vip["reals"] = [{"address": a, "weight": draw(st.sampled_from([0, 1, 2, 7, 65535]))} for a in picked]
        vips.append(vip)
    encap: dict[str, Any] = {"nexthop_mac": f"02:00:00:00:{draw(st.integers(0, 255)):02x}:01"}
    if draw(st.booleans()):
        encap["gue_port"] = draw(st.integers(1, 65535))
    if draw(st.booleans()):
        encap["src4"] = draw(st.sampled_from(["192.0.2.1/32", "192.0.2.0/24", "10.0.0.0/8"]))
    if draw(st.booleans()):
        encap["src6"] = draw(st.sampled_from(["2001:db8:1::1/128", "2001:db8:1::/64"]))
    doc: dict[str, Any] = {"datapath": dict(DATAPATH), "encap": encap, "vips": vips}
    if draw(st.booleans()):
        doc["metrics"] = {"listen": draw(st.sampled_from(["127.0.0.1:9100", "[::1]:9200"]))}
    return doc


@dataclass(frozen=True)
class Break:
    """One way to break a config: the key the refusal must name, the exit status, and the edit."""

    key: str
    status: int
    edit: Callable[[dict[str, Any]], None]


def _vip_breaks(i: int, vip: dict[str, Any]) -> list[Break]:
    def setter(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        return lambda doc: doc["vips"][i].__setitem__(key, value)

    out = [Break(f"vips[{i}].port", 2, setter("port", 65536)),
           Break(f"vips[{i}].port", 2, setter("port", -1)),
           Break(f"vips[{i}].proto", 2, setter("proto", "sctp")),
           Break(f"vips[{i}].encap", 2, setter("encap", "vxlan")),
           Break(f"vips[{i}].hash", 2, setter("hash", "crc")),
           Break(f"vips[{i}].lru", 2, setter("lru", "yes")),
           Break(f"vips[{i}].outer_src", 2, setter("outer_src", "random")),
           Break(f"vips[{i}].address", 2, setter("address", "198.51.100.300")),
           Break(f"vips[{i}].colour", 2, setter("colour", "blue")),
           Break(f"vips[{i}].reals", 2, setter("reals", "203.0.113.2"))]
    if ":" in vip["address"]:
        out.append(Break(f"vips[{i}].reals[0]", 2,
                         lambda doc: doc["vips"][i]["reals"].insert(0, {"address": "203.0.113.9"})))
    for j, _real in enumerate(vip["reals"]):
        out += [Break(f"vips[{i}].reals[{j}].weight", 2,
                      lambda doc, j=j: doc["vips"][i]["reals"][j].__setitem__("weight", 65536)),
                Break(f"vips[{i}].reals[{j}].address", 2,
                      lambda doc, j=j: doc["vips"][i]["reals"][j].__setitem__("address", "real-one"))]
        if j:
            out.append(Break(f"vips[{i}].reals[{j}].address", 2,
                             lambda doc, j=j: doc["vips"][i]["reals"][j].__setitem__(
                                 "address", doc["vips"][i]["reals"][0]["address"])))
    if i:
        out.append(Break(f"vips[{i}]", 2, lambda doc: doc["vips"].__setitem__(i, dict(doc["vips"][0]))))
    return out


def breaks(doc: dict[str, Any]) -> list[Break]:
    def at(table: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        return lambda d: d.setdefault(table, {}).__setitem__(key, value)

    out = [Break("encap.nexthop_mac", 2, at("encap", "nexthop_mac", "02:00:00:00:00")),
           Break("encap.nexthop_mac", 2, at("encap", "nexthop_mac", "01:00:5e:00:00:01")),
           Break("encap.gue_port", 2, at("encap", "gue_port", 0)),
           Break("encap.src4", 2, at("encap", "src4", "192.0.2.0/33")),
           Break("encap.src6", 2, at("encap", "src6", "192.0.2.0/24")),
           Break("metrics.listen", 2, at("metrics", "listen", "localhost:9100")),
           Break("datapath.ring_size", 2, at("datapath", "ring_size", 250)),
           Break("datapath.max_vips", 2, at("datapath", "max_vips", 0)),
           Break("ring_size", 1, at("datapath", "ring_size", 257)),  # valid, but not for this datapath
           Break("datapath.mode", 2, at("datapath", "mode", "turbo")),
           Break("balancer", 2, lambda d: d.__setitem__("balancer", {"x": 1}))]
    for i, vip in enumerate(doc["vips"]):
        out += _vip_breaks(i, vip)
    return out


@dataclass
class Loaded:
    instance: str
    file: Path


def dump(lb: Loaded) -> tuple[object, ...]:
    """The maps apply writes (VIPs and their index, reals, settings, every ring slot) and the
    state file."""
    pins = Path(Instance.pin_dir(lb.instance))
    tables = []
    for name in ("lb_vips", "lb_reals", "lb_settings"):
        m = map_from_pin(str(pins / name))
        try:
            tables.append(sorted(m.items()))
        finally:
            m.close()
    ring = map_from_pin(str(pins / "lb_ring"))
    try:
        slots = bytes(ring.mmap_u32())
    finally:
        ring.close()
    index = map_from_pin(str(pins / "lb_vip_index"))
    try:
        vip_index = index.mmap_words().tobytes()
    finally:
        index.close()
    return (*tables, vip_index, slots, Instance.state_path(lb.instance).read_text())


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    """Name: loaded. Scope: module. Depends: root, bpffs, built balancer object.

    A balancer instance loaded with an empty config and attached nowhere; unloaded afterwards::

        def test_x(loaded):
            cli.main(["--instance", loaded.instance, "apply", str(loaded.file)])
    """
    if os.geteuid() != 0:
        pytest.skip("needs root")
    name = unique_name("gen", 4)
    conf = cfg.parse({"datapath": DATAPATH}, "generated")
    Instance.load(name, [], "native", conf).close()
    try:
        yield Loaded(name, tmp_path_factory.mktemp("generated") / "lb.toml")
    finally:
        inst = Instance.open(name)
        inst.unload()
        preflight.lock_path(controller.STATE_ROOT, name).unlink(missing_ok=True)


def lbctl_apply(lb: Loaded, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    lb.file.write_text(text)
    capsys.readouterr()
    status = cli.main(["--instance", lb.instance, "apply", str(lb.file)])
    out, err = capsys.readouterr()
    return status, out, err


@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=valid_doc(), data=st.data())
def test_generated_configs_through_lbctl_apply(loaded: Loaded, capsys: pytest.CaptureFixture[str],
                                               doc: dict[str, Any], data: st.DataObject) -> None:
    # A uniform pick: sampled_from leans to the first items, and every break should be drawn.
    broken = data.draw(st.randoms(use_true_random=False)).choice(breaks(doc)) \
        if data.draw(st.booleans(), label="break it") else None
    event("valid" if broken is None else f"broken: {re.sub(r'[0-9]+', 'N', broken.key)}")
    if broken is None:
        status, out, err = lbctl_apply(loaded, render(doc), capsys)
        assert status == 0, err
        assert out.startswith(f"applied {loaded.file}: "), out
        vips = {(ipaddress.ip_address(v["address"]), v["port"], v["proto"]) for v in doc["vips"]}
        pins = Path(Instance.pin_dir(loaded.instance))
        m = map_from_pin(str(pins / "lb_vips"))
        try:
            entries = sum(1 for _ in m.items())
        finally:
            m.close()
        assert entries == len(vips) + len({a for a, _, _ in vips}), "one entry per VIP and per VIP address"
        again = lbctl_apply(loaded, render(doc), capsys)
        assert again[0] == 0 and again[1].strip().endswith("nothing to change"), again
        return
    before = dump(loaded)
    broken.edit(doc)
    status, out, err = lbctl_apply(loaded, render(doc), capsys)
    lines = err.strip().splitlines()
    assert status == broken.status, (broken.key, err)
    assert len(lines) == 1 and out == "", err
    assert broken.key in lines[0], (broken.key, lines[0])
    assert dump(loaded) == before
