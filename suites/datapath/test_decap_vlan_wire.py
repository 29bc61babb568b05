"""test_decap_vlan_wire.py: what tc decap sees of 802.1Q tags on a real receive path (a veth), not a test run.

The receive path untags a frame (skb_vlan_untag) before the tc ingress hook: one tag reaches tc
in the skb's metadata, not in the frame; of an 802.1ad + 802.1Q frame, tc sees the outer tag in
the metadata and the inner one still in the frame.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

from scapy.layers.inet import IP
from scapy.packet import Raw

from lab.harness import unique_name

from . import packets as P
from .rig import DECAP_OBJ, ROOT, require_datapath

INNER4 = bytes(IP(src=P.CLIENT4, dst=P.VIP4) / Raw(P.PAYLOAD))


def with_tags(frame: bytes, *tags: tuple[int, int]) -> bytes:
    """frame with (TPID, VLAN id) tags inserted after the MAC addresses, outermost first."""
    return frame[:12] + b"".join(struct.pack("!HH", tpid, vid) for tpid, vid in tags) + frame[12:]


def test_tc_decap_of_tagged_frames_on_a_veth() -> None:
    require_datapath()
    ipip = bytes(P.eth() / IP(src=P.SRC4, dst=P.REALS4[0], proto=4) / Raw(INNER4))
    frames = {
        "untagged": ipip,
        "one 802.1Q tag (untagged into metadata before tc)": with_tags(ipip, (0x8100, 10)),
        "802.1ad + 802.1Q (inner tag still in the frame at tc)": with_tags(ipip, (0x88A8, 20), (0x8100, 10)),
    }
    netns = unique_name(f"dpl-{os.getpid():x}", 2)
    subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
    try:
        run = subprocess.run(
            ["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-m", "suites.datapath._vlan_wire",
             str(DECAP_OBJ), P.REALS4[0], *(f.hex() for f in frames.values())],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"the probe in {netns} failed: {run.stderr[-2000:]}"
        reasons = dict(zip(frames, json.loads(run.stdout), strict=True))
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)
    assert not Path(f"/run/netns/{netns}").exists(), f"namespace {netns} left behind"
    assert reasons == dict.fromkeys(frames, "IPIP"), reasons
