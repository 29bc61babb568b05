#!/usr/bin/env bash
# real.sh: a real server for direct server return: VIPs on lo, ARP suppressed, kernel decap, HTTP and UDP echo.
#
#   real.sh --name NODE [--vip ADDR]... [--gue-port PORT]... [--http ADDR:PORT]...
#           [--udp-echo ADDR:PORT]... [--repo DIR]
#
# The same rules as the VM real (lab/remote/vm_init/init.sh) and the netns lab's [roles.real.sysctls]:
# arp_ignore=1, arp_announce=2 and rp_filter=0 on all, default and lo; each VIP on lo; tunl0 up
# (IPIP, module ipip), ip6tnl0 in mode any (6in6 and 4in6, module ip6_tunnel) when a VIP is IPv6,
# and `ip fou add port PORT gue` (module fou, and fou6 for IPv6) for GUE. The services are
# `python3 -m lab.services` from the repository DIR, as in the netns lab; their pid, log and ready
# file go to $L4LAB_RUN_DIR (default /run/l4lab-real). DIR/.venv, the Python the suites run there,
# is the local box's /opt/l4lab/venv or a venv of the system's python3.
#
# Exit 0 when done, 1 on a failed step, 3 when a kernel module the decap needs is missing (the
# message names it). Idempotent: a second run changes nothing and succeeds.
set -euo pipefail

die() { echo "real.sh: $*" >&2; exit 1; }
no_module() {
	echo "real.sh: kernel module '$1' is missing: $2, and 'modprobe $1' failed; boot a kernel" \
		"that has it (Debian's has), or use BPF decap (decap.bpf.c) as the netns lab does" >&2
	exit 3
}

name='' repo='' vips=() gue_ports=() http=() udp_echo=()
while [ $# -gt 0 ]; do
	case "$1" in
	--name) name=$2; shift 2 ;;
	--vip) vips+=("$2"); shift 2 ;;
	--gue-port) gue_ports+=("$2"); shift 2 ;;
	--http) http+=("$2"); shift 2 ;;
	--udp-echo) udp_echo+=("$2"); shift 2 ;;
	--repo) repo=$2; shift 2 ;;
	*) die "unknown argument '$1' (see the usage at the top of this script)" ;;
	esac
done
[ -n "$name" ] || die "--name NODE is required"
ipv6=0
for v in "${vips[@]}"; do case "$v" in *:*) ipv6=1 ;; esac; done

# 1. DSR rules. The defaults first, so that tunl0 (created by the ipip module) inherits them.
for c in all default lo; do
	sysctl -q -w "net.ipv4.conf.$c.rp_filter=0" "net.ipv4.conf.$c.arp_ignore=1" \
		"net.ipv4.conf.$c.arp_announce=2" >/dev/null || die "cannot set the ARP/rp_filter sysctls on $c"
done

# 2. The VIPs on lo.
ip link set dev lo up
for v in "${vips[@]}"; do
	case "$v" in
	*:*) ip -6 addr replace "$v/128" dev lo nodad ;;
	*) ip addr replace "$v/32" dev lo ;;
	esac
done

# 3. Kernel decap: tunl0 takes IPIP, ip6tnl0 (mode any) 6in6 and 4in6; fou hands GUE payloads to them.
# has_link NAME: whether this namespace has the interface (never /sys/class/net: it may show another netns).
has_link() { ip link show dev "$1" >/dev/null 2>&1; }

has_link tunl0 || modprobe ipip 2>/dev/null || true
has_link tunl0 || no_module ipip "tunl0 does not exist"
ip link set dev tunl0 up
sysctl -q -w net.ipv4.conf.tunl0.rp_filter=0 >/dev/null
if [ "$ipv6" = 1 ]; then
	has_link ip6tnl0 || modprobe ip6_tunnel 2>/dev/null || true
	has_link ip6tnl0 || no_module ip6_tunnel "ip6tnl0 does not exist"
	ip -6 tunnel change ip6tnl0 mode any
	ip link set dev ip6tnl0 up
fi
if [ ${#gue_ports[@]} -gt 0 ]; then
	ip fou show >/dev/null 2>&1 || modprobe fou 2>/dev/null || true
	ip fou show >/dev/null 2>&1 || no_module fou "'ip fou show' cannot reach the kernel's fou family"
	# `ip -6 fou show` answers without fou6 (fou's netlink family is fou.ko's): load it outright
	if [ "$ipv6" = 1 ]; then
		modprobe fou6 2>/dev/null || true
	fi
fi
# GUE ports take variant 0 (4-byte header) and variant 1 (IP right after UDP) alike. `ip fou show`
# and `ip -6 fou show` both list every port of both families, an IPv6 one as "port P gue -6":
# match whole lines, or the IPv4 port passes for the IPv6 one (which then was never added).
for p in "${gue_ports[@]}"; do
	ip fou show | grep -qx "port $p gue" || ip fou add port "$p" gue || die "cannot add GUE port $p"
	if [ "$ipv6" = 1 ]; then
		ip fou show 2>/dev/null | grep -qx "port $p gue -6" || ip -6 fou add port "$p" gue \
			|| no_module fou6 "'ip -6 fou add port $p gue' failed"
	fi
done

# 4. The services, restarted only when their arguments change.
if [ ${#http[@]} -gt 0 ] || [ ${#udp_echo[@]} -gt 0 ]; then
	[ -n "$repo" ] || die "--repo DIR (the l4lab repository) is required to run the services"
	[ -f "$repo/lab/services.py" ] || die "$repo/lab/services.py does not exist: is --repo the l4lab repository?"
	command -v python3 >/dev/null || die "python3 is missing: apt-get install python3"
	if [ ! -e "$repo/.venv/bin/python" ] && [ -w "$repo" ]; then
		if [ -x /opt/l4lab/venv/bin/python ]; then
			ln -sfn /opt/l4lab/venv "$repo/.venv"
		else
			python3 -m venv --without-pip --system-site-packages "$repo/.venv" || die "cannot make $repo/.venv"
		fi
	fi
	run=${L4LAB_RUN_DIR:-/run/l4lab-real}
	mkdir -p "$run"
	args=(-m lab.services --lab vagrant --node "$name" --ready-file "$run/services.ready")
	for h in "${http[@]}"; do args+=(--http "$h"); done
	for u in "${udp_echo[@]}"; do args+=(--udp-echo "$u"); done
	pid=$(cat "$run/services.pid" 2>/dev/null || true)
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(cat "$run/services.args")" = "${args[*]}" ]; then
		echo "real.sh: $name services already running (pid $pid)"
	else
		[ -z "$pid" ] || kill "$pid" 2>/dev/null || true
		rm -f "$run/services.ready"
		PYTHONPATH=$repo setsid python3 "${args[@]}" </dev/null >"$run/services.log" 2>&1 &
		echo $! >"$run/services.pid"
		echo "${args[*]}" >"$run/services.args"
		# Poll for the ready file (written once every socket is bound), with a deadline.
		for _ in $(seq 100); do
			[ -e "$run/services.ready" ] && break
			kill -0 "$(cat "$run/services.pid")" 2>/dev/null \
				|| die "the services exited: $(tail -n 3 "$run/services.log")"
			sleep 0.1
		done
		[ -e "$run/services.ready" ] || die "the services were not ready within 10 s; see $run/services.log"
	fi
fi
echo "real.sh: $name serves ${vips[*]} with kernel decap (tunl0${gue_ports[*]:+, GUE ${gue_ports[*]}})"
