"""The l4lab side of the Katran bench, programmed from a plain spec, in this checkout or in another one.

`program()` is what `lab/bench/katran.py` does to every l4lab instance it times. Run as a script
(`python sidespec.py PIN_DIR`, the spec a JSON line on stdin, with an older checkout first on
PYTHONPATH, by lab/bench/foreign.py),
it loads that checkout's balancer.o with that checkout's own controller, which alone knows the
object's map layout, pins the program and the IPv4 session table for the bench to open, and answers
"counters" lines on stdin until stdin closes. So the module imports only `balancer`, and only names
every checkout since the bench's first has had (Datapath, encaps.by_id).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

from balancer import encaps
from balancer.datapath import Datapath


def spec(obj: str, encap_id: str, lru_size: int, vip: str, vip_port: int, reals: tuple[str, ...],
         ring: Any, nexthop_mac: str, src4: str) -> dict[str, Any]:
    """Everything an l4lab side is loaded and programmed with, as JSON can carry it."""
    return {"obj": obj, "encap": encap_id, "lru_size": lru_size, "vip": vip, "vip_port": vip_port,
            "reals": list(reals), "ring": [int(x) for x in ring], "nexthop_mac": nexthop_mac, "src4": src4}


def program(s: dict[str, Any]) -> Datapath:
    """The balancer of spec `s`, loaded and programmed: one TCP VIP and its address entry, the reals, the ring."""
    dp = Datapath.load(s["obj"], max_vips=4, max_reals=16, ring_size=len(s["ring"]), lru_size=s["lru_size"],
                       fallback_size=1024)
    try:
        dp.set_settings(nexthop_mac=s["nexthop_mac"], src4=f"{s['src4']}/32", mtu=1500)
        dp.put_vip(s["vip"], s["vip_port"], "tcp", vip_num=0, encap=encaps.by_id(s["encap"]).mode)
        dp.put_vip(s["vip"], 0, 0, vip_num=1)  # the address-only entry the controller writes for each VIP address
        for i, addr in enumerate(s["reals"]):
            dp.put_real(i + 1, addr)
        dp.write_ring(0, list(s["ring"]))
    except BaseException:
        dp.close()
        raise
    return dp


def counters(dp: Datapath) -> dict[str, int]:
    return {**dp.events(), **dp.reasons()}


def serve(s: dict[str, Any], pin_dir: str) -> None:
    """Load, pin, say ready, answer until stdin closes; the Datapath is closed on the way out."""
    dp = program(s)
    try:
        dp.programs["balancer_xdp"].pin(os.path.join(pin_dir, "prog"))
        dp.session_tables[0].pin(os.path.join(pin_dir, "sessions"))  # IPv4 flows: the one the frames use
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            if line.strip() == "counters":
                print(json.dumps(counters(dp)), flush=True)
    finally:
        dp.close()


def main(argv: list[str]) -> int:
    try:
        serve(json.loads(sys.stdin.readline()), argv[1])  # a ring of 65,537 is past argv's 128 KiB
    except Exception as exc:  # any failure goes to the bench as one line, with where it happened
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(json.dumps({"error": f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
