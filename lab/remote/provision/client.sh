#!/usr/bin/env bash
# client.sh: the client's tools: curl for HTTP through a VIP, python3 for the lab's probes and UDP.
#
#   client.sh [--repo DIR]
#
# Installs only what is missing (needs the machine's management network). With --repo, DIR/.venv is
# the Python the suites run there (`lab.nodes.traffic`): the local box's /opt/l4lab/venv, or a venv of
# the system's python3. Idempotent.
set -euo pipefail

die() { echo "client.sh: $*" >&2; exit 1; }

repo=
while [ $# -gt 0 ]; do
	case "$1" in
	--repo) repo=$2; shift 2 ;;
	*) die "unknown argument '$1' (see the usage at the top of this script)" ;;
	esac
done

missing=()
for tool in curl python3; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get -q update >/dev/null || die "apt-get update failed (is the management network up?)"
	apt-get -q -y install --no-install-recommends "${missing[@]}" >/dev/null \
		|| die "cannot install ${missing[*]}"
fi
if [ -n "$repo" ] && [ ! -e "$repo/.venv/bin/python" ]; then
	if [ -x /opt/l4lab/venv/bin/python ]; then
		ln -sfn /opt/l4lab/venv "$repo/.venv"
	else
		python3 -m venv --without-pip --system-site-packages "$repo/.venv" || die "cannot make $repo/.venv"
	fi
fi
echo "client.sh: curl and python3 present${repo:+; the repository is in $repo}"
