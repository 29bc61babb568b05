#!/bin/sh
# init.sh: /init of the l4lab real-server VM: kernel decap (tunl0, fou/GUE) of traffic for VIPs on lo.
#
# Settings come from the kernel command line (lab/remote/vm.py writes them):
#   l4lab.name=NAME  l4lab.addr=A.B.C.D/P  l4lab.gw=A.B.C.D  l4lab.vips=V1,V2,...
#   l4lab.gue=P1,P2  (GUE ports: variant 0 header and variant 1 direct IP, both on each port;
#                     also over IPv6 when addr6 is set)
#   l4lab.fou=P1,P2  (plain IPIP-in-UDP ports, `ip fou ... ipproto 4`; 0 = none)
#   l4lab.addr6=X::Y/P  l4lab.gw6=X::Z   (optional IPv6 on eth0; VIPs may be IPv6 too)
#   l4lab.http=80  l4lab.echo=9000
#   l4lab.queues=N  (a multiqueue NIC: N combined channels)  l4lab.rsskey=6d:5a:...  (switch RSS on)
# A shell loop on ttyS1 (the control channel, lab/remote/vm.py) runs "ID COMMAND LINE" requests and
# answers "L4LAB-BEGIN ID", the command's output, then "L4LAB-DONE ID STATUS".
# It prints one line to the console when done: "L4LAB-READY name=NAME uptime=SECONDS", or
# "L4LAB-FAILED name=NAME step=STEP: OUTPUT" and powers off.
export PATH=/bin

# busybox runs its own applets before PATH lookup; its `ip` has no `fou`: call iproute2's by path.
ip() { /usr/sbin/ip "$@"; }

name=vm gw= addr= vips= gue=6080 fou=0 addr6= gw6= http=80 echo=9000 queues=1 rsskey=

# fail, run, the pseudo filesystems and the control channel (start_control, below).
. /etc/l4lab/control.sh

for w in $(cat /proc/cmdline); do
	case "$w" in
	l4lab.*=*)
		k=${w%%=*}
		v=${w#*=}
		case "${k#l4lab.}" in
		name) name=$v ;; addr) addr=$v ;; gw) gw=$v ;; vips) vips=$v ;; gue) gue=$v ;;
		fou) fou=$v ;; addr6) addr6=$v ;; gw6) gw6=$v ;; http) http=$v ;; echo) echo=$v ;;
		queues) queues=$v ;; rsskey) rsskey=$v ;;
		esac ;;
	esac
done
[ -n "$addr" ] || fail cmdline "l4lab.addr is missing from the kernel command line"

# Real-server rules for DSR: never answer ARP for the VIPs, accept traffic whose reply leaves
# another way. Set the defaults first so tunl0, created by ipip, inherits them.
for c in all default; do
	run sysctl sysctl -q -w net.ipv4.conf.$c.rp_filter=0 net.ipv4.conf.$c.arp_ignore=1 \
		net.ipv4.conf.$c.arp_announce=2
done

while read -r m; do
	run insmod insmod "/lib/modules/$m"
done </etc/l4lab/modules

run link ip link set lo up
run link ip link set eth0 up
# qemu does RSS only once the guest sends its settings, and the driver does not at boot. The order
# matters: channels first (a later -L switches qemu's RSS off again), then rxhash, then key and table.
if [ "$queues" -gt 1 ]; then
	run channels ethtool -L eth0 combined "$queues"
fi
if [ -n "$rsskey" ]; then
	run rxhash ethtool -K eth0 rxhash on
	run rsskey ethtool -X eth0 hkey "$rsskey" equal "$queues"
fi
run addr ip addr add "$addr" dev eth0
[ -z "$gw" ] || run route ip route add default via "$gw"
if [ -n "$addr6" ]; then
	run addr6 ip -6 addr add "$addr6" dev eth0 nodad
	[ -z "$gw6" ] || run route6 ip -6 route add default via "$gw6"
fi
for v in $(echo "$vips" | tr , ' '); do
	case "$v" in
	*:*) run vip ip -6 addr add "$v/128" dev lo ;;
	*) run vip ip addr add "$v/32" dev lo ;;
	esac
done

# Kernel decap: tunl0 takes any IPIP packet, ip6tnl0 (mode any) 6in6 and 4in6; fou hands
# UDP payloads to them.
run tunl0 ip link set tunl0 up
run tunl0 sysctl -q -w net.ipv4.conf.tunl0.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0
if [ -d /sys/class/net/ip6tnl0 ]; then
	run ip6tnl0 ip -6 tunnel change ip6tnl0 mode any
	run ip6tnl0 ip link set ip6tnl0 up
fi
# GUE ports take variant 0 (4-byte header) and variant 1 (IP right after UDP) alike.
for p in $(echo "$gue" | tr , ' '); do
	run fou ip fou add port "$p" gue
	[ -z "$addr6" ] || run fou6 ip -6 fou add port "$p" gue
done
for p in $(echo "$fou" | tr , ' '); do
	[ "$p" = 0 ] || run fou ip fou add port "$p" ipproto 4
done

mkdir -p /www
echo "l4lab real server $name" >/www/index.html
run httpd httpd -p "$http" -h /www
udp_echo "$echo" &

start_control

read -r up _ </proc/uptime
echo "L4LAB-READY name=$name uptime=$up" >/dev/console
while :; do sleep 3600; done
