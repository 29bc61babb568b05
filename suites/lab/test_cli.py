"""The `l4lab` command: status matches the topology, exec passes exit codes, errors are one line."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from balancer import completion
from lab import cli, nsexec, topology
from lab.errors import LabError
from lab.harness import unique_name
from lab.state import LabState, state_dir
from suites.lab import probes

REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@needs_root
def test_status_json_matches_the_topology(default_lab: LabState, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "status", "--name", default_lab.name, "--json")
    assert code == 0, err
    report = json.loads(out)
    topo = topology.load("default")
    assert report["name"] == default_lab.name and report["topology"] == "default" and report["complete"]
    assert report["builder"] == {"pid": os.getpid(), "alive": True}  # the fixture built it in this process
    assert [(n["name"], n["role"], n["netns"]) for n in report["nodes"]] == [
        (n.name, n.role, f"{default_lab.name}-{n.name}") for n in topo.nodes
    ]
    for node in report["nodes"]:
        want = {ep.ifname: ep for ep in topo.endpoints_of(node["name"])}
        got = {i["ifname"]: i for i in node["interfaces"]}
        assert set(got) == set(want)
        for ifname, ep in want.items():
            assert got[ifname]["state"] == "UP"
            assert got[ifname]["mtu"] == next(link.mtu for link in topo.links if ep in link.endpoints)
            assert set(got[ifname]["addresses"]) == {str(a) for a in ep.all_addresses}
        assert set(node["routes"]) == {r.describe() for r in topo.node(node["name"]).routes}
        if node["role"] == "real":
            assert set(node["loopback"]) == {"198.51.100.100/32", "2001:db8:100::100/128"}
            assert [s["alive"] for s in node["services"]] == [True]
            assert set(node["services"][0]["binds"]) == {
                "http 198.51.100.100:80", "udp-echo 198.51.100.100:9000",
                "http [2001:db8:100::100]:80", "udp-echo [2001:db8:100::100]:9000",
            }  # fmt: skip
        else:
            assert node["loopback"] == [] and node["services"] == []
    assert report["vips"] == [
        {
            "address": str(v.address),
            "ports": [{"proto": p.proto, "port": p.port, "service": p.service} for p in v.ports],
        }
        for v in topo.vips
    ]
    assert report["lb_source_prefixes"] == ["198.51.100.128/25", "2001:db8:1b:80::/64"]


@needs_root
def test_status_of_a_state_without_its_builder_claims_nothing(default_lab: LabState,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A state file written before the builder was recorded: no pid shown, neither "being built" nor "ended"."""
    name = unique_name("lbt")
    raw = json.loads(default_lab.path.read_text())
    raw.update(name=name, complete=False)
    del raw["builder_pid"], raw["builder_start"]
    state_dir(name).mkdir(parents=True)
    try:
        (state_dir(name) / "state.json").write_text(json.dumps(raw))
        code, out, err = run(capsys, "status", "--name", name, "--json")
        assert code == 0, err
        assert json.loads(out)["builder"] == {"pid": None, "alive": None}
        code, out, err = run(capsys, "status", "--name", name)
        assert code == 0, err
        assert out.splitlines()[0] == f"lab {name} (topology default) INCOMPLETE"
    finally:
        shutil.rmtree(state_dir(name))


@needs_root
def test_status_text_lists_every_node(default_lab: LabState, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "status", "--name", default_lab.name)
    assert code == 0
    for node in ("client", "router", "lb", "real1", "real2", "real3"):
        assert f"netns {default_lab.name}-{node}" in out
    assert "vip 198.51.100.100: tcp/80 http, udp/9000 udp-echo" in out


@needs_root
def test_exec_runs_in_the_node_and_returns_the_exit_code(
    default_lab: LabState, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    marker = tmp_path / "out"
    code, _, err = run(
        capsys,
        "exec",
        "real2",
        "--name",
        default_lab.name,
        "--",
        "sh",
        "-c",
        f"ip -br addr show lo > {marker}; exit 7",
    )
    assert code == 7, err
    assert "198.51.100.100/32" in marker.read_text()


@needs_root
def test_exec_of_an_unknown_node_is_a_usage_error(
    default_lab: LabState, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "exec", "real9", "--name", default_lab.name, "--", "true")
    assert code == 2
    assert (
        err
        == "l4lab: topology 'default' has no node 'real9' (nodes: client, router, lb, real1, real2, real3)\n"
    )


def test_exec_without_a_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "exec", "client", "--name", "lbt-none")
    assert code == 2
    assert err.count("\n") == 1 and "give a command after --" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["frobnicate"], "l4lab: argument VERB: invalid choice: 'frobnicate'"),
        (
            ["up", "nope"],
            "l4lab: unknown topology 'nope'; shipped topologies: bond-vlan, default, dual-stack, kernel-decap, "
            "many-reals, mtu, multi-lb, nic-rss, pmtu, two-arm",
        ),
        (["up", "--name", "Bad_Name"], "l4lab: lab name 'Bad_Name' is invalid"),
        (["status", "--bogus"], "l4lab: unrecognized arguments: --bogus"),
        ([], "l4lab: the following arguments are required: VERB"),
    ],
    ids=["verb", "topology", "lab-name", "option", "nothing"],
)
def test_usage_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith(message) and err.count("\n") == 1


