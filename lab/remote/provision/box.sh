#!/usr/bin/env bash
# box.sh: turns a bootstrapped (mmdebstrap) Debian 12 root into the local Vagrant box; runs inside that root (chroot) at build time.
#
#   box.sh --pubkey FILE
#
# Called by `l4lab vagrant-box` (lab/remote/vagrantbox.py), never on a running machine. It adds the
# `vagrant` user with the public key in FILE (Vagrant's well-known insecure key) and passwordless
# sudo, a DHCP client on the management NIC (eth0) only, sshd with host keys made at first boot, the
# light init /usr/local/sbin/l4lab-init (booted instead of systemd by init= on the kernel command line), a
# Python environment for l4lab at /opt/l4lab/venv (Debian's python3-numpy and python3-pyroute2:
# the machines need no network to provision), and removes documentation and package caches.
set -euo pipefail

die() { echo "box.sh: $*" >&2; exit 1; }

pubkey=''
while [ $# -gt 0 ]; do
	case "$1" in
	--pubkey) pubkey=$2; shift 2 ;;
	*) die "unknown argument '$1' (see the usage at the top of this script)" ;;
	esac
done
[ -r "$pubkey" ] || die "--pubkey FILE is required and must be readable"

# The vagrant user: Vagrant logs in with the insecure key (and replaces it on first `vagrant up`).
id vagrant >/dev/null 2>&1 || useradd --create-home --shell /bin/bash vagrant
install -d -m 700 -o vagrant -g vagrant /home/vagrant/.ssh
install -m 600 -o vagrant -g vagrant "$pubkey" /home/vagrant/.ssh/authorized_keys
printf 'vagrant ALL=(ALL) NOPASSWD: ALL\nDefaults:vagrant !requiretty\n' >/etc/sudoers.d/vagrant
chmod 440 /etc/sudoers.d/vagrant
passwd -d root >/dev/null

echo l4lab-box >/etc/hostname
printf '127.0.0.1\tlocalhost\n127.0.1.1\tl4lab-box\n::1\tlocalhost ip6-localhost ip6-loopback\n' >/etc/hosts
printf '/dev/vda\t/\text4\tdefaults,noatime,errors=remount-ro\t0\t1\n' >/etc/fstab

# Only the management NIC is networkd's; the lab NICs (eth1...) belong to common.sh, and routes
# networkd did not make are left alone when Vagrant restarts it to change the hostname.
mkdir -p /etc/systemd/network /etc/systemd/networkd.conf.d
printf '[Match]\nName=eth0\n\n[Network]\nDHCP=ipv4\nIPv6AcceptRA=no\n\n[DHCPv4]\nClientIdentifier=mac\n' \
	>/etc/systemd/network/50-mgmt.network
# Every machine makes its own machine-id at first boot (one shared id means one shared DHCP lease).
: >/etc/machine-id
rm -f /var/lib/dbus/machine-id
printf '[Network]\nManageForeignRoutes=no\nManageForeignRoutingPolicyRules=no\n' \
	>/etc/systemd/networkd.conf.d/50-l4lab.conf
systemctl enable systemd-networkd.service >/dev/null 2>&1
# sshd's host key is made on each machine's first boot, not shared by every machine of the box:
# ed25519 only (an RSA key takes minutes of TCG CPU when six machines boot at once).
rm -f /etc/ssh/ssh_host_*
mkdir -p /etc/systemd/system/ssh.service.d
key=/etc/ssh/ssh_host_ed25519_key
printf '[Service]\nExecStartPre=\nExecStartPre=/bin/sh -c "test -e %s || ssh-keygen -q -t ed25519 -N \x27\x27 -f %s"\nExecStartPre=/usr/sbin/sshd -t\n' \
	"$key" "$key" >/etc/systemd/system/ssh.service.d/50-hostkeys.conf
printf 'HostKey %s\nUseDNS no\nPasswordAuthentication no\n' "$key" >/etc/ssh/sshd_config.d/50-l4lab.conf
systemctl enable ssh.service >/dev/null 2>&1
# Nothing runs behind the lab's back (no timers fetching package lists on an isolated network).
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
	systemctl mask "$unit" >/dev/null 2>&1 || true
done
systemctl set-default multi-user.target >/dev/null 2>&1

# The light init (init=/usr/local/sbin/l4lab-init on the kernel command line, `l4lab vagrant-plan
# --box-init light`): what a lab machine needs of a boot and no more, for the smoke that must be quick
# under TCG. The same root, kernel and provisioning as under systemd: file systems, the sysctl.d
# defaults, the NIC driver, DHCP on the management NIC (klibc's ipconfig, as the initramfs uses it;
# libvirt's dnsmasq tells Vagrant the address), a host key and sshd; then it reaps orphans forever.
cat >/usr/local/sbin/l4lab-init <<'INIT'
#!/bin/bash
# l4lab-init: PID 1 of the local box's light boot (written by lab/remote/provision/box.sh).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
say() { echo "l4lab-init: $*" >/dev/console; }
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mountpoint -q /dev/pts || mount -t devpts -o gid=5,mode=620 devpts /dev/pts
mountpoint -q /run || mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
mount -o remount,rw /
hostname "$(cat /etc/hostname)"
[ -s /etc/machine-id ] || tr -d - </proc/sys/kernel/random/uuid >/etc/machine-id
sysctl -q --system >/dev/null 2>&1 || say "sysctl --system failed"
ip link set dev lo up
modprobe virtio_net || say "modprobe virtio_net failed"
/usr/lib/klibc/bin/ipconfig -t 60 -c dhcp -d eth0 >/run/ipconfig.log 2>&1 || say "no DHCP answer on eth0"
[ -e /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
mkdir -p /run/sshd && chmod 755 /run/sshd
/usr/sbin/sshd || say "sshd did not start"
say "ready: $(ip -4 -o addr show dev eth0 | awk '{print $4}')"
while :; do sleep 3600 & wait $!; done
INIT
chmod 755 /usr/local/sbin/l4lab-init

# l4lab's Python environment: the system interpreter and Debian's numpy and pyroute2.
[ -x /opt/l4lab/venv/bin/python ] || python3 -m venv --without-pip --system-site-packages /opt/l4lab/venv
/opt/l4lab/venv/bin/python -c 'import numpy, pyroute2' || die "numpy or pyroute2 is not importable"

# Small: no documentation, manuals, locales or package caches.
rm -rf /usr/share/doc/* /usr/share/man/* /usr/share/info/* /var/cache/apt/* /var/lib/apt/lists/*
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'en*' -exec rm -rf {} +
printf 'path-exclude /usr/share/doc/*\npath-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n' \
	>/etc/dpkg/dpkg.cfg.d/50-l4lab-nodoc
echo "box.sh: the box root is ready"
