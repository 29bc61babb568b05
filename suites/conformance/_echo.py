"""_echo.py: the line echo the connection checks talk to, on every real, and how to leave none of its connections.

The lab's HTTP server closes every connection after one answer; long-lived connections need a
service of their own (lab/nodes/tcp_services.py `echo`). The fixtures `echo_services` and `echoes`
(suites/conformance/conftest.py) run it on ECHO_PORT of every VIP address, pinned to CPU 0.
"""

from __future__ import annotations

from typing import Any

from lab.lbconf import real_addresses

ECHO_PORT = 7007


def binds(lab: Any, port: int = ECHO_PORT) -> list[str]:
    """ADDR:PORT of `port` on every VIP address of the lab's topology."""
    return [f"[{v.address}]:{port}" if v.address.version == 6 else f"{v.address}:{port}" for v in lab.topology.vips]


def kill_connections(lab: Any, port: int = ECHO_PORT) -> None:
    """Destroy every connection of the echo port on the reals (`ss -K`, SOCK_DESTROY).

    A real whose flows were taken away (removed, or reset elsewhere) keeps them ESTABLISHED: nothing
    reaches it to end them. Should a later client reuse such a source port and be hashed there, its
    packets fall outside the stale connection's window and are answered by bare ACKs, not RST:
    the flow times out instead of resetting. Each check starts and ends with none.
    """
    for node in sorted(real_addresses(lab.topology, 4)):
        lab.run(node, ["ss", "-K", "-tn", "state", "connected", "sport", "=", f":{port}"])
