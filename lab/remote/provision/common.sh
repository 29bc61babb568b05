#!/usr/bin/env bash
# common.sh: what every lab machine takes from the topology: NIC names and MTUs, addresses, offloads, sysctls, routes.
#
#   common.sh --name NODE [--iface MAC IFNAME MTU]... [--addr IFNAME CIDR]...
#             [--offload IFNAME FEATURE on|off]... [--sysctl KEY VALUE]... [--route DST VIA]...
#
# The NIC that holds MAC is renamed IFNAME (the topology's interface name), so every later step,
# the balancer config and the tests name the same interfaces as in the netns lab. The arguments
# come from `l4lab vagrant-plan`. Idempotent: a second run changes nothing and succeeds.
set -euo pipefail

die() { echo "common.sh: $*" >&2; exit 1; }

name='' ifaces=() addrs=() offloads=() sysctls=() routes=()
while [ $# -gt 0 ]; do
	case "$1" in
	--name) name=$2; shift 2 ;;
	--iface) [ $# -ge 4 ] || die "--iface needs MAC IFNAME MTU"; ifaces+=("$2 $3 $4"); shift 4 ;;
	--addr) [ $# -ge 3 ] || die "--addr needs IFNAME CIDR"; addrs+=("$2 $3"); shift 3 ;;
	--offload) [ $# -ge 4 ] || die "--offload needs IFNAME FEATURE on|off"; offloads+=("$2 $3 $4"); shift 4 ;;
	--sysctl) [ $# -ge 3 ] || die "--sysctl needs KEY VALUE"; sysctls+=("$2=$3"); shift 3 ;;
	--route) [ $# -ge 3 ] || die "--route needs DST VIA"; routes+=("$2 $3"); shift 3 ;;
	*) die "unknown argument '$1' (see the usage at the top of this script)" ;;
	esac
done
[ -n "$name" ] || die "--name NODE is required"

# nic_with_mac MAC: the name of the interface holding MAC, or nothing.
nic_with_mac() {
	ip -o link show | awk -v mac="$1" '{
		for (i = 1; i < NF; i++) if ($i == "link/ether" && tolower($(i + 1)) == tolower(mac)) {
			n = $2; sub(/:$/, "", n); sub(/@.*/, "", n); print n; exit
		}
	}'
}

for entry in "${ifaces[@]}"; do
	read -r mac ifname mtu <<<"$entry"
	current=$(nic_with_mac "$mac")
	[ -n "$current" ] || die "no NIC has MAC $mac (wanted as $ifname); check the machine's private networks"
	if [ "$current" != "$ifname" ]; then
		ip link set dev "$current" down
		ip link set dev "$current" name "$ifname" || die "cannot rename $current to $ifname"
	fi
	ip link set dev "$ifname" mtu "$mtu"
	ip link set dev "$ifname" up
done
ip link set dev lo up

# Sysctls first: accept_dad and the like must hold before the addresses arrive.
for kv in "${sysctls[@]}"; do
	sysctl -q -w "$kv" >/dev/null || die "cannot set sysctl $kv"
done

for entry in "${addrs[@]}"; do
	read -r ifname cidr <<<"$entry"
	case "$cidr" in
	*:*) ip -6 addr replace "$cidr" dev "$ifname" nodad ;;
	*) ip addr replace "$cidr" dev "$ifname" ;;
	esac
done

for entry in "${offloads[@]}"; do
	read -r ifname feature state <<<"$entry"
	command -v ethtool >/dev/null || die "ethtool is missing: apt-get install ethtool"
	ethtool -K "$ifname" "$feature" "$state" || die "cannot turn $feature $state on $ifname"
done

for entry in "${routes[@]}"; do
	read -r dst via <<<"$entry"
	ip route replace "$dst" via "$via" || die "cannot add route $dst via $via"
done

echo "common.sh: $name configured (${#ifaces[@]} interfaces, ${#addrs[@]} addresses, ${#routes[@]} routes)"
