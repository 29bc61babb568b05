"""The lab tracer: where packets died, per lab node and interface (XDP exceptions, XDP bulk-TX errors, drop reasons).

BCC compiles a small program that attaches to five raw tracepoints and counts, per network
namespace, interface and cause:

    xdp:xdp_exception   an XDP program returned XDP_ABORTED or an action the driver could not do
    xdp:xdp_bulk_tx     a batch of XDP_TX / redirected frames with dropped frames or an error
    xdp:xdp_redirect_err, xdp:xdp_devmap_xmit
                        a redirect that failed, or a devmap's batch (a two-arm LB's egress) that the
                        target interface dropped, counted on the target (redirect_error)
    skb:kfree_skb       an skb freed as a drop, with the kernel's drop reason (NO_SOCKET, ...)

Only the lab's namespaces are counted: a node is the namespace /run/netns/<lab>-<node>, matched by
its inode. Kernel structures are read at offsets taken from the running kernel's BTF, so the
program needs no headers of the running kernel beyond what BCC itself includes: any Debian
linux-headers package serves, merged under /run/l4lab/bcc-headers/ (see `kernel_headers`); nothing
is written under /lib/modules.

    with Tracer("l4lab") as tracer:
        send_traffic()
        print(tracer.report().render())

This tracer is evidence for a human (a failed test's report, `l4lab trace`), and it is absent when
BCC is. A test that asserts "no XDP exception" counts them with lab/observe/xdp_exceptions.py instead: our
own BPF object on the same tracepoint, loaded through balancer.libbpf, which fails saying why
rather than turning into nothing.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import socket
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from lab import topology
from lab.errors import LabError, LabNotFoundError, UsageError
from lab.nsexec import NETNS_DIR, entered
from lab.observe.kernel_btf import KernelBtf
from lab.state import LabState, netns_name

SETUP_HINT = "bash scripts/setup.sh --extra trace"
XDP_ACTIONS = {0: "ABORTED", 1: "DROP", 2: "PASS", 3: "TX", 4: "REDIRECT"}
KINDS = ("xdp_exception", "bulk_tx_error", "kfree_skb", "redirect_error")
_KIND_EXCEPTION, _KIND_BULK_TX, _KIND_KFREE_SKB, _KIND_REDIRECT = range(4)
_FIRST_DROP_REASON = 2  # 0 and 1 (not dropped yet, consumed) are not drops
_DROP_PREFIX = "SKB_DROP_REASON_"

_PROGRAM = r"""
struct key_t {
    u32 inum;
    u32 ifindex;
    u32 kind;
    u32 code;
};

struct val_t {
    u64 events;
    u64 packets;
};

BPF_HASH(watched, u32, u8, 1024);
BPF_HASH(counts, struct key_t, struct val_t, 16384);

static __always_inline u32 net_inum(void *net)
{
    u32 inum = 0;
    if (net)
        bpf_probe_read_kernel(&inum, sizeof(inum), (char *)net + OFF_NET_INUM);
    return inum;
}

static __always_inline u32 dev_inum(void *dev)
{
    void *net = NULL;
    if (dev)
        bpf_probe_read_kernel(&net, sizeof(net), (char *)dev + OFF_DEV_NET);
    return net_inum(net);
}

static __always_inline u32 dev_ifindex(void *dev)
{
    u32 ifindex = 0;
    if (dev)
        bpf_probe_read_kernel(&ifindex, sizeof(ifindex), (char *)dev + OFF_DEV_IFINDEX);
    return ifindex;
}

static __always_inline void count(u32 inum, u32 ifindex, u32 kind, u32 code, u64 packets)
{
    if (!watched.lookup(&inum))
        return;
    struct key_t key = {.inum = inum, .ifindex = ifindex, .kind = kind, .code = code};
    struct val_t zero = {};
    struct val_t *val = counts.lookup_or_try_init(&key, &zero);
    if (val) {
        __sync_fetch_and_add(&val->events, 1);
        __sync_fetch_and_add(&val->packets, packets);
    }
}

