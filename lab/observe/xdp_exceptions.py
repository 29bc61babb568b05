"""The kernel's XDP exceptions, counted by our own BPF program on the xdp:xdp_exception tracepoint (no BCC).

The kernel raises xdp:xdp_exception when an XDP program returns XDP_ABORTED or an action its driver
cannot carry out (on veth: an XDP_TX or redirect the peer refused). `bpf/xdp_exception.bpf.c` counts
each event per (program id, action, ifindex) in a map; this module loads it through
`balancer.libbpf`, attaches it, and reads the map. A program id names one loaded program on the
whole machine, so a test asks about its own program and is blind to everyone else's:

    with XdpExceptions() as seen:
        run_storm()
    assert not seen.of_program(xdp_prog_id(netns, "lb-rt"))

Nothing here passes quietly: when the object is missing, tracefs is not mounted or the kernel refuses
the attachment, `start()` raises LabError with the reason and the fix.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import TracebackType

from balancer.errors import DatapathError
from balancer.libbpf import BpfObject, Map, TracepointLink
from lab import nsexec
from lab.errors import LabError

OBJECT = Path(__file__).resolve().parents[2] / "build" / "bpf" / "xdp_exception.o"
PROGRAM = "count_xdp_exception"
ABORT_PROGRAM = "xdp_abort"  # returns XDP_ABORTED: the self-test's way to make the kernel raise the event
XDP_ACTIONS = {0: "ABORTED", 1: "DROP", 2: "PASS", 3: "TX", 4: "REDIRECT"}
_KEY = struct.Struct("<IIi")  # struct xe_key: prog_id, act, ifindex


def action_name(act: int) -> str:
    return XDP_ACTIONS.get(act, f"action {act}")


class XdpExceptions:
    """Counts xdp:xdp_exception events machine-wide while open: {(program id, action, ifindex): events}."""

    def __init__(self, object_path: str | Path = OBJECT) -> None:
        self.object_path = Path(object_path)
        self._obj: BpfObject | None = None
        self._link: TracepointLink | None = None
        self._map: Map | None = None

    def __enter__(self) -> XdpExceptions:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Load and attach the counter; events count from now on. Raises LabError saying why it cannot."""
        if not self.object_path.is_file():
            raise LabError(f"cannot count XDP exceptions: {self.object_path} is missing; run `make bpf`")
        try:
            self._obj = BpfObject(str(self.object_path))
            self._obj.set_autoload(ABORT_PROGRAM, False)
            self._obj.load()
            self._map = self._obj.map("xe_count")
            self._link = self._obj.attach_tracepoint(PROGRAM, "xdp", "xdp_exception")
        except DatapathError as exc:
            self.close()
            raise LabError(f"cannot count XDP exceptions through the xdp:xdp_exception tracepoint: {exc}") from exc

    def counts(self) -> dict[tuple[int, str, int], int]:
        """{(program id, action, ifindex): events} since start."""
        if self._map is None:
            raise LabError("the XDP exception counter is not running: use `with XdpExceptions()` or start()")
        out = {}
        for key, value in self._map.items():
            prog_id, act, ifindex = _KEY.unpack(key)
            out[(prog_id, action_name(act), ifindex)] = int.from_bytes(value, "little")
        return out

    def of_program(self, prog_id: int) -> dict[tuple[str, int], int]:
        """{(action, ifindex): events} of one program since start ({} when it raised none)."""
        return {(act, ifindex): n for (pid, act, ifindex), n in self.counts().items() if pid == prog_id}

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
        self._map = None
        if self._obj is not None:
            self._obj.close()
            self._obj = None


def xdp_prog_id(netns: str, ifname: str) -> int:
    """The id of the XDP program attached to `ifname` in `netns` (LabError when there is none)."""
    out = nsexec.run(netns, ["ip", "-j", "-d", "link", "show", "dev", ifname]).stdout
    link = json.loads(out)[0]
    prog = link.get("xdp", {}).get("prog", {})
    if "id" not in prog:
        raise LabError(f"no XDP program is attached to '{ifname}' in namespace '{netns}'")
    return int(prog["id"])
