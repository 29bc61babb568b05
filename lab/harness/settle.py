"""settle.py: waiting, with deadlines, until a lab is quiet: client sockets done, captures and counters caught up.

A request returns before its connection is finished: the client's kernel still sends the last ACK
or FIN after the server's FIN arrives. A test that stops its captures or reads its counters when
the request returns would race with those packets; it polls for the state instead.
"""

from __future__ import annotations

import operator

from lab.harness import Lab, poll


def client_busy(lab: Lab, vip: str) -> list[str]:
    """The client's TCP sockets towards vip that may still send (neither closed nor in TIME-WAIT)."""
    out = lab.run("client", ["ss", "-Htan", "dst", f"[{vip}]" if ":" in vip else vip]).stdout
    return [line for line in out.splitlines() if line.strip() and not line.startswith("TIME-WAIT")]


def wait_client_quiet(lab: Lab, vip: str, deadline_s: float = 20.0) -> None:
    """Return once every client connection to vip is closed or in TIME-WAIT; fail after deadline_s."""
    busy = poll(deadline_s, lambda: client_busy(lab, vip), f"client sockets to {vip} closed",
                until=operator.not_, check=False)
    assert not busy, f"client sockets to {vip} still open after {deadline_s} s: {busy}"