/* xdp_exception(const struct net_device *dev, const struct bpf_prog *xdp, u32 act) */
RAW_TRACEPOINT_PROBE(xdp_exception)
{
    void *dev = (void *)ctx->args[0];
    count(dev_inum(dev), dev_ifindex(dev), KIND_EXCEPTION, (u32)ctx->args[2], 1);
    return 0;
}

/* xdp_bulk_tx(const struct net_device *dev, int sent, int drops, int err) */
RAW_TRACEPOINT_PROBE(xdp_bulk_tx)
{
    void *dev = (void *)ctx->args[0];
    int drops = (int)ctx->args[2];
    int err = (int)ctx->args[3];
    if (drops == 0 && err == 0)
        return 0;
    count(dev_inum(dev), dev_ifindex(dev), KIND_BULK_TX, (u32)(err < 0 ? -err : err),
          drops > 0 ? drops : 0);
    return 0;
}

/* xdp_redirect_err(const struct net_device *dev, const struct bpf_prog *xdp, const void *tgt, int err, ...) */
RAW_TRACEPOINT_PROBE(xdp_redirect_err)
{
    void *dev = (void *)ctx->args[0];
    int err = (int)ctx->args[3];
    count(dev_inum(dev), dev_ifindex(dev), KIND_REDIRECT, (u32)(err < 0 ? -err : err), 1);
    return 0;
}

/* xdp_devmap_xmit(const struct net_device *from_dev, const struct net_device *to_dev, int sent, int drops,
 * int err): counted on the target, where a two-arm LB's egress frames died */
RAW_TRACEPOINT_PROBE(xdp_devmap_xmit)
{
    void *dev = (void *)ctx->args[1];
    int drops = (int)ctx->args[3];
    int err = (int)ctx->args[4];
    if (drops == 0 && err == 0)
        return 0;
    count(dev_inum(dev), dev_ifindex(dev), KIND_REDIRECT, (u32)(err < 0 ? -err : err), drops > 0 ? drops : 0);
    return 0;
}

