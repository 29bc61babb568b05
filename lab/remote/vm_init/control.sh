# control.sh: what both /init scripts (init.sh, ipvs_init.sh) share: failing in one console line,
# running a step, the pseudo filesystems, and the VM's control channel.
#
# fail STEP OUTPUT: report "L4LAB-FAILED name=NAME step=STEP: OUTPUT" on the console and power off.
# run STEP COMMAND...: run COMMAND; on failure report STEP with the command's output.
# settings KEY...: the named settings from the kernel command line (l4lab.KEY=VALUE).
#
# A shell loop on ttyS1 (a Unix socket on the host: lab/remote/vm.py guest_run) runs "ID COMMAND LINE"
# requests and answers "L4LAB-BEGIN ID", the command's output, then "L4LAB-DONE ID STATUS".
# Commands get no terminal on their input (ipvsadm, for one, hangs reading a console).

fail() {
	echo "L4LAB-FAILED name=$name step=$1: $2" >/dev/console
	poweroff -f
}

run() {
	step=$1
	shift
	out=$("$@" 2>&1) || fail "$step" "'$*': $out"
}

# settings KEY...: set each variable KEY from l4lab.KEY=VALUE on the kernel command line.
settings() {
	for w in $(cat /proc/cmdline); do
		case "$w" in
		l4lab.*=*)
			k=${w%%=*}
			k=${k#l4lab.}
			for want in "$@"; do
				[ "$k" != "$want" ] || eval "$k=\${w#*=}"
			done ;;
		esac
	done
}

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null

control() {
	while IFS= read -r req; do
		id=${req%% *}
		echo "L4LAB-BEGIN $id"
		sh -c "${req#* }" </dev/null 2>&1
		echo "L4LAB-DONE $id $?"
	done
}

# start_control: serve the channel in the background if the VM has a second serial port.
start_control() {
	[ -c /dev/ttyS1 ] || return 0
	# Held open from here on: bytes that arrive before the loop reads are kept, not dropped.
	exec 3<>/dev/ttyS1
	run control stty -F /dev/ttyS1 raw -echo
	control <&3 >&3 2>&1 &
}
