#!/usr/bin/env bash
# lock.sh: regenerate requirements.lock, every Python package of the venv (all extras) pinned with hashes.
#
#   scripts/lock.sh        (make lock; needs PyPI; takes minutes)
#
# The pins come from pyproject.toml (the same as requirements.txt); pip-tools runs from a throw-away
# venv under build/, and the project's own line (the dev extra names l4lab[lab,report]) is dropped.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=build/piptools
[ -x "$tools/bin/pip-compile" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install -q pip-tools==7.4.1; }
# Resolve from PyPI only, as a fresh machine does (no local wheel folders or extra indexes).
env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null "$tools/bin/pip-compile" -q --generate-hashes --allow-unsafe \
  --strip-extras --no-emit-index-url --no-emit-find-links --no-header --extra lab,report,trex,dev \
  --output-file requirements.lock.new pyproject.toml
python3 scripts/lock_tidy.py requirements.lock.new >requirements.lock
rm requirements.lock.new
