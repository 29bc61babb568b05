"""lbctl end to end in a private netns: load on a real veth, edit, status, stats, bad input, unload."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from balancer import cli, completion, controller, objects
from balancer.errors import DatapathError
from lab.harness import unique_name
from lab.nsexec import nsenter_argv

REPO = Path(__file__).resolve().parents[2]
CONFIG = """
[datapath]
interfaces = ["lbc0"]
ring_size = 251
max_vips = 8
max_reals = 16
lru_size = 256
fallback_size = 256

[encap]
nexthop_mac = "02:00:00:00:00:01"

[[vips]]
address = "198.51.100.100"
port = 80
proto = "tcp"
reals = [{ address = "203.0.113.18" }, { address = "203.0.113.34", weight = 2 }]
"""


class Ctl:
    """lbctl run as a command inside a netns with its own instance name.

    `lbctl` is the command (the checkout's by default; an installed one for the package test) and
    `cwd` the folder it runs in."""

    def __init__(self, ns: str, instance: str, tmp: Path) -> None:
        self.ns, self.instance, self.tmp = ns, instance, tmp
        self.lbctl: list[str] = [sys.executable, "-m", "balancer.cli"]
        self.cwd = REPO

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [*self.lbctl, "--instance", self.instance, *args]
        return subprocess.run(nsenter_argv(self.ns, argv), capture_output=True, text=True, cwd=self.cwd,
                              timeout=60, check=False)

    def state(self) -> str:
        return Path(controller.STATE_ROOT, f"{self.instance}.json").read_text()


@contextlib.contextmanager
def _ctl_world(tmp: Path) -> Iterator[Ctl]:
    """The netns, veth pair and lbctl wrapper of `ctl`, removed afterwards (see ctl)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: run as root")
    ns = unique_name("lct")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "lbc0", "type", "veth", "peer", "name", "lbc1"], check=True)
        for dev in ("lbc0", "lbc1"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        (tmp / "lb.toml").write_text(CONFIG)
        c = Ctl(ns, unique_name("t", 4, sep=""), tmp)
        yield c
        c("unload")
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
        name = locals().get("c")
        if isinstance(name, Ctl):
            shutil.rmtree(controller.Instance.pin_dir(name.instance), ignore_errors=True)
            Path(controller.STATE_ROOT, f"{name.instance}.json").unlink(missing_ok=True)
            Path(controller.STATE_ROOT, f"{name.instance}.lock").unlink(missing_ok=True)


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[Ctl]:
    """Name: ctl. Scope: function. Depends: root, built balancer object.

    A netns `lct-<random suffix>` with a veth pair (lbc0, lbc1, the peer with an XDP-free GRO-on end) and an
    lbctl wrapper bound to a unique instance; everything removed afterwards::

        def test_x(ctl):
            assert ctl("load", "-c", str(conf)).returncode == 0
    """
    with _ctl_world(tmp_path) as c:
        yield c


@pytest.fixture(scope="module")
def loaded_ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctl]:
    """Name: loaded_ctl. Scope: module. Depends: root, built balancer object.

    ctl's world with lb.toml loaded once (asserted), for tests that each assert they changed nothing
    (the state file before and after): one load serves them all::

        def test_x(loaded_ctl):
            before = loaded_ctl.state(); ...; assert loaded_ctl.state() == before
    """
    with _ctl_world(tmp_path_factory.mktemp("lct")) as c:
        done = c("load", "--config", str(c.tmp / "lb.toml"))
        assert done.returncode == 0, done.stderr
        yield c


def test_load_status_stats_unload(ctl: Ctl) -> None:
    done = ctl("load", "--config", str(ctl.tmp / "lb.toml"))
    assert done.returncode == 0, done.stderr
    assert "lbc0 (native)" in done.stdout
    status = json.loads(ctl("status", "--json").stdout)
    assert status["interfaces"] == {"lbc0": "native"}
    assert [r["address"] for r in status["vips"][0]["reals"]] == ["203.0.113.18", "203.0.113.34"]
    stats = json.loads(ctl("stats", "--json").stdout)
    assert set(stats["vips"]) == {"198.51.100.100:80/tcp"}
    assert "DROP_NO_REAL" in stats["reasons"]
    assert ctl("apply", str(ctl.tmp / "lb.toml")).stdout.strip().endswith("nothing to change")
    assert ctl("unload").returncode == 0
    assert not Path(controller.Instance.pin_dir(ctl.instance)).exists()
    again = ctl("status")
    assert again.returncode == 1 and "run `lbctl load --interface IF` first" in again.stderr


