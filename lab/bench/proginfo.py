"""A loaded BPF program's struct bpf_prog_info: the raw record, its fields, the program's size in instructions."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any

from balancer.libbpf import lib
from lab.errors import LabError

# struct bpf_prog_info (include/uapi/linux/bpf.h): byte offsets of the fields read here.
INFO_SIZE = 256
JITED_PROG_LEN = 16
NR_JITED_KSYMS, NR_JITED_FUNC_LENS, JITED_KSYMS, JITED_FUNC_LENS = 104, 108, 112, 120
BTF_ID = 128
NR_LINE_INFO, LINE_INFO, JITED_LINE_INFO = 148, 152, 160
NR_JITED_LINE_INFO, LINE_INFO_REC_SIZE, JITED_LINE_INFO_REC_SIZE = 168, 172, 176


def prog_info(fd: int, prepare: Callable[[ctypes.Array[ctypes.c_char]], None] | None = None) -> bytes:
    """A program's struct bpf_prog_info; `prepare` fills in the arrays the kernel is to copy out."""
    buf = ctypes.create_string_buffer(INFO_SIZE)
    if prepare:
        prepare(buf)
    size = ctypes.c_uint32(INFO_SIZE)
    if lib().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(size)) != 0:
        raise LabError(f"cannot read bpf_prog_info of program fd {fd}")
    return buf.raw


def u32_at(raw: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", raw, off)[0])


def program_insns(prog: Any) -> tuple[int, int]:
    """(xlated instructions, verified instructions) of a loaded program, from bpf_prog_info."""
    info = prog_info(prog.fd)
    # xlated_prog_len at 20; verified_insns at 216 (Linux >= 5.16)
    return u32_at(info, 20) // 8, u32_at(info, 216)