def test_invalid_topology_file_exits_2_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = topology.resolve("default").read_text().replace('role = "lb"', 'role = "balancer"', 1)
    path = tmp_path / "broken.toml"
    path.write_text(text)
    code, _, err = run(capsys, "up", str(path), "--name", "lbt-never")
    assert code == 2
    assert err == (
        f"l4lab: {path}: nodes[2].role must be one of 'client', 'router', 'lb', 'real' but got 'balancer'\n"
    )
    assert probes.leftovers("lbt-never") == []


def test_runtime_errors_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "down", "--name", "lbt-none")
    assert code == 1
    assert err == (
        "l4lab: no lab named 'lbt-none' is up (/run/l4lab/lbt-none/state.json does not exist); "
        "start one with `l4lab up`\n"
    )


def test_verbs_are_a_table() -> None:
    assert {"up", "down", "status", "exec", "shell"} <= set(cli.VERBS)
    assert all(callable(v.run) and callable(v.add_arguments) for v in cli.VERBS.values())


@needs_root
def test_shell_opens_in_the_node(default_lab: LabState) -> None:
    env = {**os.environ, "SHELL": "/bin/sh", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "lab.cli", "shell", "real3", "--name", default_lab.name],
        input="ip -br addr show r3-rt; exit 5\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 5, done.stderr
    assert "203.0.113.50/28" in done.stdout


@needs_root
def test_nsexec_run_names_the_failing_command(default_lab: LabState) -> None:
    lb = f"{default_lab.name}-lb"
    assert nsexec.run(lb, ["ip", "-br", "link", "show", "lb-rt"]).stdout.startswith("lb-rt@")
    with pytest.raises(LabError, match=rf"'ip link show nope' in {lb} failed with exit code 1: "):
        nsexec.run(lb, ["ip", "link", "show", "nope"])


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == ""
    assert out == f"l4lab {metadata.version('l4lab')}\n"


def test_every_argument_has_help_and_every_verb_examples(capsys: pytest.CaptureFixture[str]) -> None:
    top = cli.parser()
    verbs = completion._subcommands(top)
    assert set(verbs) == set(cli.VERBS)
    for name, parser in [("", top), *verbs.items()]:
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                assert action.help, f"l4lab {name} {action.dest} has no help text"
        if not name:
            continue
        epilog = parser.epilog or ""
        assert epilog.startswith("examples:\n") and f"l4lab {name}" in epilog, f"l4lab {name} has no example"
        for example in epilog.splitlines()[1:]:  # every example of a verb l4lab parses itself parses
            words = shlex.split(example)[1:]
            if example.strip().startswith("l4lab ") and words[0] not in cli.PASSTHROUGH and ">" not in example:
                cli.parser().parse_args(words[: words.index("--")] if "--" in words else words)
    code, out, _ = run(capsys, "--help")
    assert code == 0 and all(f"  l4lab {v}" in out for v in cli.VERBS)  # one example per verb


@pytest.mark.parametrize("verb", cli.PASSTHROUGH)
def test_verbs_with_their_own_options_show_examples_that_use_them(verb: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`l4lab VERB --help` is the verb's own help (no root needed), then l4lab's examples of it."""
    code, out, err = run(capsys, verb, "--help")
    assert code == 0 and err == "", err
    assert out.startswith(f"usage: l4lab {verb}") and f"\nexamples:\n  l4lab {verb}" in out
    for example in cli.VERBS[verb].examples:
        for option in (w for w in shlex.split(example) if w.startswith("--")):
            assert f"{option} " in out.split("examples:")[0], f"`{example}` uses {option}, which l4lab {verb} lacks"


def test_bash_completion_follows_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    code, script, _ = run(capsys, "completion", "bash")
    assert code == 0 and script.rstrip().endswith("complete -F _l4lab l4lab")

    def complete(*words: str) -> list[str]:
        probe = (f"{script}\nCOMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
                 '_l4lab; printf "%s\\n" "${COMPREPLY[@]}"\n')
        done = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.split()

    assert complete("l4lab", "sh") == ["shell"]
    assert complete("l4lab", "vagrant-") == ["vagrant-plan", "vagrant-box"]
    assert complete("l4lab", "status", "--") == ["--help", "--name", "--json"]
    assert complete("l4lab", "completion", "") == ["-h", "--help", "bash"]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is missing: cannot drop root")
def test_root_verbs_are_refused_up_front_in_one_line() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: run as root (the test drops to uid 65534 itself)")

    def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "lab.cli", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
                              env={**os.environ, "HOME": "/nonexistent"})

    for argv in (["up", "--name", "lbt-nobody"], ["status"], ["demo"], ["exec", "client", "--", "true"]):
        done = as_nobody(*argv)
        assert done.returncode == 1, done
        assert done.stderr == f"l4lab: `l4lab {argv[0]}` must run as root (it works with network namespaces, " \
                              "links and BPF programs): run it with sudo\n"
    assert probes.leftovers("lbt-nobody") == []
    for argv in (["--version"], ["--help"], ["up", "--help"], ["demo", "--help"], ["completion", "bash"],
                 ["vagrant-plan", "default"]):
        done = as_nobody(*argv)
        assert done.returncode == 0 and done.stdout and done.stderr == "", done
