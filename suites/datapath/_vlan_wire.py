"""_vlan_wire.py: run inside a network namespace: tc decap on a veth's ingress, tagged frames sent into it, reasons out.

    nsenter --net=/run/netns/NS python -m suites.datapath._vlan_wire DECAP_OBJ LOCAL_ADDR HEXFRAME...

Makes the veth pair dpl-a / dpl-b, attaches decap_tc to dpl-b's ingress, sends each frame out of
dpl-a with a packet socket, waits (with a deadline) until the decap program counted it, and prints
one JSON list: the decap reason each frame counted.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from balancer.decap import Decap
from lab.harness import poll

DEADLINE_S = 5.0


def counted(decap: Decap, before: dict[str, int]) -> str:
    """The one decap reason the frame moved (within DEADLINE_S)."""
    def moved() -> list[str]:
        now = decap.reasons()
        found = [k for k in now if now[k] != before[k]]
        if found and (len(found) != 1 or now[found[0]] - before[found[0]] != 1):
            raise AssertionError(f"one decap reason per frame, got {found}")
        return found

    return poll(DEADLINE_S, moved, "decap_tc on dpl-b counting the frame (did it arrive?)", interval_s=0.005)[0]


def main(obj: str, local: str, frames: list[str]) -> None:
    for cmd in (["ip", "link", "add", "dpl-a", "type", "veth", "peer", "name", "dpl-b"],
                ["ip", "link", "set", "dpl-a", "up"], ["ip", "link", "set", "dpl-b", "up"]):
        subprocess.run(cmd, check=True, capture_output=True)
    decap = Decap.load(obj)
    try:
        decap.add_local(local)
        decap.attach_tc("dpl-b")
        out = []
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind(("dpl-a", 0))
            for hexframe in frames:
                before = decap.reasons()
                s.send(bytes.fromhex(hexframe))
                out.append(counted(decap, before))
        print(json.dumps(out))
    finally:
        decap.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
