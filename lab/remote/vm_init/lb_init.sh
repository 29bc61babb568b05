#!/bin/sh
# lb_init.sh: /init of the l4lab LB VM: the LB's uplink is a bond of two links carrying an 802.1Q VLAN,
# and at the bond's other end, in the namespace "sw", its top-of-rack switch; l4lab's balancer runs on
# the bond (lbctl, loaded over the control channel: lab/remote/lbvm.py).
#
#   eth0 (virtio; its tap is in the router's namespace)
#     netns sw: br0, a VLAN-aware bridge: eth0 an access port of VLAN $vlan (untagged), swbond a trunk
#               (tagged); swbond = the bond of sw0a and sw0b (the switch's end, LACP partner in 802.3ad)
#   veth pairs sw0a-lb0a, sw0b-lb0b: the two links
#   bond0 = the bond of lb0a and lb0b (XDP attaches here); bond0.$vlan holds addr, addr6 and the routes
#
# The switch's ends send the tag inside the frame (tx VLAN offload off: XDP sees only what is in the
# frame) and complete checksums (tx checksum offload off: the NIC hands on the router's partial ones, and
# the LB forwards what it gets, as on any veth that feeds it: DESIGN.md), and run an XDP_PASS program: the frames the LB's XDP sends back through the bond leave by
# XDP_TX when the bond picks the link they came in on, and a veth whose peer has no XDP program counts
# those as sent and never delivers them (GRO on is enough for redirected ones only: DESIGN.md). In
# active-backup both bonds prefer link a, in 802.3ad and balance-xor both hash layer 3+4, and both
# watch their links every 100 ms (LACP at the fast rate).
#
# Settings come from the kernel command line:
#   l4lab.name=NAME  l4lab.addr=A.B.C.D/P  l4lab.gw=A.B.C.D  l4lab.addr6=X::Y/P  l4lab.gw6=X::Z
#   l4lab.bond=active-backup|802.3ad|balance-xor  l4lab.vlan=ID  l4lab.ifname=bond0
# `/init uplink MODE` builds the links, bonds and VLAN again in another bond mode (unload the balancer
# first: a bond does not change mode under XDP) and waits until the bonds carry traffic; `/init settled
# MODE` says (exit status) whether they do.
# At boot it prints "L4LAB-READY name=NAME uptime=SECONDS" on the console, or "L4LAB-FAILED ..." and
# powers off (control.sh).
export PATH=/bin:/usr/sbin:/usr/bin
export PYTHONPATH=/opt/l4lab:/opt/l4lab/site PYTHONDONTWRITEBYTECODE=1 HOME=/root

ip() { /usr/sbin/ip "$@"; }
ipsw() { /usr/sbin/ip -n sw "$@"; }

name=lb gw= addr= addr6= gw6= bond=active-backup vlan=100 ifname=bond0

case "$1" in
uplink | settled)
	. /etc/l4lab/settings  # what the boot read from the kernel command line
	fail() { echo "lb_init.sh: step $1: $2" >&2; exit 1; }
	run() { step=$1; shift; out=$("$@" 2>&1) || fail "$step" "'$*': $out"; }
	;;
*)
	# fail, run, settings, the pseudo filesystems and the control channel (start_control, below).
	. /etc/l4lab/control.sh
	settings name addr gw addr6 gw6 bond vlan ifname
	printf "name=%s addr=%s gw=%s addr6=%s gw6=%s bond=%s vlan=%s ifname=%s\n" "$name" "$addr" "$gw" "$addr6" \
		"$gw6" "$bond" "$vlan" "$ifname" >/etc/l4lab/settings
	;;
esac

bond_opts() {
	case "$1" in
	active-backup) echo "mode active-backup miimon 100" ;;
	802.3ad) echo "mode 802.3ad miimon 100 lacp_rate fast xmit_hash_policy layer3+4" ;;
	balance-xor) echo "mode balance-xor miimon 100 xmit_hash_policy layer3+4" ;;
	*) return 1 ;;
	esac
}