/* kfree_skb(struct sk_buff *skb, void *location, enum skb_drop_reason reason, ...) */
RAW_TRACEPOINT_PROBE(kfree_skb)
{
    void *skb = (void *)ctx->args[0];
    u32 reason = (u32)ctx->args[2];
    void *dev = NULL, *sk = NULL, *net = NULL;
    u32 inum = 0, ifindex = 0;

    if (reason < FIRST_DROP_REASON || !skb)
        return 0;
    bpf_probe_read_kernel(&dev, sizeof(dev), (char *)skb + OFF_SKB_DEV);
    if (dev) {
        inum = dev_inum(dev);
        ifindex = dev_ifindex(dev);
    } else {
        /* Socket-level drops may have no device any more: the socket knows the namespace. */
        bpf_probe_read_kernel(&sk, sizeof(sk), (char *)skb + OFF_SKB_SK);
        if (sk)
            bpf_probe_read_kernel(&net, sizeof(net), (char *)sk + OFF_SK_NET);
        inum = net_inum(net);
        bpf_probe_read_kernel(&ifindex, sizeof(ifindex), (char *)skb + OFF_SKB_IIF);
    }
    count(inum, ifindex, KIND_KFREE_SKB, reason, 1);
    return 0;
}
"""


HEADERS_ROOT = Path("/run/l4lab/bcc-headers")  # merged header trees, one per headers package


def kernel_build_dir() -> Path:
    return Path("/lib/modules") / os.uname().release


def _merge_tree(dest: Path, sources: list[Path]) -> None:
    """A tree of symbolic links at `dest` showing `sources` merged: a directory present in several
    sources is merged again, anything else links to the first source that has it."""
    dest.mkdir(parents=True)
    entries: dict[str, list[Path]] = {}
    for src in sources:
        for entry in sorted(src.iterdir()):
            entries.setdefault(entry.name, []).append(entry)
    for name, found in entries.items():
        if len(found) > 1 and all(e.is_dir() for e in found):
            _merge_tree(dest / name, found)
        else:
            (dest / name).symlink_to(found[0])


def kernel_headers() -> Path | None:
    """The kernel source tree BCC should compile against, or None for BCC's own default.

    None when /lib/modules/$(uname -r)/build exists or BCC_KERNEL_SOURCE is already set. Otherwise
    (kernels without their own headers package, like this machine's) a tree under
    /run/l4lab/bcc-headers/ that merges Debian's newest linux-headers-*-amd64 (generated headers)
    over its -common (the sources): the tracer uses UAPI types only and reads kernel structures at
    BTF offsets, so headers of another version serve. Nothing under /lib/modules is touched.
    """
    if (kernel_build_dir() / "build").exists() or os.environ.get("BCC_KERNEL_SOURCE"):
        return None
    missing = headers_missing()
    if missing:
        raise LabError(f"{missing}; run `{SETUP_HINT}`")
    arch = sorted(Path("/usr/src").glob("linux-headers-*-amd64"))
    common = sorted(Path("/usr/src").glob("linux-headers-*-common"))
    merged = HEADERS_ROOT / arch[-1].name
    if (merged / "include").is_dir():
        return merged
    try:
        HEADERS_ROOT.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=HEADERS_ROOT))
        try:
            _merge_tree(stage / "tree", [arch[-1], common[-1]])
            os.rename(stage / "tree", merged)  # atomic: a concurrent tracer sees no tree or a whole one
        except OSError:
            if not (merged / "include").is_dir():  # else a concurrent tracer built it first
                raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    except OSError as exc:
        raise LabError(
            f"cannot build the merged kernel headers {merged} from {arch[-1]} and {common[-1]}: "
            f"{exc.strerror or exc}; run as root"
        ) from exc
    return merged


def headers_missing() -> str | None:
    """Why BCC has no kernel headers to compile against (None when it has some); reads only."""
    if (kernel_build_dir() / "build").exists() or os.environ.get("BCC_KERNEL_SOURCE"):
        return None
    src = Path("/usr/src")
    if not any(src.glob("linux-headers-*-amd64")) or not any(src.glob("linux-headers-*-common")):
        return (f"BCC needs kernel headers: {kernel_build_dir()}/build is missing and no "
                "linux-headers-*-amd64 / -common is installed under /usr/src")
    return None


def compile_bcc(text: bytes, cflags: Sequence[str] = ()) -> Any:
    """`bcc.BPF(text=..., cflags=...)` compiled against `kernel_headers()` (BCC_KERNEL_SOURCE is set
    for the compile only)."""
    bcc = _bcc()
    headers = kernel_headers()
    if headers is None:
        return bcc.BPF(text=text, cflags=list(cflags))
    os.environ["BCC_KERNEL_SOURCE"] = str(headers)
    try:
        return bcc.BPF(text=text, cflags=list(cflags))
    finally:
        del os.environ["BCC_KERNEL_SOURCE"]


def _bcc() -> Any:
    try:
        import bcc
    except ImportError as exc:
        raise LabError(
            f"the tracer needs BCC (Debian's python3-bpfcc, used through the system interpreter): "
            f"run `{SETUP_HINT}`"
        ) from exc
    return bcc


def bcc_missing() -> str | None:
    """Why the tracer cannot run here (with the command that fixes it), or None if it can."""
    if os.geteuid() != 0:
        return "the tracer needs root"
    try:
        _bcc()
    except LabError as exc:
        return exc.message
    return headers_missing()


def lab_nodes(lab: str) -> dict[str, str]:
    """{node: netns} of a lab: the topology's netns nodes when the lab has state, else /run/netns/<lab>-*."""
    try:
        state = LabState.load(lab)
    except LabNotFoundError:
        prefix = f"{lab}-"
        found = sorted(p.name for p in NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.is_dir() else []
        if not found:
            raise LabNotFoundError(
                f"no lab named '{lab}' is up (no state and no namespace {NETNS_DIR}/{prefix}*); "
                "start one with `l4lab up`"
            ) from None
        return {ns[len(prefix):]: ns for ns in found}
    topo = topology.load(Path(state.topology_path))
    return {n.name: netns_name(lab, n.name) for n in topo.netns_nodes()}  # a VM node has no namespace here


def _interfaces(netns: str) -> dict[int, str]:
    """{ifindex: name} inside `netns` ({} when the namespace is gone)."""
    try:
        with entered(netns):
            return dict(socket.if_nameindex())
    except OSError:
        return {}


@dataclass(frozen=True)
class Count:
    """One counted cause in one node: kind (see KINDS), interface, what (action, errno or reason)."""

    kind: str
    ifname: str
    what: str
    events: int
    packets: int


@dataclass(frozen=True)
class NodeReport:
    """Everything counted in one node's namespace."""

    node: str
    netns: str
    counts: tuple[Count, ...] = ()

    def _table(self, kind: str, field_name: str) -> dict[tuple[str, str], int]:
        return {(c.ifname, c.what): getattr(c, field_name) for c in self.counts if c.kind == kind}

    def xdp_exceptions(self) -> dict[tuple[str, str], int]:
        """{(interface, XDP action): times}."""
        return self._table("xdp_exception", "events")

    def bulk_tx_errors(self) -> dict[tuple[str, str], int]:
        """{(interface, errno name or "drops"): frames dropped} of failed XDP bulk transmits."""
        return self._table("bulk_tx_error", "packets")

    def redirect_errors(self) -> dict[tuple[str, str], int]:
        """{(target interface, errno name or "drops"): frames} of failed redirects and devmap transmits."""
        return self._table("redirect_error", "packets")

    def drops(self) -> dict[tuple[str, str], int]:
        """{(interface, drop reason without SKB_DROP_REASON_): packets}."""
        return self._table("kfree_skb", "events")


@dataclass(frozen=True)
class TraceReport:
    """What a tracer saw in a lab, node by node (nodes with nothing counted included)."""

    lab: str
    nodes: tuple[NodeReport, ...] = field(default_factory=tuple)

    def node(self, name: str) -> NodeReport:
        for report in self.nodes:
            if report.node == name:
                return report
        raise UsageError(f"the trace of lab '{self.lab}' has no node '{name}' "
                         f"(nodes: {', '.join(n.node for n in self.nodes)})")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        lines = [f"trace of lab '{self.lab}'"]
        for node in self.nodes:
            if not node.counts:
                lines.append(f"  {node.node}: nothing dropped")
                continue
            lines.append(f"  {node.node}:")
            for c in sorted(node.counts, key=lambda c: (KINDS.index(c.kind), c.ifname, -c.events)):
                detail = f" ({c.packets} frames)" if c.kind in ("bulk_tx_error", "redirect_error") else ""
                lines.append(f"    {c.kind:<14} {c.ifname:<15} {c.what:<28} {c.events}{detail}")
        return "\n".join(lines)


@functools.cache
def kernel_layout() -> tuple[dict[int, str], dict[str, int]]:
    """The running kernel's drop-reason names and the program's defines (member offsets from its BTF,
    the kinds), read once per process: the kernel cannot change under it, and reading its BTF
    (bpftool's dump of every kernel type, as JSON) is most of a tracer's start-up."""
    btf = KernelBtf()
    reasons = btf.enum("skb_drop_reason")
    defines = {
        "OFF_SKB_DEV": btf.offset("sk_buff", "dev"),
        "OFF_SKB_SK": btf.offset("sk_buff", "sk"),
        "OFF_SKB_IIF": btf.offset("sk_buff", "skb_iif"),
        "OFF_DEV_NET": btf.offset("net_device", "nd_net.net"),
        "OFF_DEV_IFINDEX": btf.offset("net_device", "ifindex"),
        "OFF_NET_INUM": btf.offset("net", "ns.inum"),
        "OFF_SK_NET": btf.offset("sock", "__sk_common.skc_net.net"),
        "KIND_EXCEPTION": _KIND_EXCEPTION,
        "KIND_BULK_TX": _KIND_BULK_TX,
        "KIND_KFREE_SKB": _KIND_KFREE_SKB,
        "KIND_REDIRECT": _KIND_REDIRECT,
        "FIRST_DROP_REASON": _FIRST_DROP_REASON,
    }
    return reasons, defines


class Tracer:
    """Counts XDP exceptions, bulk-TX errors and drop reasons in a lab's nodes while it is open."""

    def __init__(self, lab: str, nodes: Sequence[str] | None = None) -> None:
        self.lab = lab
        known = lab_nodes(lab)
        if nodes:
            unknown = [n for n in nodes if n not in known]
            if unknown:
                raise UsageError(
                    f"lab '{lab}' has no node {', '.join(repr(n) for n in unknown)} "
                    f"(nodes: {', '.join(known)})"
                )
            known = {n: known[n] for n in nodes}
        self.nodes = known
        self._bpf: Any = None
        self._inum: dict[int, str] = {}
        self._ifnames: dict[str, dict[int, str]] = {}
        self._reasons: dict[int, str] = {}

    def __enter__(self) -> Tracer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Compile and attach the program; count from now on."""
        _bcc()
        for node, ns in self.nodes.items():
            try:
                self._inum[os.stat(NETNS_DIR / ns).st_ino] = node
            except FileNotFoundError as exc:
                raise LabNotFoundError(f"node '{node}' of lab '{self.lab}' has no namespace {NETNS_DIR / ns}") from exc
            self._ifnames[node] = _interfaces(ns)
        self._reasons, defines = kernel_layout()
        cflags = [f"-D{k}={v}" for k, v in defines.items()]
        try:
            self._bpf = compile_bcc(_PROGRAM.encode(), cflags)
        except Exception as exc:  # noqa: BLE001 - BCC raises bare Exception on compile/load failures
            raise LabError(
                f"the tracer's BPF program did not compile or load: {exc}; "
                f"check the kernel headers ({kernel_headers() or kernel_build_dir() / 'build'}; run `{SETUP_HINT}`)"
            ) from exc
        watched = self._bpf[b"watched"]
        for inum in self._inum:
            watched[watched.Key(inum)] = watched.Leaf(1)

    def stop(self) -> None:
        """Detach the program (the counts read so far stay with the caller's reports)."""
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def clear(self) -> None:
        """Forget what was counted so far."""
        self._require_started().get_table(b"counts").clear()

    def _require_started(self) -> Any:
        if self._bpf is None:
            raise LabError(f"the tracer of lab '{self.lab}' is not running: use `with Tracer(...)` or start()")
        return self._bpf

    def _ifname(self, node: str, ifindex: int) -> str:
        if ifindex == 0:
            return "-"
        names = self._ifnames.setdefault(node, {})
        if ifindex not in names:
            names.update(_interfaces(self.nodes[node]))
        return names.get(ifindex, f"ifindex {ifindex}")

    def _what(self, kind: int, code: int) -> str:
        if kind == _KIND_EXCEPTION:
            return XDP_ACTIONS.get(code, f"action {code}")
        if kind in (_KIND_BULK_TX, _KIND_REDIRECT):
            return errno.errorcode.get(code, f"errno {code}") if code else "drops"
        name = self._reasons.get(code, f"reason {code}")
        return name.removeprefix(_DROP_PREFIX)

    def report(self) -> TraceReport:
        """What was counted since start (or the last clear), per node."""
        table = self._require_started().get_table(b"counts")
        per_node: dict[str, list[Count]] = {node: [] for node in self.nodes}
        for key, val in table.items():
            node = self._inum.get(key.inum)
            if node is None:
                continue
            per_node[node].append(
                Count(KINDS[key.kind], self._ifname(node, key.ifindex), self._what(key.kind, key.code),
                      int(val.events), int(val.packets))
            )
        return TraceReport(
            self.lab,
            tuple(NodeReport(node, self.nodes[node], tuple(per_node[node])) for node in self.nodes),
        )
