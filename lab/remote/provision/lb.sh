#!/usr/bin/env bash
# lb.sh: the LB machine: installs l4lab from the synced repository, builds the datapath, loads and configures it.
#
#   lb.sh --repo DIR --topology TOPOLOGY --node NODE
#
# Runs DIR/scripts/setup.sh (packages, venv, bpffs), `make bpf` (nothing to do when the host's
# build/bpf came with the synced folder), writes the balancer config that
# `l4lab vagrant-plan TOPOLOGY --lb-config NODE` prints to /etc/l4lab/NODE.toml, then
# `lbctl load` (once) and `lbctl apply` (every run: it reconciles). On the local box (`l4lab
# vagrant-box`) the packages and Python modules are already there: DIR/.venv becomes its
# /opt/l4lab/venv and nothing is installed. Prints the XDP mode the datapath got. Idempotent.
set -euo pipefail

die() { echo "lb.sh: $*" >&2; exit 1; }

repo='' topo='' node=''
while [ $# -gt 0 ]; do
	case "$1" in
	--repo) repo=$2; shift 2 ;;
	--topology) topo=$2; shift 2 ;;
	--node) node=$2; shift 2 ;;
	*) die "unknown argument '$1' (see the usage at the top of this script)" ;;
	esac
done
if [ -z "$repo" ] || [ -z "$topo" ] || [ -z "$node" ]; then
	die "--repo, --topology and --node are required"
fi
[ -f "$repo/scripts/setup.sh" ] || die "$repo/scripts/setup.sh does not exist: is --repo the l4lab repository?"

cd "$repo"
box_venv=/opt/l4lab/venv
if [ -x "$box_venv/bin/python" ]; then
	[ -e .venv ] || ln -s "$box_venv" .venv
	mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf || die "cannot mount bpffs on /sys/fs/bpf"
else
	bash scripts/setup.sh || die "scripts/setup.sh failed (see above)"
fi
py=.venv/bin/python
# The host's build/bpf and build/lib come with the synced folder: up to date, make compiles nothing
# (the local box has no compiler); otherwise it builds them with setup.sh's clang.
if ! make bpf >/dev/null; then
	command -v clang >/dev/null || die "make bpf needs to compile and this machine has no clang (the local box" \
		"has none): run 'make bpf' on the host before 'vagrant up', its build/bpf is synced"
	die "make bpf failed: run it in $repo to see why"
fi

mkdir -p /etc/l4lab
config=/etc/l4lab/$node.toml
"$py" -m lab.cli vagrant-plan "$topo" --lb-config "$node" >"$config.tmp" \
	|| die "cannot generate the config of $node"
mv "$config.tmp" "$config"

if ! "$py" -m balancer.cli status >/dev/null 2>&1; then
	"$py" -m balancer.cli load --config "$config" || die "lbctl load --config $config failed"
fi
"$py" -m balancer.cli apply "$config" || die "lbctl apply $config failed"
ifname=$(sed -n 's/^interfaces = \["\([^"]*\)".*/\1/p' "$config")
mode=$(ip -d link show dev "$ifname" | grep -o 'xdp[a-z]*' | head -n 1)
case "$mode" in
xdp) echo "lb.sh: $node balances with $config in native XDP on $ifname" ;;
xdpgeneric) echo "lb.sh: $node balances with $config in generic XDP on $ifname (the driver refused native:" \
	"see dmesg; virtio-net needs its guest offloads off and enough queues)" ;;
*) die "no XDP program on $ifname after lbctl load" ;;
esac
