"""btf.py: reads the contract types of a compiled BPF object from its ELF sections (.BTF, symbols).

A small pure-Python reader (no bpftool, no libbpf) of what l4lab's ABI needs: named structs and
enums, and the offsets of the load-time constants in `.rodata` (taken from the ELF symbol table,
because the object's DATASEC records offsets only after libbpf fixes them up at load).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from balancer.errors import AbiMismatchError

# BTF kinds (include/uapi/linux/btf.h).
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)
_EXTRA = {INT: 4, ARRAY: 12, VAR: 4, DECL_TAG: 4}
_PER_MEMBER = {STRUCT: 12, UNION: 12, ENUM: 8, FUNC_PROTO: 8, DATASEC: 12, ENUM64: 12}


@dataclass
class BtfType:
    kind: int
    name: str
    size_or_type: int
    vlen: int
    kind_flag: bool
    extra: bytes
    members: list[tuple[str, int, int]] = field(default_factory=list)  # (name, type id or value, offset)


@dataclass(frozen=True)
class Member:
    name: str
    ctype: str      # e.g. "__u32", "__u8[6]", "struct lb_x"
    offset: int     # bytes
    size: int


@dataclass(frozen=True)
class Struct:
    name: str
    size: int
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Enum:
    name: str
    values: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class RodataVar:
    name: str
    ctype: str
    offset: int
    size: int


@dataclass(frozen=True)
class Contract:
    """What Python relies on in one object: lb_* structs and enums, its cfg_* constants and its maps."""

    structs: tuple[Struct, ...]
    enums: tuple[Enum, ...]
    rodata: tuple[RodataVar, ...]
    maps: tuple[str, ...] = ()  # names of the maps the object defines (its .maps section), sorted

    def digest(self) -> str:
        blob = json.dumps({"structs": [[s.name, s.size, [list(m.__dict__.values()) for m in s.members]]
                                       for s in self.structs],
                           "enums": [[e.name, [list(v) for v in e.values]] for e in self.enums],
                           "rodata": [list(v.__dict__.values()) for v in self.rodata],
                           "maps": list(self.maps)},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _sections(data: bytes, path: str) -> tuple[dict[str, bytes], list[tuple[str, int, int, int]]]:
    """ELF64 little-endian sections by name, and symbols as (name, section index, value, size)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise AbiMismatchError(f"read '{path}' as a BPF object", 0, "not an ELF64 little-endian file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_hdr = headers[shstrndx]
    shstr = data[strtab_hdr[4]: strtab_hdr[4] + strtab_hdr[5]]

    def cstr(blob: bytes, off: int) -> str:
        return blob[off: blob.index(b"\0", off)].decode()

    names = [cstr(shstr, h[0]) for h in headers]
    secs = {names[i]: data[h[4]: h[4] + h[5]] for i, h in enumerate(headers)}
    secs["__index__"] = b",".join(n.encode() for n in names)
    symbols: list[tuple[str, int, int, int]] = []
    for h in headers:
        if h[1] == 2:  # SHT_SYMTAB
            strs = data[headers[h[6]][4]: headers[h[6]][4] + headers[h[6]][5]]
            for off in range(0, h[5], 24):
                st_name, _info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", data, h[4] + off)
                if st_name:
                    symbols.append((cstr(strs, st_name), shndx, value, size))
    return secs, symbols


def _parse_btf(blob: bytes, path: str) -> list[BtfType]:
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", blob)
    if magic != 0xEB9F:
        raise AbiMismatchError(f"read the BTF of '{path}'", 0, "rebuild it with clang -g")
    types_raw = blob[hdr_len + type_off: hdr_len + type_off + type_len]
    strs = blob[hdr_len + str_off: hdr_len + str_off + str_len]

    def name_at(off: int) -> str:
        return strs[off: strs.index(b"\0", off)].decode()

    out: list[BtfType] = [BtfType(0, "void", 0, 0, False, b"")]
    pos = 0
    while pos < len(types_raw):
        name_off, info, size_or_type = struct.unpack_from("<III", types_raw, pos)
        pos += 12
        kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, bool(info >> 31)
        extra_len = _EXTRA.get(kind, 0)
        extra = types_raw[pos: pos + extra_len]
        pos += extra_len
        t = BtfType(kind, name_at(name_off), size_or_type, vlen, kflag, extra)
        step = _PER_MEMBER.get(kind, 0)
        for i in range(vlen if step else 0):
            a, b, c = struct.unpack_from("<III", types_raw + b"\0" * 4, pos + i * step)
            if kind == ENUM:
                t.members.append((name_at(a), struct.unpack("<i", struct.pack("<I", b))[0], 0))
            elif kind == ENUM64:
                t.members.append((name_at(a), b | (c << 32), 0))
            elif kind == FUNC_PROTO:
                t.members.append((name_at(a), b, 0))
            elif kind == DATASEC:
                t.members.append(("", a, b))
            else:
                t.members.append((name_at(a), b, c))
        pos += vlen * step
        out.append(t)
    return out


def _type_name(types: list[BtfType], tid: int) -> tuple[str, int]:
    """A C spelling of type tid and its size in bytes (qualifiers dropped)."""
    t = types[tid]
    if t.kind in (VOLATILE, CONST, RESTRICT, TYPE_TAG):
        return _type_name(types, t.size_or_type)
    if t.kind == TYPEDEF:
        return t.name, _type_name(types, t.size_or_type)[1]
    if t.kind == ARRAY:
        elem, _idx, n = struct.unpack("<III", t.extra)
        ename, esize = _type_name(types, elem)
        return f"{ename}[{n}]", esize * n
    if t.kind in (STRUCT, UNION):
        return f"{'struct' if t.kind == STRUCT else 'union'} {t.name}", t.size_or_type
    if t.kind in (ENUM, ENUM64):
        return f"enum {t.name}", t.size_or_type
    if t.kind in (INT, FLOAT):
        return t.name, t.size_or_type
    if t.kind == PTR:
        return "void *", 8
    return t.name or "?", t.size_or_type


def read_contract(path: str | Path) -> Contract:
    """The lb_* structs and enums, the cfg_* .rodata constants and the map names of one compiled object."""
    p = str(path)
    try:
        data = Path(p).read_bytes()
    except OSError as exc:
        raise AbiMismatchError(f"read BPF object '{p}'", exc.errno or 0, "run make bpf") from exc
    secs, symbols = _sections(data, p)
    if ".BTF" not in secs:
        raise AbiMismatchError(f"find BTF in '{p}'", 0, "compile with clang -g")
    types = _parse_btf(secs[".BTF"], p)
    structs: dict[str, Struct] = {}
    enums: dict[str, Enum] = {}
    var_types: dict[str, int] = {}
    for t in types:
        if t.kind == STRUCT and t.name.startswith("lb_"):
            members = []
            for mname, mtid, bits in t.members:
                ctype, size = _type_name(types, mtid)
                members.append(Member(mname, ctype, (bits & 0xFFFFFF if t.kind_flag else bits) // 8, size))
            if not any(m.ctype.endswith("*") for m in members):  # map definitions are not data
                structs[t.name] = Struct(t.name, t.size_or_type, tuple(members))
        elif t.kind in (ENUM, ENUM64) and t.name.startswith("lb_"):
            enums[t.name] = Enum(t.name, tuple((n, v) for n, v, _ in t.members))
        elif t.kind == VAR:
            var_types[t.name] = t.size_or_type
    index = secs["__index__"].split(b",")
    rodata_idx = index.index(b".rodata") if b".rodata" in index else -1
    maps_idx = index.index(b".maps") if b".maps" in index else -1
    rodata = []
    for name, shndx, value, size in symbols:
        if shndx == rodata_idx and name.startswith("cfg_") and name in var_types:
            rodata.append(RodataVar(name, _type_name(types, var_types[name])[0], value, size))
    maps = sorted(name for name, shndx, _, _ in symbols if shndx == maps_idx and name)
    return Contract(tuple(structs[k] for k in sorted(structs)), tuple(enums[k] for k in sorted(enums)),
                    tuple(sorted(rodata, key=lambda v: v.offset)), tuple(maps))
