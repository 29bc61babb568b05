"""The error tree of balancer/errors.py: its shape, and the exact messages users and tests rely on."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from balancer import errors
from balancer.errors import (
    AbiMismatchError,
    ConfigError,
    DatapathError,
    HostError,
    InstanceOwnedError,
    LbError,
    RingError,
    show_value,
)


def test_public_surface_is_the_documented_tree() -> None:
    assert sorted(errors.__all__) == [
        "AbiMismatchError",
        "ConfigError",
        "DatapathError",
        "HostError",
        "InstanceOwnedError",
        "LbError",
        "RingError",
        "crash_report",
        "show_value",
    ]
    assert issubclass(ConfigError, LbError)
    assert issubclass(DatapathError, LbError)
    assert issubclass(AbiMismatchError, DatapathError)
    assert issubclass(RingError, LbError)
    assert issubclass(RingError, ValueError)
    assert issubclass(InstanceOwnedError, HostError)
    assert not issubclass(ConfigError, DatapathError)
    assert issubclass(HostError, LbError) and not issubclass(HostError, DatapathError)


def test_crash_report_is_one_line_naming_a_log_that_holds_the_traceback(tmp_path: Path) -> None:
    def deep() -> None:
        raise KeyError("no such thing\nsecond line")

    try:
        deep()
    except KeyError as exc:
        line = errors.crash_report("lbctl", exc, (str(tmp_path / "logs"),))
    assert "\n" not in line
    assert line.startswith("lbctl: unexpected error (KeyError: 'no such thing")
    path = Path(line.rsplit("the traceback is in ", 1)[1])
    assert path.parent == tmp_path / "logs"
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and "in deep" in text


def test_config_error_message_names_file_key_value_and_expectation() -> None:
    e = ConfigError("lb.toml", "vips[2].port", 0, "1..65535")
    assert str(e) == "lb.toml: vips[2].port must be 1..65535 but got 0"
    assert (e.file, e.key, e.value, e.expected) == ("lb.toml", "vips[2].port", 0, "1..65535")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("gue", '"gue"'),
        (True, "true"),
        (False, "false"),
        (1.5, "1.5"),
        (["a", 1], '["a", 1]'),
        ({"address": "x"}, '{ address = "x" }'),
        ('say "hi"', '"say \\"hi\\""'),
        ("tab\there\x7f\\", '"tab\\u0009here\\u007f\\\\"'),
        ("é", '"é"'),
    ],
)
def test_values_are_shown_as_toml_writes_them(value: object, shown: str) -> None:
    assert show_value(value) == shown
    assert str(ConfigError("f", "k", value, "x")) == f"f: k must be x but got {shown}"


def test_config_error_with_free_message() -> None:
    e = ConfigError("lb.toml", "vips[0].prot", None, "", message="vips[0].prot is not a known key")
    assert str(e) == "lb.toml: vips[0].prot is not a known key"


def test_datapath_error_message_has_cause_and_hint() -> None:
    e = DatapathError("attach XDP program to 'lb-rt'", errno.EOPNOTSUPP, "try --mode generic")
    assert str(e) == "cannot attach XDP program to 'lb-rt': Operation not supported; try --mode generic"
    assert e.errno == errno.EOPNOTSUPP


def test_datapath_error_accepts_negative_errno_as_libbpf_returns_it() -> None:
    e = DatapathError("update map 'lb_vips'", -errno.E2BIG)
    assert str(e) == "cannot update map 'lb_vips': Argument list too long"
    assert e.errno == errno.E2BIG


def test_datapath_error_parts_are_optional() -> None:
    assert str(DatapathError("find map 'lb_ring'")) == "cannot find map 'lb_ring'"
    assert str(DatapathError("load 'x.o'", hint="run make bpf")) == "cannot load 'x.o'; run make bpf"


def test_abi_mismatch_is_caught_as_datapath_error() -> None:
    with pytest.raises(DatapathError) as info:
        raise AbiMismatchError(
            "load 'balancer.o'", hint="its BTF digest differs from balancer/_abi.py; run make abi"
        )
    assert (
        str(info.value)
        == "cannot load 'balancer.o'; its BTF digest differs from balancer/_abi.py; run make abi"
    )


REFUSED_PROGRAM = r"""
#include <linux/bpf.h>
#define SEC(n) __attribute__((section(n), used))
SEC("xdp") int refused(struct xdp_md *ctx)
{
	volatile __u64 acc = 0;
#pragma clang loop unroll(full)
	for (int i = 0; i < 200; i++)  /* a verifier log of tens of KiB before the reason */
		acc += i * ctx->ingress_ifindex;
	unsigned char *data = (unsigned char *)(long)ctx->data;
	return data[acc & 7] ? 2 : 1;  /* no bounds check against data_end */
}
char _license[] SEC("license") = "GPL";
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="loading a BPF program needs root (CAP_BPF)")
def test_a_refused_program_names_the_verifiers_reason_at_the_end_of_a_long_log(tmp_path: Path) -> None:
    """The reason is the log's last lines; a print buffer of 4 KiB kept the log's start and the
    message said only 'failed to load: -13' (the Vagrant LB on Debian's 6.1 kernel)."""
    from balancer.libbpf import BpfObject

    if shutil.which("clang") is None:
        pytest.fail("clang is missing: run scripts/setup.sh")
    src, obj = tmp_path / "refused.bpf.c", tmp_path / "refused.o"
    src.write_text(REFUSED_PROGRAM)
    subprocess.run(["clang", "-O2", "-target", "bpf", f"-I/usr/include/{os.uname().machine}-linux-gnu",
                    "-c", str(src), "-o", str(obj)], check=True)
    with pytest.raises(DatapathError) as refused, BpfObject(str(obj)) as bpf:
        bpf.load()
    assert refused.value.errno == errno.EACCES
    assert "the verifier says: invalid access to packet" in str(refused.value), str(refused.value)
