#!/bin/sh
# ipvs_init.sh: /init of the IPVS load-balancer VM: Linux IPVS in tunnel mode as a device under test.
#
# Settings come from the kernel command line (lab/dut/ipvs.py writes them):
#   l4lab.name=NAME  l4lab.addr=A.B.C.D/P  l4lab.gw=A.B.C.D  l4lab.vips=V1,V2,...
#   l4lab.addr6=X::Y/P  l4lab.gw6=X::Z   (optional IPv6 on eth0, for IPv6 VIPs)
# The VIPs go on lo so that IPVS sees their traffic in LOCAL_IN. The VM then serves commands on
# its control channel (control.sh, beside this file). It prints "L4LAB-READY name=NAME uptime=SECONDS" on
# the console when done, or "L4LAB-FAILED name=NAME step=STEP: OUTPUT" and powers off.
export PATH=/bin:/usr/sbin

ip() { /usr/sbin/ip "$@"; }

name=ipvs gw= addr= vips= addr6= gw6=

# fail, run, the pseudo filesystems and the control channel (start_control, below).
. /etc/l4lab/control.sh

for w in $(cat /proc/cmdline); do
	case "$w" in
	l4lab.*=*)
		k=${w%%=*}
		v=${w#*=}
		case "${k#l4lab.}" in
		name) name=$v ;; addr) addr=$v ;; gw) gw=$v ;; vips) vips=$v ;; addr6) addr6=$v ;; gw6) gw6=$v ;;
		esac ;;
	esac
done
[ -n "$addr" ] || fail cmdline "l4lab.addr is missing from the kernel command line"

while read -r m; do
	run insmod insmod "/lib/modules/$m"
done </etc/l4lab/modules

# The LB never answers ARP for the VIPs: the router reaches it by its own address.
for c in all default; do
	run sysctl sysctl -q -w net.ipv4.conf.$c.arp_ignore=1 net.ipv4.conf.$c.arp_announce=2 \
		net.ipv4.conf.$c.rp_filter=0
done
# Tunnelled frames must leave with DF as the client sent it; IPVS answers too-big itself.
run sysctl sysctl -q -w net.ipv4.vs.pmtu_disc=1

run link ip link set lo up
run eth0 ip link set eth0 up
run addr ip addr add "$addr" dev eth0
[ -z "$gw" ] || run route ip route add default via "$gw"
if [ -n "$addr6" ]; then
	run sysctl6 sysctl -q -w net.ipv6.conf.eth0.accept_dad=0 net.ipv6.conf.eth0.accept_ra=0
	run addr6 ip -6 addr add "$addr6" dev eth0 nodad
	[ -z "$gw6" ] || run route6 ip -6 route add default via "$gw6"
fi
for v in $(echo "$vips" | tr ',' ' '); do
	case "$v" in
	*:*) run vip6 ip -6 addr add "$v/128" dev lo ;;
	*) run vip ip addr add "$v/32" dev lo ;;
	esac
done

start_control
up=$(cut -d' ' -f1 /proc/uptime)
echo "L4LAB-READY name=$name uptime=$up" >/dev/console
while :; do sleep 3600; done
