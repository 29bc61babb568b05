"""datapath.py: the loaded balancer and decap programs, and typed access to their maps.

`Datapath` owns one loaded balancer object: load-time settings go into `.rodata` and map sizes,
the session table is sized per possible CPU, then VIPs, reals, rings,
settings and counters are read and written through the generated `_abi` structures (their bytes:
balancer/maplayout.py); it can pin its maps and links under a bpffs directory and be reopened from
it by a later process (`Datapath.open_pinned`). Writes that must land together or not at all go
through a Transaction (balancer/transaction.py); the reals' decap program is balancer/decap.py's.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno as _errno
import ipaddress
import re
import shutil
import socket
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from balancer import _abi, kclock, objects
from balancer.btf import read_contract
from balancer.egress import Egress
from balancer.errors import AbiMismatchError, DatapathError
from balancer.libbpf import (
    BpfObject,
    Link,
    Map,
    Program,
    RunResult,
    lib,
    map_from_pin,
    num_possible_cpus,
    wait_for_bpf_programs,
)
from balancer.maplayout import (
    META_WORDS,
    SESS4_KEY_WORDS,
    SESS4_OVERFLOW,
    SESS4_PROTO,
    SESS4_SESSION_WORDS,
    SESS4_SESSIONS_AT,
    SESS4_SET_WORDS,
    SESS4_TAG_WORD,
    SESSION_SETS,
    SESSION_TABLES,
    SLOT_SHARED,
    proto_number,
    real_entry,
    sess4_held,
    sess4_valid,
    session_flow,
    session_sets,
    settings_bytes,
    slot_family,
    vip_entry,
    vip_index_from,
    vip_key,
    vip_slot,
    words_addr,
)
from balancer.transaction import Transaction

Encap = _abi.Encap
Reason = _abi.Reason
Event = _abi.Event
VipFlag = _abi.VipFlag

XDP_ACTIONS = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}
PROGRAMS = ("balancer_xdp", "balancer_xdp_frags")
BALANCER_MAPS = _abi.MAPS["balancer"]  # every map the object defines, read from its BTF by abigen
DECAP_MAPS = _abi.MAPS["decap"]
# lb_vips holds, per VIP, its own entry and one address-only entry (port 0, proto 0) for its address;
# an apply adds the new entries before it removes the old ones, so a config that replaces every VIP
# needs twice that for a moment. max_vips counts VIPs (VIP numbers, rings, VIP counters).
VIP_ENTRIES_PER_VIP = 4
SIZE_HINT = ("the kernel refused the map sizes: lower datapath.lru_size, fallback_size, max_reals or "
             "max_vips × ring_size; or raise the memory cgroup's limit (RLIMIT_MEMLOCK, `ulimit -l`, "
             "on kernels before 5.11)")


def verify_abi(path: str, kind: str = "") -> None:
    """Refuse an object whose BTF contract differs from the generated balancer/_abi.py; kind names
    the object's contract ("balancer"), else its file name does (a renamed build needs kind)."""
    name = kind or Path(path).stem.removesuffix(".bpf")
    want = _abi.DIGESTS.get(name)
    got = read_contract(path).digest()
    if want is None or want != got:
        raise AbiMismatchError(f"load '{path}': its BTF contract ({got}) differs from balancer/_abi.py "
                               f"({want})", 0, "run `make abi` and commit balancer/_abi.py, or `make bpf`")


def patch_rodata(obj: BpfObject, name: str, values: dict[str, int]) -> None:
    table = _abi.RODATA[name]
    image = obj.rodata()
    for var, value in values.items():
        off, size = table[var]
        image[off: off + size] = int(value).to_bytes(size, "little")
    obj.set_rodata(bytes(image))


def _autoload(obj: BpfObject, programs: Sequence[str]) -> None:
    for name in PROGRAMS:
        if name not in programs:
            obj.set_autoload(name, False)


def program_for(frags: bool) -> str:
    """The balancer's program for an LB with (xdp.frags, jumbo frames) or without multi-buffer frames."""
    return PROGRAMS[1] if frags else PROGRAMS[0]


def sets_rodata(sets: int) -> dict[str, int]:
    """The .rodata of the IPv4 session sets (bpf/include/session4.h): their mask, and the shift that takes
    the second set from the top bits of a 32-bit product."""
    return {"cfg_sess4_mask": sets - 1, "cfg_sess4_shift": 32 - (sets - 1).bit_length()}


