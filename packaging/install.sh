#!/usr/bin/env bash
# install.sh: install the lbctl systemd unit and the example config (never overwriting a config).
#
#   sudo bash packaging/install.sh                 # into / ; then: systemctl enable --now lbctl
#   bash packaging/install.sh --root /tmp/stage    # into a staging root (also: DESTDIR=/tmp/stage)
#   bash packaging/install.sh --lbctl /usr/local/bin/lbctl
#
# Installs ROOT/etc/systemd/system/lbctl.service (ExecStart = --lbctl, else the installed `lbctl` on
# PATH; one inside this source tree is refused), ROOT/etc/l4lab/lb.toml only if it does not
# exist, and ROOT/etc/l4lab/lb.toml.example always. Running it again changes nothing that is
# already in place; each file is reported as installed, updated, unchanged or kept.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
root="${DESTDIR:-}"
lbctl=""

usage() { echo "usage: install.sh [--root DIR] [--lbctl PATH]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --root) [ $# -ge 2 ] || usage; root="$2"; shift 2 ;;
    --root=*) root="${1#--root=}"; shift ;;
    --lbctl) [ $# -ge 2 ] || usage; lbctl="$2"; shift 2 ;;
    --lbctl=*) lbctl="${1#--lbctl=}"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
root="${root%/}"

if [ -z "$lbctl" ]; then
  lbctl="$(command -v lbctl 2>/dev/null || true)"
  [ -n "$lbctl" ] || { echo "install.sh: cannot find an installed lbctl on PATH;" \
    "install the package (pip install . into a venv outside the source tree) or pass --lbctl PATH" >&2; exit 1; }
  case "$(readlink -f "$lbctl")" in
    "$repo"/*) echo "install.sh: the lbctl on PATH ($lbctl) lives in the source tree $repo; the unit runs an" \
                    "installed one: pip install . into a venv outside the tree, or pass --lbctl PATH" >&2; exit 1 ;;
  esac
fi
case "$lbctl" in
  /*) ;;
  *) echo "install.sh: --lbctl must be an absolute path (systemd needs one) but got '$lbctl'" >&2; exit 2 ;;
esac

# put SRC_TEXT DEST MODE: write DEST only when its content differs; report what happened.
put() {
  local text="$1" dest="$2" mode="$3" tmp
  mkdir -p "$(dirname "$dest")"
  tmp="$(mktemp "$(dirname "$dest")/.install.XXXXXX")"
  printf '%s\n' "$text" >"$tmp"
  chmod "$mode" "$tmp"
  if [ -f "$dest" ] && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"; echo "unchanged  $dest"
  elif [ -f "$dest" ]; then
    mv -f "$tmp" "$dest"; echo "updated    $dest"
  else
    mv -f "$tmp" "$dest"; echo "installed  $dest"
  fi
}

unit="$(sed "s|@LBCTL@|$lbctl|" "$here/lbctl.service")"
example="$(cat "$here/lb.toml")"

put "$unit" "$root/etc/systemd/system/lbctl.service" 0644
put "$example" "$root/etc/l4lab/lb.toml.example" 0644
if [ -e "$root/etc/l4lab/lb.toml" ]; then
  echo "kept       $root/etc/l4lab/lb.toml (exists; compare with lb.toml.example)"
else
  put "$example" "$root/etc/l4lab/lb.toml" 0644
fi

if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload
  echo "next: edit /etc/l4lab/lb.toml, then: systemctl enable --now lbctl"
else
  echo "next: edit ${root}/etc/l4lab/lb.toml; on the target host: systemctl daemon-reload && systemctl enable --now lbctl"
fi