# settled MODE: whether both bonds carry traffic as MODE does with both links up (active-backup: on link a).
settled() {
	lb=$(ip -d link show "$ifname") sw=$(ipsw -d link show swbond) || return 1
	case "$1" in
	active-backup) echo "$lb" | grep -q "active_slave lb0a " && echo "$sw" | grep -q "active_slave sw0a " ;;
	802.3ad) echo "$lb" | grep -q "num_ports 2 " && echo "$sw" | grep -q "num_ports 2 " ;;
	*) [ "$( (ip -d link show master "$ifname"; ipsw -d link show master swbond) | grep -c "mii_status UP")" = 4 ] ;;
	esac
}

# uplink MODE: (re)build both ends of the bonded, tagged uplink in bond mode MODE.
uplink() {
	opts=$(bond_opts "$1") || fail uplink "unknown bond mode '$1' (active-backup, 802.3ad or balance-xor)"
	ip link del "$ifname" 2>/dev/null
	ipsw link del swbond 2>/dev/null
	for l in a b; do
		ip link del "lb0$l" 2>/dev/null
		run veth ip link add "lb0$l" type veth peer name "sw0$l"
		run offload ethtool -K "sw0$l" txvlan off tx off
		run veth ip link set "sw0$l" netns sw
		run xdp ipsw link set dev "sw0$l" xdpdrv obj /opt/l4lab/build/bpf/pass.o sec xdp
	done
	# shellcheck disable=SC2086 # the options are words
	run bond ip link add "$ifname" type bond $opts
	# shellcheck disable=SC2086
	run swbond ipsw link add swbond type bond $opts
	for l in a b; do
		run enslave ip link set "lb0$l" master "$ifname"
		run enslave ipsw link set "sw0$l" master swbond
	done
	if [ "$1" = active-backup ]; then
		run primary ip link set "$ifname" type bond primary lb0a
		run primary ipsw link set swbond type bond primary sw0a
	fi
	run trunk ipsw link set swbond master br0
	run trunk bridge -n sw vlan add dev swbond vid "$vlan"
	for l in a b; do
		run up ip link set "lb0$l" up
		run up ipsw link set "sw0$l" up
	done
	run up ipsw link set swbond up
	run up ip link set "$ifname" up
	run vlan ip link add link "$ifname" name "$ifname.$vlan" type vlan id "$vlan"
	run addr ip addr add "$addr" dev "$ifname.$vlan"
	run up ip link set "$ifname.$vlan" up
	[ -z "$gw" ] || run route ip route add default via "$gw"
	if [ -n "$addr6" ]; then
		run addr6 ip -6 addr add "$addr6" dev "$ifname.$vlan" nodad
		[ -z "$gw6" ] || run route6 ip -6 route add default via "$gw6"
	fi
	i=0
	until settled "$1"; do
		i=$((i + 1))
		[ "$i" -lt 300 ] || fail uplink "the $1 bonds did not carry traffic within 30 s: $(cat "/proc/net/bonding/$ifname")"
		sleep 0.1
	done
}

case "$1" in
settled)
	settled "$2"
	exit ;;
uplink)
	uplink "$2"
	exit 0 ;;
esac

[ -n "$addr" ] || fail cmdline "l4lab.addr is missing from the kernel command line"
while read -r m; do
	run insmod insmod "/lib/modules/$m"
done </etc/l4lab/modules

mkdir -p /run /sys/fs/bpf /root
printf 'root:x:0:0:root:/root:/bin/sh\n' >/etc/passwd  # tcpdump drops its privileges to a named user
printf 'root:x:0:\n' >/etc/group
printf '#!/bin/sh\nexec python3 -m balancer.cli "$@"\n' >/usr/bin/lbctl  # as on any LB host
chmod 755 /usr/bin/lbctl
run bpffs mount -t bpf bpf /sys/fs/bpf
for c in all default; do
	run sysctl sysctl -q -w net.ipv6.conf.$c.accept_dad=0 net.ipv6.conf.$c.accept_ra=0
done
run link ip link set lo up
run netns ip netns add sw
run switch ip link set eth0 netns sw
run switch ipsw link set lo up
run switch ipsw link add br0 type bridge vlan_filtering 1 vlan_default_pvid 0
run switch ipsw link set eth0 master br0
run switch bridge -n sw vlan add dev eth0 vid "$vlan" pvid untagged
run switch ipsw link set eth0 up
run switch ipsw link set br0 up
uplink "$bond"

start_control

read -r up _ </proc/uptime
echo "L4LAB-READY name=$name uptime=$up" >/dev/console
while :; do sleep 3600; done