def _more_rodata(udp_timeout_s: float, katran_max_vips: int, egress: Egress | None) -> dict[str, int]:
    """The .rodata values besides the ring size: UDP idle timeout, the kernel's tick, Katran's MAX_VIPS,
    two-arm's egress."""
    return {"cfg_udp_timeout_ns": int(udp_timeout_s * 1e9), "cfg_katran_max_vips": katran_max_vips,
            **kclock.rodata(), **(egress.rodata() if egress else {})}


# The program arrays that inline decap tail-calls (bpf/include/maps.h), and the program each holds.
PROG_ARRAYS = {"lb_progs": "balancer_xdp", "lb_progs_frags": "balancer_xdp_frags"}


def fill_prog_arrays(maps: dict[str, Map], progs: dict[str, Program]) -> None:
    """Put each loaded balancer program into its own program array (slot 0), for inline decap's tail call."""
    for array, prog in PROG_ARRAYS.items():
        if prog in progs:
            maps[array].update(b"\0" * 4, progs[prog].fd.to_bytes(4, "little"))


def sum_counters(m: Map, index: int) -> tuple[int, int]:
    vals = m.lookup_percpu(index.to_bytes(4, "little")) or []
    packets = sum(_abi.Counter.from_buffer_copy(v).packets for v in vals)
    nbytes = sum(_abi.Counter.from_buffer_copy(v).bytes for v in vals)
    return packets, nbytes


