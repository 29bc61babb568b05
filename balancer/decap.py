"""decap.py: the real-server decap program (XDP and tc variants) and its local-address table.

Loaded, attached and pinned as the balancer is (balancer/datapath.py); the reals of a lab and of
the suites run it where the kernel has no ipip or fou module.
"""

from __future__ import annotations

import socket
from pathlib import Path

from balancer import _abi, objects
from balancer.datapath import DECAP_MAPS, patch_rodata, sum_counters, verify_abi
from balancer.libbpf import BpfObject, Link, Map, Program
from balancer.maplayout import addr_words, u32x4


class Decap:
    """The real-server decap program (XDP and tc variants) and its local-address table."""

    def __init__(self, obj: BpfObject, maps: dict[str, Map], programs: dict[str, Program]) -> None:
        self._obj = obj
        self.maps = maps
        self.programs = programs
        self.links: list[Link] = []

    @classmethod
    def load(cls, obj_path: str = "decap.o", gue_port: int = _abi.Limits.DEFAULT_GUE_PORT) -> Decap:
        obj_path = objects.find(obj_path)
        verify_abi(obj_path)
        obj = BpfObject(obj_path)
        try:
            patch_rodata(obj, "decap", {"cfg_gue_port": gue_port})
            obj.load()
            maps = {n: obj.map(n) for n in DECAP_MAPS}
            progs = {n: obj.program(n) for n in ("decap_xdp", "decap_tc")}
            return cls(obj, maps, progs)
        except BaseException:
            obj.close()
            raise

    def add_local(self, address: str) -> None:
        raw, fam = addr_words(address)
        key = _abi.AddrKey(addr=u32x4(raw), family=fam)
        self.maps["dc_local"].update(bytes(key), (1).to_bytes(4, "little"))

    def attach_tc(self, ifname: str) -> Link:
        link = self.programs["decap_tc"].attach_tcx(socket.if_nametoindex(ifname), "ingress", ifname)
        self.links.append(link)
        return link

    def attach_xdp(self, ifname: str, mode: str = "native") -> Link:
        link = self.programs["decap_xdp"].attach_xdp(socket.if_nametoindex(ifname), mode, ifname)
        self.links.append(link)
        return link

    def pin(self, pin_dir: str) -> None:
        d = Path(pin_dir)
        d.mkdir(parents=True, exist_ok=True)
        for name, m in self.maps.items():
            m.pin(str(d / name))
        for i, link in enumerate(self.links):
            link.pin(str(d / f"link_{i}"))

    def reasons(self) -> dict[str, int]:
        m = self.maps["dc_reasons"]
        return {r.name: sum_counters(m, r.value)[0] for r in _abi.DecapReason
                if not r.name.endswith("COUNT")}

    def run_xdp(self, frame: bytes) -> tuple[int, bytes]:
        res = self.programs["decap_xdp"].test_run(frame)
        return res.retval, res.data

    def run_tc(self, frame: bytes) -> tuple[int, bytes]:
        res = self.programs["decap_tc"].test_run(frame)
        return res.retval, res.data

    def close(self) -> None:
        for link in self.links:
            link.close()
        self._obj.close()
