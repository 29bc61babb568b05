"""_traffic.py: what the checks send through a DUT and how they read who answered (lab/nodes/traffic.py).

    answers = requests(lab, dut, "http", 80, 30)            # each a new flow; the real names itself
    before = owners(lab, dut, PROBES, sport_base=41000)    # {(client, sport): real} of fresh TCP flows

`owners` is how a check sees which real a flow belongs to without asking the DUT: it opens one
TCP connection per flow (a SYN every DUT places by its hash, never by an old session) and reads
the real's name in the answer. With the same `sport_base` the same flows are sent again, once the
DUT has forgotten them (`Dut.settle`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lab.dut import Dut
from lab.errors import LabError
from lab.poll import poll

Flow = tuple[str, int]


def clients(lab: Any, family: int) -> list[str]:
    """Every address of the client node in `family` (the client acts as several)."""
    return sorted({str(a.ip) for link in lab.topology.links for ep in link.endpoints
                   if ep.node == "client" for a in ep.all_addresses if a.version == family})


def requests(lab: Any, dut: Dut, kind: str, port: int, count: int, sport_base: int = 0,
             vip: str | None = None) -> list[dict[str, Any]]:
    """`count` new flows (http or udp) to the DUT's VIP, spread over the client's addresses."""
    args = [kind, "--vip", vip or dut.vips()[0], "--port", str(port), "--count", str(count)]
    args += [a for c in clients(lab, dut.family) for a in ("--source", c)]
    if sport_base:
        args += ["--sport-base", str(sport_base)]
    answers: list[dict[str, Any]] = json.loads(lab.python("client", "lab.nodes.traffic", *args).stdout)
    return answers


def exchange(lab: Any, dut: Dut, pcap: Path, count: int) -> list[dict[str, Any]]:
    """`count` HTTP and `count` UDP requests from the client's addresses to every VIP of the DUT's
    family, while the router's side of the DUT's link is captured into `pcap`."""
    link = dut.link()
    answers: list[dict[str, Any]] = []
    with lab.capture(link.node, link.ifname, pcap):
        for vip in dut.vips():
            answers += requests(lab, dut, "http", 80, count, vip=vip)
            answers += requests(lab, dut, "udp", 9000, count, vip=vip)
    return answers


def failed(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests that failed on their way through the DUT; a client that could not take its own
    port sent nothing, which is the lab's failure, not the DUT's (LabError)."""
    unsent = [a for a in answers if a.get("stage") == "bind"]
    if unsent:
        raise LabError(f"the client could not bind {len(unsent)} of its source ports: {unsent[:3]}")
    return [a for a in answers if "error" in a]


def owners(lab: Any, dut: Dut, count: int, sport_base: int, port: int = 80) -> dict[Flow, str]:
    """{(client, sport): the real that answered} for `count` fresh TCP flows from fixed ports; the
    DUT is first made to forget the flows it saw (`settle`), so that each is new to it."""
    dut.settle(port)
    answers = requests(lab, dut, "http", port, count, sport_base=sport_base)
    bad = failed(answers)
    assert not bad, f"{len(bad)} of {len(answers)} flows through {dut.name} failed: {bad[:3]}"
    return {(str(a["source"]), int(a["sport"])): str(a["node"]) for a in answers}


def settled_counters(dut: Dut) -> dict[str, int]:
    """The DUT's per-real counters once they held still for as long as they may lag (`counter_lag_s`):
    a reading taken while an earlier check's packets are still being summed would count them here."""
    state = [(time.monotonic(), dut.forwarded())]

    def probe() -> dict[str, int] | None:
        now, value = time.monotonic(), dut.forwarded()
        since, last = state[-1]
        if value != last:
            state.append((now, value))
            return None
        return value if now - since >= dut.counter_lag_s else None

    deadline = 5 * dut.counter_lag_s + 5
    got = poll(deadline, probe, f"{dut.name}'s counters holding still", until=lambda v: v is not None,
               check=False, interval_s=0.2)
    if got is None:
        raise LabError(f"{dut.name}'s counters kept moving for {deadline:g} s with no traffic of the check's: "
                       f"{state[-3:]}")
    return got
