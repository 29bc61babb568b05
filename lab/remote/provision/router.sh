#!/usr/bin/env bash
# router.sh: the router's own rules: forward IPv4 and IPv6, and no reverse-path filter (DSR replies).
#
#   router.sh [--iface-all IFNAME...]
#
# DSR replies from the reals (source: a VIP) arrive on a real's link while the route to the VIP
# points at the LB, so strict rp_filter would drop them: off on all, default, lo and every IFNAME.
# The same values the netns lab sets from the topology's [roles.router.sysctls]. Idempotent.
set -euo pipefail

die() { echo "router.sh: $*" >&2; exit 1; }

ifnames=()
while [ $# -gt 0 ]; do
	case "$1" in
	--iface-all) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do ifnames+=("$1"); shift; done ;;
	*) die "unknown argument '$1' (see the usage at the top of this script)" ;;
	esac
done

sysctl -q -w net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 >/dev/null
for c in all default lo "${ifnames[@]}"; do
	sysctl -q -w "net.ipv4.conf.$c.rp_filter=0" >/dev/null || die "cannot turn rp_filter off on $c"
done
echo "router.sh: forwarding on, rp_filter off on: all default lo ${ifnames[*]}"
