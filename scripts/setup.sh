#!/usr/bin/env bash
# setup.sh: installs everything l4lab needs on a Debian/Ubuntu machine, as root; idempotent.
#
#   scripts/setup.sh            system packages, the Python venv, bpffs/tracefs mounts
#   scripts/setup.sh --extra X  also the packages of feature X (vm, frr, trace, browser, tools, vagrant, ssh, perf)
#   scripts/setup.sh --all      every feature (what `make test` needs to run every suite)
#
# The VM's kernel is never installed on this host: `--extra vm` downloads the package that
# linux-image-cloud-amd64 depends on and unpacks it into build/vm/kernel/ (lab/remote/vm_init/image.py
# reads it there). A second run installs nothing. A package that cannot be installed is named on one line.
set -euo pipefail
cd "$(dirname "$0")/.."

# Core: build and run the datapath, the netns lab and the suites.
core_pkgs=(clang llvm libbpf-dev bpftool iproute2 ethtool tcpdump iptables procps
           python3 python3-venv python3-dev gcc make curl)
# Optional feature sets, installed on request (suites skip with the command to run).
declare -A extra_pkgs=(
  [vm]="qemu-system-x86 busybox-static cpio libc6-dev ipvsadm keepalived kmod"
  [frr]="frr"
  [trace]="python3-bpfcc linux-headers-amd64"
  [browser]="chromium"
  [tools]="tshark iperf3"
  [vagrant]="vagrant vagrant-libvirt libvirt-daemon-system dnsmasq-base qemu-utils qemu-system-x86 mmdebstrap e2fsprogs shellcheck python3-pip-whl"
  [ssh]="openssh-client openssh-server"
  [perf]="linux-perf"
)

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and mounts bpffs)"

wanted=("${core_pkgs[@]}")
vm_kernel=""
while [ $# -gt 0 ]; do
  case "$1" in
    --all) for x in "${!extra_pkgs[@]}"; do read -r -a more <<<"${extra_pkgs[$x]}"; wanted+=("${more[@]}"); done
           vm_kernel=1 ;;
    --extra) shift; [ -n "${extra_pkgs[$1]:-}" ] || die "unknown extra '$1' (known: ${!extra_pkgs[*]})"
             read -r -a more <<<"${extra_pkgs[$1]}"; wanted+=("${more[@]}")
             [ "$1" = vm ] && vm_kernel=1 ;;
    *) die "unknown argument '$1'" ;;
  esac
  shift
done

# Ubuntu names bpftool and perf differently: both ship in linux-tools-*.
if [ -r /etc/os-release ] && . /etc/os-release && [ "${ID:-}" = ubuntu ]; then
  for i in "${!wanted[@]}"; do
    case "${wanted[$i]}" in bpftool|linux-perf) wanted[$i]="linux-tools-common linux-tools-generic" ;; esac
  done
  read -r -a wanted <<<"${wanted[*]}"
fi

missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine has no package lists: update once before the first install.
  apt=(apt-get -o DPkg::Lock::Timeout=300 -y -q)
  "${apt[@]}" update >/dev/null || die "apt-get update failed"
  aptlog=$(mktemp)
  # Packages install but start no system service (frr, ssh): labs run their own daemons in namespaces.
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
  fi
  trap '[ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d' EXIT
  if ! "${apt[@]}" install --no-install-recommends "${missing[@]}" >"$aptlog" 2>&1; then
    for p in "${missing[@]}"; do
      if ! "${apt[@]}" install --no-install-recommends "$p" >"$aptlog" 2>&1; then
        tail -n 5 "$aptlog" >&2; rm -f "$aptlog"
        die "cannot install package '$p' (apt-get install $p failed; its last lines are above)"
      fi
    done
  fi
  rm -f "$aptlog"
  [ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d
  trap - EXIT
fi

# The VM's kernel: the image package linux-image-cloud-amd64 depends on, downloaded (not installed)
# and unpacked into build/vm/kernel/VERSION/{boot,lib/modules}; depmod writes the modules.dep that
# the package's postinst would have. Nothing goes into /boot, /lib/modules or dpkg's database.
unpack_vm_kernel() {
  local meta=linux-image-cloud-amd64 pkg dest work deb
  pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {print $2; exit}')
  if [ -z "$pkg" ]; then
    apt-get -o DPkg::Lock::Timeout=300 -y -q update >/dev/null || die "apt-get update failed"
    pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {print $2; exit}')
  fi
  [ -n "$pkg" ] || die "cannot find the kernel package behind '$meta' (apt-cache depends $meta names none)"
  dest="build/vm/kernel/${pkg#linux-image-}"
  [ -f "$dest/lib/modules/${pkg#linux-image-}/modules.dep" ] && return 0
  log "unpacking $pkg into $dest (not installed on this host)"
  mkdir -p build/vm/kernel
  work=$(mktemp -d build/vm/kernel/.download.XXXXXX)
  # -o APT::Sandbox::User=root: apt's _apt user cannot write into the work tree.
  (cd "$work" && apt-get -q -o APT::Sandbox::User=root download "$pkg" >/dev/null) \
    || { rm -rf "$work"; die "cannot download package '$pkg' (apt-get download $pkg failed)"; }
  deb=("$work"/*.deb)
  mkdir "$work/root"
  dpkg-deb -x "${deb[0]}" "$work/root" || { rm -rf "$work"; die "cannot unpack ${deb[0]}"; }
  depmod -b "$work/root" "${pkg#linux-image-}" \
    || { rm -rf "$work"; die "depmod failed for the unpacked kernel ${pkg#linux-image-}"; }
  rm -rf "$dest"
  mv "$work/root" "$dest"
  rm -rf "$work"
}
if [ -n "$vm_kernel" ]; then unpack_vm_kernel; fi

# The venv is made from the system interpreter so that Debian's python3-bpfcc (bcc) is importable.
venv=.venv
req_hash=$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -c1-16)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.l4lab-req" 2>/dev/null)" != "$req_hash" ]; then
  log "creating Python environment in $venv"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv" \
    || die "cannot create venv (is python3-venv installed?)"
  # Every package pinned with its hashes (requirements.lock, made by `make lock` from pyproject.toml).
  "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes -r requirements.lock \
    || die "pip install --require-hashes -r requirements.lock failed"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e . \
    || die "pip install -e . failed"
  echo "$req_hash" >"$venv/.l4lab-req"
fi

# Pseudo filesystems that are not mounted at boot on these machines.
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf || die "cannot mount bpffs on /sys/fs/bpf"
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
exit 0
