#!/usr/bin/env bash
# lb.sh: the LB machine: installs l4lab from the synced repository, builds the datapath, loads and configures it.
#
#   lb.sh --repo DIR --topology TOPOLOGY --node NODE
#
# Runs DIR/scripts/setup.sh (packages, venv, bpffs), `make bpf`, writes the balancer config that
# `l4lab vagrant-plan TOPOLOGY --lb-config NODE` prints to /etc/l4lab/NODE.toml, then
# `lbctl load` (once) and `lbctl apply` (every run: it reconciles). Idempotent.
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
bash scripts/setup.sh || die "scripts/setup.sh failed (see above)"
make bpf >/dev/null || die "make bpf failed: run it in $repo to see why"

mkdir -p /etc/l4lab
config=/etc/l4lab/$node.toml
.venv/bin/l4lab vagrant-plan "$topo" --lb-config "$node" >"$config.tmp" || die "cannot generate the config of $node"
mv "$config.tmp" "$config"

if ! .venv/bin/lbctl status >/dev/null 2>&1; then
	.venv/bin/lbctl load --config "$config" || die "lbctl load --config $config failed"
fi
.venv/bin/lbctl apply "$config" || die "lbctl apply $config failed"
echo "lb.sh: $node balances with $config"