def test_edits_through_the_cli(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    assert ctl("vip", "add", "198.51.100.100", "9000", "udp", "--encap", "gue1").returncode == 0
    assert ctl("real", "add", "198.51.100.100", "9000", "udp", "203.0.113.50", "--weight", "3").returncode == 0
    assert ctl("real", "set-weight", "198.51.100.100", "80", "tcp", "203.0.113.18", "--weight", "0").returncode == 0
    vips = {v["vip"]: v for v in json.loads(ctl("status", "--json").stdout)["vips"]}
    assert vips["198.51.100.100:9000/udp"]["encap"] == "gue1"
    assert vips["198.51.100.100:9000/udp"]["reals"][0]["weight"] == 3
    assert vips["198.51.100.100:80/tcp"]["reals"][0]["weight"] == 0
    assert ctl("real", "del", "198.51.100.100", "9000", "udp", "203.0.113.50").returncode == 0
    assert ctl("vip", "del", "198.51.100.100", "9000", "udp").returncode == 0
    listed = ctl("vip", "list").stdout
    assert "9000" not in listed and "198.51.100.100:80/tcp" in listed


BAD = [
    (("vip", "del", "198.51.100.7", "80", "tcp"), 2, "unknown VIP 198.51.100.7:80/tcp"),
    (("real", "add", "198.51.100.100", "80", "tcp", "203.0.113.18"), 2, "already behind"),
    (("real", "set-weight", "198.51.100.100", "80", "tcp", "203.0.113.18", "--weight", "70000"), 2,
     "weight must be 0..65535 but got 70000"),
    (("vip", "add", "198.51.100.101", "65536", "tcp"), 2, "port must be 0..65535 but got 65536"),
    (("real", "add", "198.51.100.100", "80", "tcp", "203.0.113.999"), 2, "does not appear to be an IPv4"),
    (("vip", "add", "198.51.100.300", "80", "tcp"), 2, "does not appear to be an IPv4 or IPv6 address"),
    (("vip", "add", "198.51.100.100", "80", "tcp"), 2, "VIP 198.51.100.100:80/tcp exists already"),
    (("vip", "add", "198.51.100.101", "80", "tcp", "--katran-ring", "v2"), 2,
     "--katran-ring applies only to a katran hash (--hash katran...), not --hash 5tuple"),
]


@pytest.mark.parametrize(("args", "code", "message"), BAD,
                         ids=[" ".join(b[0][:2]) + f"-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_one_line_and_changes_nothing(loaded_ctl: Ctl, args: tuple[str, ...], code: int,
                                                   message: str) -> None:
    """Each case on the module's loaded instance (loaded_ctl), which each leaves as it found it."""
    ctl = loaded_ctl
    before = ctl.state()
    done = ctl(*args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert ctl.state() == before


def test_a_katran_compatible_vip_through_the_cli(loaded_ctl: Ctl) -> None:
    """`--hash katran --katran-ring v2`: stored, shown by status (text and JSON) and vip list; then removed."""
    ctl = loaded_ctl
    before = ctl.state()
    done = ctl("vip", "add", "198.51.100.101", "80", "tcp", "--hash", "katran", "--katran-ring", "v2")
    assert done.returncode == 0, done.stderr
    try:
        vips = {v["vip"]: v for v in json.loads(ctl("status", "--json").stdout)["vips"]}
        assert (vips["198.51.100.101:80/tcp"]["hash"], vips["198.51.100.101:80/tcp"]["ring"]) == ("katran", "katran-v2")
        assert vips["198.51.100.100:80/tcp"]["ring"] == "l4lab"
        assert "hash katran  ring katran-v2" in ctl("status").stdout
        listed = {v["vip"]: v for v in json.loads(ctl("vip", "list", "--json").stdout)}
        assert listed["198.51.100.101:80/tcp"]["ring"] == "katran-v2"
    finally:
        assert ctl("vip", "del", "198.51.100.101", "80", "tcp").returncode == 0
    assert json.loads(ctl.state())["vip_nums"] == json.loads(before)["vip_nums"]


def test_ipv6_vip_refuses_an_ipv4_real(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    assert ctl("vip", "add", "2001:db8:100::100", "80", "tcp").returncode == 0
    before = ctl.state()
    done = ctl("real", "add", "2001:db8:100::100", "80", "tcp", "203.0.113.18")
    assert done.returncode == 2
    assert "an IPv6 VIP cannot be encapsulated to IPv4 real 203.0.113.18; use an IPv6 real" in done.stderr
    assert ctl.state() == before


def test_missing_interface_and_bad_config_fail_cleanly(ctl: Ctl) -> None:
    done = ctl("load", "--interface", "nope0")
    assert done.returncode == 1 and "cannot find interface 'nope0'" in done.stderr
    assert not Path(controller.Instance.pin_dir(ctl.instance)).exists()
    bad = ctl.tmp / "bad.toml"
    bad.write_text(CONFIG.replace('port = 80', 'port = 0\nproto2 = 1'))
    done = ctl("load", "--config", str(bad))
    assert done.returncode == 2 and done.stderr.startswith(f"lbctl: {bad}: vips[0]")
    assert not Path(controller.Instance.pin_dir(ctl.instance)).exists()


def test_native_mode_fails_instead_of_falling_back(ctl: Ctl) -> None:
    """A device without native XDP (here: lo) must fail in native mode, not run in generic mode."""
    done = ctl("load", "--interface", "lo", "--mode", "native")
    assert done.returncode == 1, done.stdout
    assert "cannot attach XDP program 'balancer_xdp' to 'lo' in native mode" in done.stderr
    assert "try --mode generic" in done.stderr
    generic = ctl("load", "--interface", "lo", "--mode", "generic", "--config", str(ctl.tmp / "lb.toml"))
    assert generic.returncode == 0, generic.stderr
    assert "WARNING: XDP runs in generic (skb) mode on 'lo'" in generic.stderr


def test_object_with_another_contract_is_refused(ctl: Ctl, tmp_path: Path) -> None:
    obj = tmp_path / "balancer.o"
    data = bytearray((REPO / "build" / "bpf" / "balancer.o").read_bytes())
    assert b"lb_vip_meta" in data
    obj.write_bytes(bytes(data).replace(b"lb_vip_meta", b"lb_vip_mota"))  # same layout, another contract
    done = ctl("load", "--interface", "lbc0", "--object", str(obj))
    assert done.returncode == 1
    assert "differs from balancer/_abi.py" in done.stderr and "run `make abi`" in done.stderr


def _bpftool(*args: str) -> Any:
    return json.loads(subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True, check=True).stdout)


def _xdp_on(ns: str, dev: str) -> bool:
    """Whether an XDP program is attached to `dev` in netns `ns`, as `ip -j link` reports it."""
    link = json.loads(subprocess.run(["ip", "-n", ns, "-j", "link", "show", dev], capture_output=True, text=True,
                                     check=True).stdout)
    return "xdp" in link[0]


def test_upgrade_replaces_the_program_and_keeps_the_maps(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    pins = Path(controller.Instance.pin_dir(ctl.instance))
    old_prog = _bpftool("link", "show", "pinned", str(pins / "link_lbc0"))["prog_id"]
    map_ids = {name: _bpftool("map", "show", "pinned", str(pins / name))["id"]
               for name in ("lb_vips", "lb_ring", "lb_sess4_sets", "lb_sessions", "lb_counts")}
    done = ctl("upgrade")
    assert done.returncode == 0, done.stderr
    new_prog = _bpftool("link", "show", "pinned", str(pins / "link_lbc0"))["prog_id"]
    assert new_prog != old_prog
    used = set(_bpftool("prog", "show", "id", str(new_prog))["map_ids"])
    assert set(map_ids.values()) <= used, "the new program must run on the pinned maps"
    assert {n: _bpftool("map", "show", "pinned", str(pins / n))["id"] for n in map_ids} == map_ids
    status = json.loads(ctl("status", "--json").stdout)
    assert status["interfaces"] == {"lbc0": "native"} and len(status["vips"]) == 1


def test_stats_watch_prints_rates(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    done = ctl("stats", "--watch", "0.2", "--count", "2")
    assert done.returncode == 0, done.stderr
    tables = [t for t in done.stdout.split("\n\n\n") if t.strip()]
    assert done.stdout.count("pkt/s") == 2, done.stdout  # one table with a rate column per interval
    assert "events:" in tables[-1]


def lbctl(*args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    """lbctl from the checkout, outside any netns; as the uid `user` (setpriv) when given."""
    argv = [sys.executable, "-m", "balancer.cli", *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60, check=False)


def test_version_is_the_installed_distributions() -> None:
    done = lbctl("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"lbctl {metadata.version('l4lab')}"
    assert metadata.version("l4lab") == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_every_argument_has_help_and_every_verb_examples() -> None:
    top = cli.build_parser()
    verbs = completion._subcommands(top)
    assert {"load", "apply", "upgrade", "unload", "status", "stats", "vip", "real", "run", "completion"} <= set(verbs)
    for name, parser in [("", top), *verbs.items()]:
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                assert action.help, f"lbctl {name} {action.dest} has no help text"
        if name:
            epilog = parser.epilog or ""
            assert epilog.startswith("examples:\n") and f"lbctl {name}" in epilog, f"lbctl {name} has no example"
            for example in epilog.splitlines()[1:]:  # every plain example parses
                if example.strip().startswith("lbctl ") and ">" not in example:
                    cli.build_parser().parse_args(example.split()[1:])


def test_listings_and_apply_print_json(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    more = ctl.tmp / "more.toml"
    more.write_text(CONFIG + '[[vips]]\naddress = "198.51.100.101"\nport = 53\nproto = "udp"\nencap = "gue1"\n')
    applied = ctl("apply", str(more), "--json")
    assert applied.returncode == 0, applied.stderr
    report = json.loads(applied.stdout)
    assert report["file"] == str(more) and report["vips_added"] == 1 and report["vips_removed"] == 0, report
    vips = json.loads(ctl("vip", "list", "--json").stdout)
    assert vips == [{"vip": "198.51.100.100:80/tcp", "encap": "ipip", "hash": "5tuple", "ring": "l4lab", "lru": True,
                     "outer_src": "flow", "reals": 2},
                    {"vip": "198.51.100.101:53/udp", "encap": "gue1", "hash": "5tuple", "ring": "l4lab", "lru": True,
                     "outer_src": "fixed", "reals": 0}]
    reals = json.loads(ctl("real", "list", "198.51.100.100", "80", "tcp", "--json").stdout)
    assert [(r["address"], r["weight"]) for r in reals] == [("203.0.113.18", 1), ("203.0.113.34", 2)]
    status = json.loads(ctl("status", "--json").stdout)
    assert [r["id"] for r in reals] == [r["id"] for r in status["vips"][0]["reals"]]
    again = json.loads(ctl("apply", str(more), "--json").stdout)
    assert again.pop("file") and set(again.values()) == {0}, again  # nothing to change
    for vip in (("198.51.100.100", "80", "tcp"), ("198.51.100.101", "53", "udp")):
        assert ctl("vip", "del", *vip).returncode == 0
    assert json.loads(ctl("vip", "list", "--json").stdout) == []


def _complete(script: str, *words: str) -> list[str]:
    """What bash completes after `words` (the last one being the word under the cursor)."""
    probe = script + (
        f"\nCOMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}"
        f"\n_{words[0]}; printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    )
    done = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


def test_bash_completion_follows_the_parser() -> None:
    done = lbctl("completion", "bash")
    assert done.returncode == 0 and done.stdout.rstrip().endswith("complete -F _lbctl lbctl"), done.stdout
    script = done.stdout
    assert _complete(script, "lbctl", "st") == ["status", "stats"]
    assert _complete(script, "lbctl", "--instance", "st", "u") == ["upgrade", "unload"]  # the value is no verb
    assert _complete(script, "lbctl", "load", "--mode", "") == ["native", "generic", "auto"]
    assert _complete(script, "lbctl", "vip", "add", "198.51.100.1", "80", "tcp", "--encap", "gue") == ["gue1", "gue0"]
    assert _complete(script, "lbctl", "load", "-i", "l") == ["lo"]
    assert "--weight" in _complete(script, "lbctl", "real", "--")
    bad = lbctl("completion", "zsh")
    assert bad.returncode == 2 and "invalid choice: 'zsh'" in bad.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is missing: cannot drop root")
def test_non_root_is_refused_up_front_in_one_line() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: run as root (the test drops to uid 65534 itself)")
    for verb in (("status",), ("vip", "list"), ("load", "--interface", "lo")):
        done = lbctl(*verb, user=65534)
        assert done.returncode == 1, done
        assert done.stderr.startswith(f"lbctl: `lbctl {verb[0]}` needs CAP_BPF") and "run it as root" in done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
    for free in (("--version",), ("--help",), ("load", "--help"), ("completion", "bash")):
        done = lbctl(*free, user=65534)
        assert done.returncode == 0 and done.stdout and not done.stderr, done


def test_objects_are_searched_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(objects.ENV, raising=False)
    default = objects.find("balancer.o")
    assert Path(default).is_file() and Path(default).parent in objects.search_dirs("bpf")
    (tmp_path / "bpf").mkdir()
    shutil.copy(default, tmp_path / "bpf" / "balancer.o")
    monkeypatch.setenv(objects.ENV, str(tmp_path))
    assert objects.search_dirs("bpf")[0] == tmp_path / "bpf"
    assert objects.find("balancer.o") == str(tmp_path / "bpf" / "balancer.o")
    assert objects.find("decap.o") != str(tmp_path / "bpf" / "decap.o")  # not there: the next folder
    assert objects.find("some/where.o") == "some/where.o"  # a path is used as given
    with pytest.raises(DatapathError) as err:
        objects.find("nosuch.o")
    assert str(err.value).startswith(f"cannot find the BPF object 'nosuch.o': No such file or directory; "
                                     f"looked in {tmp_path / 'bpf'}, ")
    assert "run `make bpf`" in str(err.value) and objects.ENV in str(err.value)


def test_a_missing_object_is_one_line(ctl: Ctl) -> None:
    done = ctl("load", "--interface", "lbc0", "--object", "nosuch.o")
    assert done.returncode == 1
    assert done.stderr.startswith("lbctl: cannot find the BPF object 'nosuch.o'") and len(done.stderr.splitlines()) == 1
    assert not Path(controller.Instance.pin_dir(ctl.instance)).exists()


INSTALL_ENV = "L4LAB_INSTALL_TEST"


def test_pins_agree_between_requirements_pyproject_and_lock() -> None:
    def pins(lines: list[str]) -> dict[str, str]:
        found = (re.match(r"([A-Za-z0-9_.-]+)==([^\s;\\]+)", line.strip()) for line in lines)
        return {m[1].lower().replace("_", "-"): m[2] for m in found if m}

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    assert set(project["optional-dependencies"]) == {"lab", "report", "trex", "dev"}
    wanted = pins((REPO / "requirements.txt").read_text().splitlines())
    assert pins(declared) == wanted
    lock = (REPO / "requirements.lock").read_text()
    locked = pins(lock.splitlines())
    assert {k: locked.get(k) for k in wanted} == wanted, "requirements.lock is stale: run make lock"
    assert "wheel" in locked and "l4lab" not in locked
    for block in re.split(r"\n(?=\S)", lock):
        if "==" in block and not block.startswith("#"):
            assert "--hash=sha256:" in block, f"no hash for {block.splitlines()[0]}"


def test_fresh_venv_install_runs_lbctl_without_the_source_tree(ctl: Ctl, tmp_path: Path) -> None:
    """`pip install .` into a new venv; its lbctl, run from another folder, loads the packaged object."""
    if not os.environ.get(INSTALL_ENV):
        pytest.skip(f"builds a venv and installs l4lab from PyPI (minutes): make test-install (sets {INSTALL_ENV}=1)")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", objects.ENV)}
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(REPO)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for prog in ("lbctl", "l4lab"):
        version = subprocess.run([str(venv / "bin" / prog), "--version"], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=60, check=False)
        assert version.stdout.strip() == f"{prog} {metadata.version('l4lab')}", version
    ctl.lbctl, ctl.cwd = [str(venv / "bin" / "lbctl")], tmp_path
    loaded = ctl("load", "--config", str(ctl.tmp / "lb.toml"))
    assert loaded.returncode == 0 and "lbc0 (native)" in loaded.stdout, loaded.stderr
    status = json.loads(ctl("status", "--json").stdout)
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert status["object"] == str(site / "balancer" / "_build" / "bpf" / "balancer.o")
    assert (site / "balancer" / "_build" / "lib" / "libl4lab_maglev.so").is_file()
    assert ctl("unload").returncode == 0


def test_server_ids_pins_prefix_vips_and_decap_through_the_cli(ctl: Ctl) -> None:
    assert ctl("load", "-c", str(ctl.tmp / "lb.toml")).returncode == 0
    steps = [
        ("vip", "add", "198.51.100.100", "443", "udp", "--server-id-from", "quic", "--udp-flow-migration"),
        ("real", "add", "198.51.100.100", "443", "udp", "203.0.113.18", "--server-id", "1024"),
        ("vip", "add", "198.51.100.128/25", "80", "tcp", "--server-id-from", "tcp-option"),
        ("real", "add", "198.51.100.128/25", "80", "tcp", "203.0.113.34", "--server-id", "197634"),
        ("src-route", "add", "198.51.100.100", "443", "udp", "192.0.2.0/24", "203.0.113.34"),
        ("decap", "add", "198.51.100.7", "--action", "local"),
    ]
    for step in steps:
        r = ctl(*step)
        assert r.returncode == 0, (step, r.stderr)
    status = json.loads(ctl("status", "--json").stdout)
    vips = {v["vip"]: v for v in status["vips"]}
    assert vips["198.51.100.100:443/udp"]["server_id_from"] == "quic"
    assert vips["198.51.100.100:443/udp"]["udp_flow_migration"] is True
    assert vips["198.51.100.100:443/udp"]["reals"][0]["server_id"] == 1024
    assert vips["198.51.100.100:443/udp"]["src_routes"] == [{"prefix": "192.0.2.0/24", "real": "203.0.113.34"}]
    assert vips["198.51.100.128/25:80/tcp"]["reals"][0]["server_id"] == 197634
    assert status["decap"] == [{"address": "198.51.100.7", "action": "local"}]
    assert json.loads(ctl("decap", "list", "--json").stdout) == status["decap"]
    assert "192.0.2.0/24 -> 203.0.113.34" in ctl("src-route", "list", "198.51.100.100", "443", "udp").stdout
    clash = ctl("real", "add", "198.51.100.100", "443", "udp", "203.0.113.50", "--server-id", "1024")
    assert clash.returncode == 2 and clash.stderr.count("\n") == 1
    assert "server id 1024 names real 203.0.113.18" in clash.stderr
    bad = ctl("vip", "add", "198.51.100.101", "80", "tcp", "--server-id-from", "quic")
    assert bad.returncode == 2 and 'needs proto = "udp"' in bad.stderr
    for step in (("src-route", "del", "198.51.100.100", "443", "udp", "192.0.2.0/24"),
                 ("decap", "del", "198.51.100.7")):
        assert ctl(*step).returncode == 0
    status = json.loads(ctl("status", "--json").stdout)
    assert status["decap"] == [] and not any(v["src_routes"] for v in status["vips"])


def test_an_instance_pinned_by_another_datapath_version_is_refused_and_unloads(ctl: Ctl) -> None:
    """An instance loaded by the LRU build (IPv4 sessions in lb_sessions4, no lb_sess4_sets) cannot be
    opened by this lbctl: status and upgrade say so and how to get out, changing nothing; unload removes its
    pins and state, which detaches its program."""
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    pins = Path(controller.Instance.pin_dir(ctl.instance))
    (pins / "lb_sess4_sets").unlink()
    subprocess.run(["bpftool", "map", "create", str(pins / "lb_sessions4"), "type", "lru_hash", "key", "40",
                    "value", "16", "entries", "64", "name", "lb_sessions4"], check=True)
    for verb in ("status", "upgrade"):
        done = ctl(verb)
        assert done.returncode == 1, (verb, done.stdout, done.stderr)
        assert "it has no lb_sess4_sets and has lb_sessions4, which this lbctl does not know" in done.stderr, \
            done.stderr
        assert "`lbctl unload` and `lbctl load` it again" in done.stderr, done.stderr
        assert "IPv4 sessions moved from lb_sessions4 to lb_sess4_sets" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert (pins / "link_lbc0").exists() and (pins / "lb_sessions4").exists(), "refused verbs changed nothing"
    assert _xdp_on(ctl.ns, "lbc0"), "the old program still runs"
    done = ctl("unload")
    assert done.returncode == 0, done.stderr
    assert "loaded by another version of the datapath" in done.stdout, done.stdout
    assert not pins.exists() and not Path(controller.STATE_ROOT, f"{ctl.instance}.json").exists()
    assert not _xdp_on(ctl.ns, "lbc0"), "unload left the program attached"


def test_an_instance_missing_another_map_is_refused_without_the_sessions_history(ctl: Ctl) -> None:
    """Any map of the set missing refuses the instance; the hint names the IPv4 sessions' move only when
    the instance has lb_sessions4, so a future map change is not blamed on that one."""
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    pins = Path(controller.Instance.pin_dir(ctl.instance))
    (pins / "lb_ring").unlink()
    done = ctl("status")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "it has no lb_ring: " in done.stderr, done.stderr
    assert "another version of the datapath loaded it; manage it with the lbctl" in done.stderr, done.stderr
    assert "lb_sessions4" not in done.stderr, done.stderr
    assert ctl("unload").returncode == 0 and not pins.exists()
    assert not _xdp_on(ctl.ns, "lbc0")
