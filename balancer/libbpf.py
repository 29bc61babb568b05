"""libbpf.py: a thin, typed ctypes binding over the system's libbpf (libbpf.so.1).

It covers what l4lab needs and nothing more: open and load an object, set `.rodata` and map sizes
before load, map operations (single, per-CPU and batched), maps created at run time (the inner
session tables), program test runs (including XDP live frames), XDP and TCX attachment through BPF
links, tracepoint attachment, pinning. Every failure raises `DatapathError` naming the object, map,
program or interface and the errno.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import errno as _errno
import mmap
import os
import struct
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

import numpy as np
import numpy.typing as npt

from balancer.errors import DatapathError

# Kernel UAPI values (include/uapi/linux/bpf.h, if_link.h); Debian 12's headers predate TCX.
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2
BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1
XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2


class MapType(IntEnum):
    HASH = 1
    ARRAY = 2
    PROG_ARRAY = 3
    PERCPU_HASH = 5
    PERCPU_ARRAY = 6
    LRU_HASH = 9
    LRU_PERCPU_HASH = 10
    LPM_TRIE = 11
    ARRAY_OF_MAPS = 12
    HASH_OF_MAPS = 13
    DEVMAP = 14


class AttachType(IntEnum):
    XDP = 37
    TCX_INGRESS = 46
    TCX_EGRESS = 47


_PERCPU_TYPES = {MapType.PERCPU_HASH, MapType.PERCPU_ARRAY, MapType.LRU_PERCPU_HASH}


class _MapCreateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("btf_fd", ctypes.c_uint32), ("btf_key_type_id", ctypes.c_uint32),
                ("btf_value_type_id", ctypes.c_uint32), ("btf_vmlinux_value_type_id", ctypes.c_uint32),
                ("inner_map_fd", ctypes.c_uint32), ("map_flags", ctypes.c_uint32), ("map_extra", ctypes.c_uint64),
                ("numa_node", ctypes.c_uint32), ("map_ifindex", ctypes.c_uint32)]


class _BatchOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class _LinkCreateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32), ("iter_info", ctypes.c_void_p),
                ("iter_info_len", ctypes.c_uint32), ("target_btf_id", ctypes.c_uint32),
                ("union", ctypes.c_uint8 * 40)]


class _LinkUpdateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32), ("old_prog_fd", ctypes.c_uint32)]


class _TestRunOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32), ("ctx_in", ctypes.c_void_p),
                ("ctx_out", ctypes.c_void_p), ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]


def _load_library() -> ctypes.CDLL:
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise DatapathError(f"load the system libbpf ({name})", _errno.ENOENT,
                            "install libbpf1 (make deps)") from exc
    vp, i, u32, u64, cp, sz = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64,
                               ctypes.c_char_p, ctypes.c_size_t)
    signatures: dict[str, tuple[type | None, list[type]]] = {
        "bpf_object__open_file": (vp, [cp, vp]),
        "bpf_object__load": (i, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__find_map_by_name": (vp, [vp, cp]),
        "bpf_object__find_program_by_name": (vp, [vp, cp]),
        "bpf_map__set_max_entries": (i, [vp, u32]),
        "bpf_map__max_entries": (u32, [vp]),
        "bpf_map__fd": (i, [vp]),
        "bpf_map__reuse_fd": (i, [vp, i]),
        "bpf_map__type": (i, [vp]),
        "bpf_map__key_size": (u32, [vp]),
        "bpf_map__value_size": (u32, [vp]),
        "bpf_map__initial_value": (vp, [vp, ctypes.POINTER(sz)]),
        "bpf_map__set_initial_value": (i, [vp, vp, sz]),
        "bpf_program__fd": (i, [vp]),
        "bpf_program__set_autoload": (i, [vp, ctypes.c_bool]),
        "bpf_map_create": (i, [i, cp, u32, u32, u32, vp]),
        "bpf_map_update_elem": (i, [i, vp, vp, u64]),
        "bpf_map_lookup_elem": (i, [i, vp, vp]),
        "bpf_map_delete_elem": (i, [i, vp]),
        "bpf_map_get_next_key": (i, [i, vp, vp]),
        "bpf_map_update_batch": (i, [i, vp, vp, ctypes.POINTER(u32), vp]),
        "bpf_map_lookup_batch": (i, [i, vp, vp, vp, vp, ctypes.POINTER(u32), vp]),
        "bpf_map_delete_batch": (i, [i, vp, ctypes.POINTER(u32), vp]),
        "bpf_obj_pin": (i, [i, cp]),
        "bpf_obj_get": (i, [cp]),
        "bpf_obj_get_info_by_fd": (i, [i, vp, ctypes.POINTER(u32)]),
        "bpf_link_create": (i, [i, i, i, vp]),
        "bpf_link_update": (i, [i, i, vp]),
        "bpf_link_detach": (i, [i]),
        "bpf_program__attach_tracepoint": (vp, [vp, cp, cp]),
        "bpf_link__destroy": (i, [vp]),
        "bpf_prog_test_run_opts": (i, [i, vp]),
        "libbpf_num_possible_cpus": (i, []),
    }
    for fname, (res, args) in signatures.items():
        fn = getattr(lib, fname)
        fn.restype = res
        fn.argtypes = args
    return lib


_lib: ctypes.CDLL | None = None
_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_log: collections.deque[str] = collections.deque(maxlen=400)


_PRINT_BUF_BYTES = 16 << 20  # libbpf hands the whole verifier log (up to 16 MiB) to one print call
_print_buf: ctypes.Array[ctypes.c_char] | None = None


def _on_print(level: int, fmt: bytes, args: int) -> int:
    """libbpf's messages (the verifier log among them) go to a buffer, not to stderr. The log comes
    in one message, its reason last: a smaller buffer kept its start and lost the reason."""
    global _print_buf
    if _print_buf is None:
        _print_buf = ctypes.create_string_buffer(_PRINT_BUF_BYTES)
    n = _libc.vsnprintf(_print_buf, _PRINT_BUF_BYTES, fmt, ctypes.c_void_p(args))
    text = _print_buf.raw[:max(0, min(n, _PRINT_BUF_BYTES - 1))].decode(errors="replace")
    _log.extend(text.rstrip("\n").splitlines())
    if os.environ.get("L4LAB_LIBBPF_DEBUG"):
        sys.stderr.write(text)
    return 0


def in_callback(frame: types.FrameType | None) -> bool:
    """Whether `frame` or a caller of it runs in libbpf's print callback, where ctypes prints and drops
    any exception raised (a KeyboardInterrupt from a signal handler among them)."""
    while frame is not None:
        if frame.f_code is _on_print.__code__:
            return True
        frame = frame.f_back
    return False


_libc = ctypes.CDLL(None)
_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
_print_cb = _PRINT_FN(_on_print)


def lib() -> ctypes.CDLL:
    """The loaded libbpf, loaded on first use (modules do no work at import time)."""
    global _lib
    if _lib is None:
        _lib = _load_library()
        _lib.libbpf_set_print.restype = ctypes.c_void_p
        _lib.libbpf_set_print.argtypes = [_PRINT_FN]
        _lib.libbpf_set_print(_print_cb)
    return _lib


def log_tail(lines: int = 12) -> str:
    """The last lines libbpf printed (e.g. why the verifier refused a program)."""
    return "\n".join(list(_log)[-lines:])


def _check(ret: int, what: str, hint: str = "") -> int:
    """libbpf's low-level calls return -errno on failure."""
    if ret < 0:
        raise DatapathError(what, -ret, hint)
    return ret