def _sess4_ways(table: Map, words: memoryview, quads: memoryview
                ) -> Iterator[tuple[int, tuple[int, int, int], int, _abi.Session]]:
    """The ways of the IPv4 sets (bpf/include/session4.h) that hold a session (maplayout.sess4_valid):
    (the tag's word index, the key's src, dst and ports, the tag, the session). Each way is read as the
    datapath reads one, through the map's memory in aligned 4- and 8-byte loads: the tag, the key and
    the session, the tag again; a way whose tag moved meanwhile (a writer there) is left out."""
    sets, ways = np.nonzero(sess4_held(table.mmap_words()))  # the candidates, from one read of the checks
    for s, w in zip(map(int, sets), map(int, ways), strict=True):
        key_at = s * SESS4_SET_WORDS + w * SESS4_KEY_WORDS
        sess_at = s * SESS4_SET_WORDS + SESS4_SESSIONS_AT + w * SESS4_SESSION_WORDS
        tag_at = key_at + SESS4_TAG_WORD
        tag = words[tag_at]
        src, dst, ports = words[key_at], words[key_at + 1], words[key_at + 2]
        real_id, hash32, atime_ns = words[sess_at], words[sess_at + 1], quads[(sess_at + 2) // 2]
        if (words[tag_at] ^ tag) & ~SESS4_OVERFLOW or not sess4_valid(src, dst, ports, tag, real_id, hash32):
            continue
        yield tag_at, (src, dst, ports), tag, _abi.Session(real_id=real_id, hash=hash32, atime_ns=atime_ns)


def _sess4_empty(words: memoryview, tag_at: int, tag: int) -> int:
    """Empties the IPv4 sets' way whose tag is words[tag_at], if it still holds `tag` (its overflow bit
    aside): one aligned 4-byte store of the tag alone, its check and protocol 0 (no lookup matches an
    empty way), way 0's overflow bit as it is now. Returns 1 if emptied, 0 if a writer took the way since.
    (A writer setting the overflow bit between the read and the store loses it: a plain store is what
    Python has.)"""
    now = words[tag_at]
    if (now ^ tag) & ~SESS4_OVERFLOW:
        return 0
    words[tag_at] = now & SESS4_OVERFLOW
    return 1


class Datapath:
    """One loaded balancer: programs, maps, optional attachment links."""

    def __init__(self, maps: dict[str, Map], programs: dict[str, Program], ring_size: int,
                 obj: BpfObject | None = None) -> None:
        self.maps = maps
        self.programs = programs
        self.ring_size = ring_size
        self.links: list[Link] = []
        self._obj = obj
        self._ring_view: npt.NDArray[np.uint32] | None = None
        self._index_view: npt.NDArray[np.uint32] | None = None

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def load(cls, obj_path: str = "balancer.o", *, max_vips: int = _abi.Limits.DEFAULT_MAX_VIPS,
             max_reals: int = _abi.Limits.DEFAULT_MAX_REALS, ring_size: int = _abi.Limits.DEFAULT_RING_SIZE,
             lru_size: int = _abi.Limits.DEFAULT_LRU_SIZE, fallback_size: int | None = None,
             udp_timeout_s: float = _abi.Limits.DEFAULT_UDP_TIMEOUT_S,
             katran_max_vips: int = _abi.Limits.DEFAULT_KATRAN_MAX_VIPS, egress: Egress | None = None,
             programs: Sequence[str] = PROGRAMS) -> Datapath:
        """Load the balancer: `lru_size` session entries per possible CPU in each session table (IPv4
        flows, IPv6 flows), each one table for every CPU; two-arm when `egress` is given (balancer/egress.py);
        only the `programs` named (an LB attaches one: the verifier's walk of the other costs as much).

        `fallback_size` is accepted and ignored: the session table has no per-CPU slots left empty,
        so there is no shared fallback table any more (configs that set it still load).
        """
        obj_path = objects.find(obj_path)
        verify_abi(obj_path, "balancer")
        obj = BpfObject(obj_path)
        try:
            entries = lru_size * min(num_possible_cpus(), _abi.Limits.MAX_CPUS)
            sets = session_sets(entries)
            patch_rodata(obj, "balancer", {"cfg_ring_size": ring_size, **sets_rodata(sets),
                                            **_more_rodata(udp_timeout_s, katran_max_vips, egress)})
            obj.set_max_entries(SESSION_SETS, sets)
            obj.set_max_entries("lb_vips", max_vips * VIP_ENTRIES_PER_VIP)
            obj.set_max_entries("lb_vip_stats", max_vips)
            obj.set_max_entries("lb_reals", max_reals)
            obj.set_max_entries("lb_real_stats", max_reals)
            obj.set_max_entries("lb_ring", max_vips * ring_size)
            obj.set_max_entries("lb_vip_cidrs", max_vips * VIP_ENTRIES_PER_VIP)
            obj.set_max_entries("lb_server_ids", max_reals)
            for table in SESSION_TABLES:
                obj.set_max_entries(table, entries)
            _autoload(obj, programs)
            obj.load()
            maps = {n: obj.map(n) for n in BALANCER_MAPS}
            progs = {n: obj.program(n) for n in programs}
            fill_prog_arrays(maps, progs)
            if egress:
                for devmap in ("lb_egress", "lb_egress_frags"):
                    maps[devmap].update(b"\0" * 4, egress.ifindex.to_bytes(4, "little"))
            return cls(maps, progs, ring_size, obj)
        except DatapathError as exc:
            obj.close()
            if exc.errno in (_errno.E2BIG, _errno.ENOMEM):
                named = re.search(r"map '(\w+)': failed to create", exc.hint)  # libbpf's log names the map
                what = f"{exc.what} (map '{named.group(1)}')" if named else exc.what
                raise DatapathError(what, exc.errno, SIZE_HINT) from exc
            raise
        except BaseException:
            obj.close()
            raise

    @classmethod
    def load_reusing(cls, obj_path: str, running: Datapath, udp_timeout_s: float,
                     katran_max_vips: int = _abi.Limits.DEFAULT_KATRAN_MAX_VIPS, egress: Egress | None = None,
                     programs: Sequence[str] = PROGRAMS) -> Datapath:
        """Load obj_path (its `programs`) on top of running's maps (sessions, rings, counters, lb_egress kept)."""
        obj_path = objects.find(obj_path)
        verify_abi(obj_path, "balancer")
        obj = BpfObject(obj_path)
        try:
            patch_rodata(obj, "balancer", {"cfg_ring_size": running.ring_size,
                                            **sets_rodata(running.maps[SESSION_SETS].max_entries),
                                            **_more_rodata(udp_timeout_s, katran_max_vips, egress)})
            for name, m in running.maps.items():
                obj.reuse_map(name, m.fd)
            _autoload(obj, programs)
            obj.load()
            maps = {n: obj.map(n) for n in BALANCER_MAPS}
            progs = {n: obj.program(n) for n in programs}
            fill_prog_arrays(maps, progs)  # inline decap's tail calls go to the new program from now on
            return cls(maps, progs, running.ring_size, obj)
        except BaseException:
            obj.close()
            raise

    @property
    def session_tables(self) -> list[Map]:
        """The session tables (IPv4 flows' sets, then the IPv6 flows' LRU hash; each shared by every CPU)."""
        return [self.maps[SESSION_SETS], *(self.maps[n] for n in SESSION_TABLES)]

    def sessions(self) -> Iterator[tuple[str, bytes, _abi.Flow, _abi.Session]]:
        """Every session: (its table, its key there as session_key gives it, the flow, the session); the
        IPv4 sets' first, then the IPv6 LRU's."""
        for table, key, flow, sess, _ in self._sessions():
            yield table, key, flow, sess

    def _sessions(self) -> Iterator[tuple[str, bytes, _abi.Flow, _abi.Session, tuple[int, int] | None]]:
        """sessions(), each with where an IPv4 one's way is: (its tag's index among the sets' 32-bit
        words, the tag as read), None for an LRU's."""
        with self.maps[SESSION_SETS].mmap_view("I") as words, self.maps[SESSION_SETS].mmap_view("Q") as quads:
            for tag_at, words3, tag, sess in _sess4_ways(self.maps[SESSION_SETS], words, quads):
                key = struct.pack("<4I", *words3, tag & SESS4_PROTO)
                yield SESSION_SETS, key, session_flow(SESSION_SETS, key), sess, (tag_at, tag)
        for table in SESSION_TABLES:
            for key, value in self.maps[table].items():
                yield table, key, session_flow(table, key), _abi.Session.from_buffer_copy(value), None

    def flush_sessions(self, address: str, port: int, proto: str | int, real_id: int) -> int:
        """Delete the sessions of a VIP (port 0: every port; `address` may be a prefix VIP's prefix) that
        point at real_id, in every table: an IPv4 one's way emptied in place (its tag's check and
        protocol zeroed, way 0's overflow bit kept), an IPv6 one deleted from the LRU.

        Used when a real leaves a VIP, so that its flows re-hash at once (and fail fast at the
        real they now reach) whether or not the real still serves other VIPs. Returns the count.
        """
        net = ipaddress.ip_network(address, strict=False)
        fam = _abi.Family.INET if net.version == 4 else _abi.Family.INET6
        pnum, nport = proto_number(proto), socket.htons(port)
        doomed = [(table, key, way) for table, key, flow, sess, way in self._sessions()
                  if sess.real_id == real_id and flow.family == fam and flow.proto == pnum and
                  (port == 0 or flow.dport == nport) and
                  ipaddress.ip_address(bytes(flow.dst)[:4 if net.version == 4 else 16]) in net]
        removed = 0
        with self.maps[SESSION_SETS].mmap_view("I") as words:
            for table, key, way in doomed:
                if way is None:
                    removed += self.maps[table].delete(key)
                else:
                    removed += _sess4_empty(words, *way)
        return removed

    @classmethod
    def open_pinned(cls, pin_dir: str) -> Datapath:
        """Reopen a datapath that an earlier process loaded and pinned (maps and links)."""
        d = Path(pin_dir)
        if not (d / "lb_vips").exists():
            raise DatapathError(f"find a loaded balancer under {pin_dir}", _errno.ENOENT,
                                "run `lbctl load --interface IF` first")
        missing = [n for n in BALANCER_MAPS if not (d / n).exists()]
        if missing:
            unknown = sorted(p.name for p in d.iterdir() if p.name not in BALANCER_MAPS
                             and not p.name.startswith("link_"))
            raise AbiMismatchError(
                f"open the balancer pinned under {pin_dir}: it has no {', '.join(missing)}"
                + (f" and has {', '.join(unknown)}, which this lbctl does not know" if unknown else ""),
                _errno.EPROTO, "another version of the datapath loaded it"
                # The one map change so far; its name tells an operator which upgrade this is.
                + (" (IPv4 sessions moved from lb_sessions4 to lb_sess4_sets, architecture.md)"
                   if "lb_sessions4" in unknown else "")
                + "; manage it with the lbctl that loaded it, or `lbctl unload` and `lbctl load` it again "
                "(its sessions are lost)")
        maps = {n: map_from_pin(str(d / n)) for n in BALANCER_MAPS}
        ring_size = maps["lb_ring"].max_entries // max(1, maps["lb_vip_stats"].max_entries)
        dp = cls(maps, {}, ring_size)
        dp.links = [Link.from_pin(str(p)) for p in sorted(d.glob("link_*"))]
        return dp

    def pin(self, pin_dir: str, *, exclusive: bool = False) -> None:
        """Pin every map under pin_dir; exclusive: refuse a directory that exists already.

        On failure it removes what it pinned (and the directory, if it made it), nothing else.
        """
        d = Path(pin_dir)
        try:
            d.parent.mkdir(parents=True, exist_ok=True)
            d.mkdir()
            created = True
        except FileExistsError:
            if exclusive:
                raise DatapathError(f"pin the balancer under {pin_dir}", _errno.EEXIST,
                                    "another datapath is pinned there; `lbctl unload` it first") from None
            created = False
        except OSError as exc:
            raise DatapathError(f"create the pin directory {pin_dir}", exc.errno or _errno.EIO,
                                "is bpffs mounted at /sys/fs/bpf?") from exc
        made: list[Path] = []
        try:
            for name, m in self.maps.items():
                if not (d / name).exists():
                    m.pin(str(d / name))
                    made.append(d / name)
        except BaseException:
            for path in made:
                path.unlink(missing_ok=True)
            if created:
                d.rmdir()
            raise

    @staticmethod
    def unpin(pin_dir: str) -> None:
        """Remove every pin (which detaches pinned links once no process holds them)."""
        d = Path(pin_dir)
        if d.exists():
            for p in d.iterdir():
                p.unlink()
            shutil.rmtree(d, ignore_errors=True)
        # The instances' root (/sys/fs/bpf/lbctl) goes with its last instance: bpffs keeps no empty folders.
        if d.parent != Path("/sys/fs/bpf"):
            with contextlib.suppress(OSError):
                d.parent.rmdir()

    def close(self) -> None:
        self._ring_view = self._index_view = None  # before the maps' mappings are closed
        for link in self.links:
            link.close()
        for m in self.maps.values():
            m.close()
        if self._obj is not None:
            self._obj.close()
            self._obj = None

    def __enter__(self) -> Datapath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- attachment ---------------------------------------------------------------------------

    def attach(self, ifname: str, mode: str = "native", frags: bool = False) -> Link:
        prog = self.programs[program_for(frags)]
        ifindex = socket.if_nametoindex(ifname) if ifname else 0
        link = prog.attach_xdp(ifindex, mode, ifname)
        self.links.append(link)
        return link

    # -- settings, VIPs, reals, rings --------------------------------------------------------

    @property
    def vip_capacity(self) -> int:
        """How many VIP numbers the loaded maps hold (datapath.max_vips at load)."""
        return self.maps["lb_vip_stats"].max_entries

    @property
    def real_capacity(self) -> int:
        """How many real ids the loaded maps hold, id 0 (no real) included (datapath.max_reals)."""
        return self.maps["lb_reals"].max_entries

    @contextmanager
    def transaction(self, *, crash_after_slots: int | None = None) -> Iterator[Transaction]:
        """Writes that all happen or, should one fail or the block raise, are all undone.

        ``with dp.transaction() as tx: tx.put_real(1, "192.0.2.1"); tx.put_vip(...)``. Writes land
        in the order they are made (the caller orders them so that the datapath serves a consistent
        state throughout); on an exception every replaced value is restored, newest first, and the
        exception goes on. ``crash_after_slots`` is a test hook (see Transaction).
        """
        self.sync_vip_index()  # derived from lb_vips: repairs what a controller killed between the two left
        tx = Transaction(self, crash_after_slots=crash_after_slots)
        try:
            yield tx
        except BaseException:
            tx.rollback()
            raise

    def set_settings(self, **kwargs: Any) -> None:
        """Write the runtime settings (see settings_bytes for the arguments)."""
        self.maps["lb_settings"].update(b"\0" * 4, settings_bytes(**kwargs))

    def put_entry(self, entry: tuple[str, bytes, bytes]) -> None:
        """Write one (map, key, value) entry (balancer/routes.py builds them)."""
        name, key, value = entry
        self.maps[name].update(key, value)

    def delete_entry(self, name: str, key: bytes) -> bool:
        return self.maps[name].delete(key)

    def settings(self) -> _abi.Settings:
        raw = self.maps["lb_settings"].lookup(b"\0" * 4) or b"\0" * ctypes.sizeof(_abi.Settings)
        return _abi.Settings.from_buffer_copy(raw)

    def put_vip(self, address: str, port: int, proto: str | int, *, vip_num: int, flags: int = 0,
                encap: int = Encap.IPIP) -> None:
        key, meta = vip_entry(address, port, proto, vip_num, flags, encap)
        self.maps["lb_vips"].update(key, meta)
        self.sync_vip_index()  # after lb_vips: a reader sent there by a SHARED slot finds the entry

    def del_vip(self, address: str, port: int, proto: str | int) -> bool:
        key = vip_key(address, port, proto)
        self.unpublish_vips([key])  # first: no reader may find the key in the index once it leaves lb_vips
        gone = self.maps["lb_vips"].delete(key)
        self.sync_vip_index()
        return gone

    # lb_vip_index: a direct-mapped copy of lb_vips (struct lb_vip_slot), written as plain memory. The
    # program reads a slot's last word (port/proto/family) first, then the address and meta; x86 makes
    # stores visible in program order. So a key is published by writing meta and address before that
    # word, and a slot that readers may match is first unpublished (its last word set SHARED: readers
    # go to lb_vips, which the caller has brought up to date) and its old content left alone until
    # every program run that may have matched it has finished: an XDP run cannot sleep, but a test run
    # (or softirq on PREEMPT_RT) can be preempted, so not a fixed pause but the kernel's own wait for
    # running programs (wait_for_bpf_programs, an RCU grace period, ~5-20 ms); only then is the slot
    # rewritten. One wait per sync, and none for a key published into an empty or SHARED slot.

    def vip_index(self) -> npt.NDArray[np.uint32]:
        """lb_vip_index as (INDEX_SLOTS, SLOT_WORDS) words over the map's memory, mapped on first use."""
        if self._index_view is None:
            self._index_view = self.maps["lb_vip_index"].mmap_words()
        return self._index_view

    def unpublish_vips(self, keys: Sequence[bytes]) -> None:
        """Send readers of these keys' slots to lb_vips (SHARED), and wait out those that matched before."""
        self._unpublish_slots({vip_slot(k) for k in keys})

    def _unpublish_slots(self, slots: set[int] | Sequence[int]) -> None:
        view = self.vip_index()
        empty, shared = int(_abi.VipSlotState.EMPTY), int(_abi.VipSlotState.SHARED)
        single = sorted(int(i) for i in slots if slot_family(view[i, -1]) not in (empty, shared))
        if single:
            view[single, -1] = SLOT_SHARED
            wait_for_bpf_programs()

    def sync_vip_index(self) -> int:
        """Make lb_vip_index exactly what lb_vips says, writing only the slots that differ, in an order
        no concurrent reader misreads (see above). Returns how many slots changed."""
        vips = self.maps["lb_vips"]
        keys, metas = vips.lookup_batch(None, vips.max_entries)
        want = vip_index_from(list(zip(keys, metas, strict=True)))
        view = self.vip_index()
        changed = np.flatnonzero((view != want).any(axis=1))
        if not changed.size:
            return 0
        self._unpublish_slots([int(i) for i in changed])
        for i in changed:  # each slot is EMPTY or SHARED now: readers touch none of its words but the last
            view[i, :META_WORDS] = want[i, :META_WORDS]
            view[i, META_WORDS:-1] = want[i, META_WORDS:-1]
            view[i, -1] = want[i, -1]
        return int(changed.size)

    def vips(self) -> dict[tuple[str, int, int], _abi.VipMeta]:
        out = {}
        for k, v in self.maps["lb_vips"].items():
            key = _abi.VipKey.from_buffer_copy(k)
            addr = words_addr(bytes(key.addr), key.family)
            out[(addr, socket.ntohs(key.port), key.proto)] = _abi.VipMeta.from_buffer_copy(v)
        return out

    def put_real(self, real_id: int, address: str, flags: int = _abi.RealFlag.PRESENT) -> None:
        self.maps["lb_reals"].update(*real_entry(real_id, address, flags))

    def del_real(self, real_id: int) -> None:
        self.maps["lb_reals"].update(real_id.to_bytes(4, "little"), bytes(_abi.Real()))

    def real(self, real_id: int) -> tuple[str, int] | None:
        raw = self.maps["lb_reals"].lookup(real_id.to_bytes(4, "little"))
        if raw is None:
            return None
        r = _abi.Real.from_buffer_copy(raw)
        if not r.flags & _abi.RealFlag.PRESENT:
            return None
        return words_addr(bytes(r.addr), r.family), r.flags

    def write_ring(self, vip_num: int, ring: Sequence[int]) -> None:
        """Write a whole ring (ring_size real ids)."""
        self.write_ring_slots(vip_num, range(len(ring)), ring)

    def write_ring_slots(self, vip_num: int, slots: Sequence[int] | npt.NDArray[Any],
                         ids: Sequence[int] | npt.NDArray[Any]) -> None:
        """Write only the given slots of a VIP's ring (the diff of a change): stores into the mapped map."""
        if len(slots) == 0:
            return
        base = vip_num * self.ring_size
        view = self._rings()[base:base + self.ring_size]
        view[np.asarray(slots, dtype=np.int64)] = np.asarray(ids, dtype=np.uint32)

    def ring(self, vip_num: int) -> list[int]:
        """The ring_size real ids of a VIP's ring."""
        return [int(v) for v in self.ring_array(vip_num)]

    def ring_array(self, vip_num: int) -> npt.NDArray[np.uint32]:
        """A copy of the ring_size real ids of a VIP's ring."""
        base = vip_num * self.ring_size
        return np.array(self._rings()[base:base + self.ring_size], dtype=np.uint32)

    def _rings(self) -> npt.NDArray[np.uint32]:
        """lb_ring as an array over the map's memory (BPF_F_MMAPABLE), mapped on first use."""
        if self._ring_view is None:
            self._ring_view = self.maps["lb_ring"].mmap_u32()
        return self._ring_view

    # -- counters -----------------------------------------------------------------------------

    def _counts(self) -> list[_abi.Counts]:
        """This datapath's lb_counts record, one per possible CPU."""
        vals = self.maps["lb_counts"].lookup_percpu(b"\0" * 4) or []
        return [_abi.Counts.from_buffer_copy(v[:ctypes.sizeof(_abi.Counts)]) for v in vals]

    def reasons(self) -> dict[str, int]:
        return {name: packets for name, (packets, _) in self.reason_counters().items()}

    def reason_counters(self) -> dict[str, tuple[int, int]]:
        per_cpu = self._counts()
        return {r.name: (sum(c.reasons[r.value].packets for c in per_cpu),
                         sum(c.reasons[r.value].bytes for c in per_cpu))
                for r in Reason if r.name != "REASON_COUNT"}

    def events(self) -> dict[str, int]:
        per_cpu = self._counts()
        return {e.name: sum(c.events[e.value] for c in per_cpu) for e in Event if not e.name.endswith("COUNT")}

    def vip_stats(self, vip_num: int) -> tuple[int, int]:
        return sum_counters(self.maps["lb_vip_stats"], vip_num)

    def real_stats(self, real_id: int) -> tuple[int, int]:
        return sum_counters(self.maps["lb_real_stats"], real_id)

    # -- test runs ----------------------------------------------------------------------------

    def run(self, frame: bytes, frags: bool = False) -> tuple[int, bytes]:
        """One BPF_PROG_TEST_RUN of the balancer on frame: (XDP action, output frame)."""
        res = self.run_result(frame, frags=frags)
        return res.retval, res.data

    def run_result(self, frame: bytes, repeat: int = 1, frags: bool = False) -> RunResult:
        prog = self.programs[program_for(frags)]
        return prog.test_run(frame, repeat=repeat)


def xdp_link_ifindex(link: Link) -> int:
    """The ifindex an XDP link is attached to now; 0 once its interface is gone (the link is detached).

    struct bpf_link_info: type, id and prog_id (3 × u32), then, 8-byte aligned, the union whose
    xdp member starts with the ifindex (u32)."""

    info = ctypes.create_string_buffer(64)
    size = ctypes.c_uint32(64)
    if lib().bpf_obj_get_info_by_fd(link.fd, info, ctypes.byref(size)) != 0:
        return 0
    return int.from_bytes(info.raw[16:20], "little")