def _errno_now() -> int:
    return ctypes.get_errno() or _errno.EINVAL


def num_possible_cpus() -> int:
    return _check(lib().libbpf_num_possible_cpus(), "count possible CPUs")


def _buf(data: bytes, size: int, what: str) -> ctypes.Array[ctypes.c_char]:
    if len(data) != size:
        raise DatapathError(f"use a {len(data)}-byte {what}", _errno.EINVAL, f"it must be {size} bytes")
    return ctypes.create_string_buffer(data, size)


class Map:
    """A BPF map by file descriptor; per-CPU maps take and return one value per possible CPU."""

    def __init__(self, fd: int, name: str, map_type: int, key_size: int, value_size: int,
                 max_entries: int, owned: bool = False) -> None:
        self.fd = fd
        self.name = name
        self.type = map_type
        self.key_size = key_size
        self.value_size = value_size
        self.max_entries = max_entries
        self._owned = owned
        self.percpu = map_type in _PERCPU_TYPES
        self._ncpu = num_possible_cpus() if self.percpu else 1
        self._stride = (value_size + 7) // 8 * 8 if self.percpu else value_size
        self._mm: mmap.mmap | None = None

    def _value_len(self) -> int:
        return self._stride * self._ncpu

    def update(self, key: bytes, value: bytes | list[bytes], flags: int = BPF_ANY) -> None:
        k = _buf(key, self.key_size, f"key of map '{self.name}'")
        v = _buf(self._pack(value), self._value_len(), f"value of map '{self.name}'")
        _check(lib().bpf_map_update_elem(self.fd, k, v, flags), f"update map '{self.name}'")

    def _pack(self, value: bytes | list[bytes]) -> bytes:
        if not self.percpu:
            if isinstance(value, list):
                raise DatapathError(f"pass per-CPU values to map '{self.name}'", _errno.EINVAL)
            return value
        values = value if isinstance(value, list) else [value] * self._ncpu
        pad = b"\0" * (self._stride - self.value_size)
        return b"".join(v + pad for v in values)

    def lookup(self, key: bytes) -> bytes | None:
        """The value, or None when absent (for per-CPU maps use lookup_percpu)."""
        raw = self._lookup_raw(key)
        return None if raw is None else raw[: self.value_size]

    def lookup_percpu(self, key: bytes) -> list[bytes] | None:
        raw = self._lookup_raw(key)
        if raw is None:
            return None
        return [raw[i * self._stride: i * self._stride + self.value_size] for i in range(self._ncpu)]

    def _lookup_raw(self, key: bytes) -> bytes | None:
        k = _buf(key, self.key_size, f"key of map '{self.name}'")
        v = ctypes.create_string_buffer(self._value_len())
        ret = lib().bpf_map_lookup_elem(self.fd, k, v)
        if ret == -_errno.ENOENT:
            return None
        _check(ret, f"look up map '{self.name}'")
        return v.raw

    def delete(self, key: bytes) -> bool:
        """Delete key; False when it was not there."""
        k = _buf(key, self.key_size, f"key of map '{self.name}'")
        ret = lib().bpf_map_delete_elem(self.fd, k)
        if ret == -_errno.ENOENT:
            return False
        _check(ret, f"delete from map '{self.name}'")
        return True

    def keys(self) -> Iterator[bytes]:
        cur: ctypes.Array[ctypes.c_char] | None = None
        nxt = ctypes.create_string_buffer(self.key_size)
        while True:
            ret = lib().bpf_map_get_next_key(self.fd, cur, nxt)
            if ret == -_errno.ENOENT:
                return
            _check(ret, f"iterate map '{self.name}'")
            yield nxt.raw
            cur = ctypes.create_string_buffer(nxt.raw, self.key_size)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for k in list(self.keys()):
            v = self.lookup(k)
            if v is not None:
                yield k, v

    def update_batch_raw(self, keys: bytes, values: bytes, flags: int = BPF_ANY) -> None:
        """Batch-write packed keys and values (not per-CPU maps), in chunks of 65536 elements."""
        if self.percpu:
            raise DatapathError(f"batch-write packed values to per-CPU map '{self.name}'", _errno.EINVAL)
        n = len(keys) // self.key_size
        if len(keys) % self.key_size or len(values) != n * self.value_size:
            raise DatapathError(f"batch-update map '{self.name}' with {len(keys)} key bytes and "
                                f"{len(values)} value bytes", _errno.EINVAL)
        step = 65536
        for start in range(0, n, step):
            count = min(step, n - start)
            kb = ctypes.create_string_buffer(keys[start * self.key_size:(start + count) * self.key_size])
            vb = ctypes.create_string_buffer(values[start * self.value_size:(start + count) * self.value_size])
            done = ctypes.c_uint32(count)
            opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts), elem_flags=flags, flags=0)
            ret = lib().bpf_map_update_batch(self.fd, kb, vb, ctypes.byref(done), ctypes.byref(opts))
            _check(ret, f"batch-update map '{self.name}' ({start + done.value} of {n} written)")

    def lookup_batch(self, after: bytes | None, count: int) -> tuple[list[bytes], list[bytes]]:
        """Up to count elements following key after (from the start when None), in few calls.

        For arrays the elements come in index order, so (index - 1) as after reads a slice.
        """
        keys: list[bytes] = []
        values: list[bytes] = []
        token_in = ctypes.create_string_buffer(after, self.key_size) if after is not None else None
        token_out = ctypes.create_string_buffer(self.key_size)
        while len(keys) < count:
            want = min(count - len(keys), 8192)
            kb = ctypes.create_string_buffer(want * self.key_size)
            vb = ctypes.create_string_buffer(want * self._value_len())
            n = ctypes.c_uint32(want)
            opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))
            ret = lib().bpf_map_lookup_batch(self.fd, token_in, token_out, kb, vb, ctypes.byref(n),
                                             ctypes.byref(opts))
            if ret < 0 and ret != -_errno.ENOENT:
                _check(ret, f"batch-read map '{self.name}'")
            ks, vs, stride = kb.raw, vb.raw, self._value_len()
            for j in range(n.value):
                keys.append(ks[j * self.key_size:(j + 1) * self.key_size])
                values.append(vs[j * stride:j * stride + self.value_size])
            if ret == -_errno.ENOENT or n.value == 0:
                break
            token_in = ctypes.create_string_buffer(token_out.raw, self.key_size)
        return keys[:count], values[:count]

    def mmap_u32(self) -> npt.NDArray[np.uint32]:
        """The elements of a BPF_F_MMAPABLE array of 32-bit values as a writable array over the map's
        own memory (elements sit 8 bytes apart, as the kernel rounds array elements up to 8).

        Writes are plain stores the datapath sees at once. Close the map only after dropping the
        arrays returned here."""
        if self.type != MapType.ARRAY or self.value_size != 4:
            raise DatapathError(f"map '{self.name}' into memory: it is no array of 32-bit values", _errno.EINVAL)
        return np.ndarray((self.max_entries,), dtype="<u4", buffer=self._mmap(8), strides=(8,))

    def mmap_words(self) -> npt.NDArray[np.uint32]:
        """A BPF_F_MMAPABLE array whose values are a multiple of 8 bytes, as a writable
        (max_entries, value_size / 4) array of 32-bit words over the map's memory (see mmap_u32)."""
        if self.type != MapType.ARRAY or self.value_size % 8:
            raise DatapathError(f"map '{self.name}' into memory as words: it is no array of 8-byte multiples",
                                _errno.EINVAL)
        return np.ndarray((self.max_entries, self.value_size // 4), dtype="<u4", buffer=self._mmap(self.value_size))

    def mmap_view(self, fmt: Literal["I", "Q"] = "I") -> memoryview:
        """The memory of a BPF_F_MMAPABLE array as mmap_words maps it, as a writable memoryview of 32-bit
        ("I") or 64-bit ("Q") items: each item read or written is one aligned access of its size, where
        numpy may copy a slice in wider or narrower pieces. Release it (`with`) before closing the map."""
        size = {"I": 4, "Q": 8}.get(fmt)
        if self.type != MapType.ARRAY or self.value_size % 8 or size is None:
            raise DatapathError(f"map '{self.name}' into memory as '{fmt}' items: it is no array of 8-byte "
                                "multiples, or the format is neither 'I' nor 'Q'", _errno.EINVAL)
        view = memoryview(self._mmap(self.value_size)).cast(fmt)
        got = view.itemsize
        if got != size:  # the native C types' sizes: 4 and 8 on every Linux the lab runs on
            view.release()
            raise DatapathError(f"map '{self.name}' into memory as '{fmt}' items", _errno.EINVAL,
                                f"this Python's '{fmt}' is {got} bytes, not {size}")
        return view

    def _mmap(self, elem: int) -> mmap.mmap:
        length = -(-self.max_entries * elem // mmap.PAGESIZE) * mmap.PAGESIZE
        if self._mm is None:
            try:
                self._mm = mmap.mmap(self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as exc:
                raise DatapathError(f"map '{self.name}' into memory (is it BPF_F_MMAPABLE?)",
                                    exc.errno or _errno.EINVAL) from None
        return self._mm

    def pin(self, path: str) -> None:
        pin(self.fd, path, f"map '{self.name}'")

    def close(self) -> None:
        if self._mm is not None:
            with contextlib.suppress(BufferError):  # an array over it is still alive: the kernel unmaps at exit
                self._mm.close()
            self._mm = None
        if self._owned and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @classmethod
    def create(cls, map_type: MapType, name: str, key_size: int, value_size: int, max_entries: int,
               flags: int = 0, inner_map_fd: int = 0) -> Map:
        opts = _MapCreateOpts(sz=ctypes.sizeof(_MapCreateOpts), map_flags=flags,
                              inner_map_fd=inner_map_fd)
        fd = _check(lib().bpf_map_create(int(map_type), name.encode()[:15], key_size, value_size,
                                         max_entries, ctypes.byref(opts)),
                    f"create map '{name}' ({map_type.name}, {max_entries} entries)")
        return cls(fd, name, int(map_type), key_size, value_size, max_entries, owned=True)


@dataclass(frozen=True)
class RunResult:
    retval: int
    data: bytes
    duration_ns: int


class Link:
    """A BPF link (XDP or TCX attachment); closing the last fd or unpinning detaches it."""

    def __init__(self, fd: int, what: str) -> None:
        self.fd = fd
        self.what = what

    def pin(self, path: str) -> None:
        pin(self.fd, path, self.what)

    def update(self, prog: Program) -> None:
        """Replace the program behind this link atomically (maps are whatever prog uses)."""
        opts = _LinkUpdateOpts(sz=ctypes.sizeof(_LinkUpdateOpts))
        _check(lib().bpf_link_update(self.fd, prog.fd, ctypes.byref(opts)),
               f"replace the program of {self.what} with '{prog.name}'")

    def detach(self) -> None:
        _check(lib().bpf_link_detach(self.fd), f"detach {self.what}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @classmethod
    def from_pin(cls, path: str) -> Link:
        return cls(obj_get(path, "pinned link"), f"link pinned at {path}")


XDP_MODES = {"native": XDP_FLAGS_DRV_MODE, "generic": XDP_FLAGS_SKB_MODE, "auto": 0}


class Program:
    """A loaded BPF program of an object."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name

    @property
    def id(self) -> int:
        """The kernel's id of this program (what `ip link` and tracepoints name it by)."""
        info = ctypes.create_string_buffer(256)
        size = ctypes.c_uint32(len(info))
        _check(lib().bpf_obj_get_info_by_fd(self.fd, info, ctypes.byref(size)), f"read info of program '{self.name}'")
        return int(struct.unpack_from("<I", info.raw, 4)[0])  # struct bpf_prog_info: type, id, ...

    def test_run(self, data: bytes, repeat: int = 1, ctx: bytes | None = None,
                 out_size: int | None = None, flags: int = 0, batch_size: int = 0) -> RunResult:
        """BPF_PROG_TEST_RUN. With repeat > 1 each iteration sees the previous one's output."""
        din = ctypes.create_string_buffer(data, len(data))
        size = out_size if out_size is not None else len(data) + 4096
        dout = ctypes.create_string_buffer(size) if flags == 0 else None
        opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts))
        opts.data_in = ctypes.cast(din, ctypes.c_void_p)
        opts.data_size_in = len(data)
        if dout is not None:
            opts.data_out = ctypes.cast(dout, ctypes.c_void_p)
            opts.data_size_out = size
        cin = None
        if ctx is not None:
            cin = ctypes.create_string_buffer(ctx, len(ctx))
            opts.ctx_in = ctypes.cast(cin, ctypes.c_void_p)
            opts.ctx_size_in = len(ctx)
        opts.repeat = repeat
        opts.flags = flags
        opts.batch_size = batch_size
        _check(lib().bpf_prog_test_run_opts(self.fd, ctypes.byref(opts)),
               f"test-run program '{self.name}'")
        out = dout.raw[: opts.data_size_out] if dout is not None else b""
        return RunResult(ctypes.c_int32(opts.retval).value, out, opts.duration)  # tc's -1 (UNSPEC) is -1

    def attach_xdp(self, ifindex: int, mode: str = "native", ifname: str = "") -> Link:
        """Attach through a BPF link; mode native fails rather than falling back to generic."""
        if mode not in XDP_MODES:
            raise DatapathError(f"attach in XDP mode '{mode}'", _errno.EINVAL, "use native, generic or auto")
        label = ifname or f"ifindex {ifindex}"
        opts = _LinkCreateOpts(sz=ctypes.sizeof(_LinkCreateOpts), flags=XDP_MODES[mode])
        ret = lib().bpf_link_create(self.fd, ifindex, int(AttachType.XDP), ctypes.byref(opts))
        hint = "try --mode generic" if mode == "native" else ""
        if ret == -_errno.EBUSY:
            hint = "another XDP program is attached; detach it first (ip link set dev IF xdp off)"
        fd = _check(ret, f"attach XDP program '{self.name}' to '{label}' in {mode} mode", hint)
        return Link(fd, f"XDP link of '{self.name}' on '{label}'")

    def attach_tcx(self, ifindex: int, direction: str = "ingress", ifname: str = "") -> Link:
        kinds = {"ingress": AttachType.TCX_INGRESS, "egress": AttachType.TCX_EGRESS}
        if direction not in kinds:
            raise DatapathError(f"attach tc program in direction '{direction}'", _errno.EINVAL,
                                "use ingress or egress")
        label = ifname or f"ifindex {ifindex}"
        opts = _LinkCreateOpts(sz=ctypes.sizeof(_LinkCreateOpts))
        fd = _check(lib().bpf_link_create(self.fd, ifindex, int(kinds[direction]), ctypes.byref(opts)),
                    f"attach tc program '{self.name}' to '{label}' {direction}",
                    "TCX needs Linux 6.6 or newer")
        return Link(fd, f"TCX {direction} link of '{self.name}' on '{label}'")

    def pin(self, path: str) -> None:
        pin(self.fd, path, f"program '{self.name}'")


class BpfObject:
    """A compiled BPF object: configure (sizes, .rodata) before load(), then maps and programs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._obj: int | None = None
        self._loaded = False
        ptr = lib().bpf_object__open_file(path.encode(), None)
        if not ptr:
            raise DatapathError(f"open BPF object '{path}'", _errno_now(), "run make bpf")
        self._obj = ptr

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self) -> int:
        if self._obj is None:
            raise DatapathError(f"use BPF object '{self.path}' after close", _errno.EBADF)
        return self._obj

    def _map_ptr(self, name: str) -> int:
        ptr = lib().bpf_object__find_map_by_name(self._handle(), name.encode())
        if not ptr:
            raise DatapathError(f"find map '{name}' in '{self.path}'", _errno.ENOENT,
                                "rebuild with make bpf")
        return int(ptr)

    def set_max_entries(self, name: str, entries: int) -> None:
        _check(lib().bpf_map__set_max_entries(self._map_ptr(name), entries),
               f"size map '{name}' to {entries} entries")

    def reuse_map(self, name: str, fd: int) -> None:
        """Before load: use an existing map (e.g. a pinned one) instead of creating this one."""
        _check(lib().bpf_map__reuse_fd(self._map_ptr(name), fd), f"reuse an existing map as '{name}'",
               "the running map's type, key, value or size differ from the new object's")

    def rodata(self) -> bytearray:
        """A copy of the .rodata image (before load)."""
        size = ctypes.c_size_t()
        ptr = lib().bpf_map__initial_value(self._map_ptr(".rodata"), ctypes.byref(size))
        if not ptr:
            raise DatapathError(f"find .rodata in '{self.path}'", _errno.ENOENT)
        return bytearray(ctypes.string_at(ptr, size.value))

    def set_rodata(self, image: bytes) -> None:
        buf = ctypes.create_string_buffer(bytes(image), len(image))
        _check(lib().bpf_map__set_initial_value(self._map_ptr(".rodata"), buf, len(image)),
               f"set .rodata of '{self.path}'", "set it before load()")

    def set_autoload(self, program: str, autoload: bool) -> None:
        ptr = lib().bpf_object__find_program_by_name(self._handle(), program.encode())
        if not ptr:
            raise DatapathError(f"find program '{program}' in '{self.path}'", _errno.ENOENT)
        _check(lib().bpf_program__set_autoload(ptr, autoload), f"set autoload of '{program}'")

    def load(self) -> None:
        # Ours again: another libbpf user in this process (BCC's libbcc links the same libbpf.so.1)
        # may have put its own print function in since, and the verifier's reason would go there.
        lib().libbpf_set_print(_print_cb)
        _log.clear()
        ret = lib().bpf_object__load(self._handle())
        if ret < 0:
            lines = list(_log)
            end = next((i for i in range(len(lines) - 1, -1, -1) if "END PROG LOAD LOG" in lines[i]), None)
            why = [ln.strip() for ln in lines[max(0, end - 3): end]] if end else lines[-2:]
            raise DatapathError(f"load BPF object '{self.path}'", -ret,
                                "the verifier says: " + " | ".join(why) if why
                                else "are you root, with BPF enabled?")
        self._loaded = True

    def map(self, name: str) -> Map:
        ptr = self._map_ptr(name)
        fd = lib().bpf_map__fd(ptr)
        if fd < 0:
            raise DatapathError(f"use map '{name}' of '{self.path}' before load", _errno.EBADF,
                                "call load() first")
        return Map(fd, name, lib().bpf_map__type(ptr), lib().bpf_map__key_size(ptr),
                   lib().bpf_map__value_size(ptr), lib().bpf_map__max_entries(ptr))

    def program(self, name: str) -> Program:
        ptr = lib().bpf_object__find_program_by_name(self._handle(), name.encode())
        if not ptr:
            raise DatapathError(f"find program '{name}' in '{self.path}'", _errno.ENOENT)
        fd = lib().bpf_program__fd(ptr)
        if fd < 0:
            raise DatapathError(f"use program '{name}' of '{self.path}' before load", _errno.EBADF,
                                "call load() first")
        return Program(fd, name)

    def attach_tracepoint(self, program: str, category: str, name: str) -> TracepointLink:
        """Attach a loaded SEC("tracepoint/...") program to the kernel tracepoint category:name."""
        ptr = lib().bpf_object__find_program_by_name(self._handle(), program.encode())
        if not ptr:
            raise DatapathError(f"find program '{program}' in '{self.path}'", _errno.ENOENT)
        link = lib().bpf_program__attach_tracepoint(ptr, category.encode(), name.encode())
        if not link:
            raise DatapathError(f"attach program '{program}' to tracepoint {category}:{name}", _errno_now(),
                                "is tracefs mounted on /sys/kernel/tracing? (make deps mounts it)")
        return TracepointLink(int(link), f"tracepoint link of '{program}' on {category}:{name}")

    def close(self) -> None:
        if self._obj is not None:
            lib().bpf_object__close(self._obj)
            self._obj = None


class TracepointLink:
    """A program attached to a tracepoint (a libbpf link over a perf event); close() detaches it."""

    def __init__(self, ptr: int, what: str) -> None:
        self._ptr: int | None = ptr
        self.what = what

    def close(self) -> None:
        if self._ptr is not None:
            lib().bpf_link__destroy(self._ptr)
            self._ptr = None


def pin(fd: int, path: str, what: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _check(lib().bpf_obj_pin(fd, path.encode()), f"pin {what} at {path}",
           "is bpffs mounted on /sys/fs/bpf? (make deps mounts it)")


def obj_get(path: str, what: str = "object") -> int:
    return _check(lib().bpf_obj_get(path.encode()), f"open {what} pinned at {path}")


def map_from_pin(path: str) -> Map:
    """A pinned map reopened by a later process, its layout read back from the kernel."""
    return map_from_fd(obj_get(path, "map"), path)


def map_from_fd(fd: int, what: str) -> Map:
    """Wrap an owned map fd, reading type, sizes and name from the kernel."""
    info = ctypes.create_string_buffer(128)
    size = ctypes.c_uint32(128)
    try:
        _check(lib().bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)), f"read map info of {what}")
    except DatapathError:
        os.close(fd)
        raise
    mtype, _id, key_size, value_size, max_entries, _flags = struct.unpack_from("<6I", info.raw)
    name = info.raw[24:40].split(b"\0", 1)[0].decode()
    return Map(fd, name, mtype, key_size, value_size, max_entries, owned=True)


_grace_maps: tuple[Map, Map] | None = None


def wait_for_bpf_programs() -> None:
    """Return once every BPF program that was running at the call has finished.

    The kernel waits for an RCU grace period after an update of a map-in-map, so that its caller knows
    no program still uses the inner map it replaced (maybe_wait_bpf_programs in kernel/bpf/syscall.c);
    XDP runs inside an RCU read-side section (softirq, or rcu_read_lock in a test run), even where it
    may be preempted (test runs, PREEMPT_RT). So one update of a private array of maps is that wait:
    ~5-20 ms here. The two maps live as long as the process."""
    global _grace_maps
    if _grace_maps is None:
        inner = Map.create(MapType.ARRAY, "lb_grace_inner", 4, 4, 1)
        try:
            outer = Map.create(MapType.ARRAY_OF_MAPS, "lb_grace", 4, 4, 1, inner_map_fd=inner.fd)
        except BaseException:
            inner.close()
            raise
        _grace_maps = (inner, outer)
    inner, outer = _grace_maps
    outer.update(b"\0" * 4, inner.fd.to_bytes(4, "little"))
