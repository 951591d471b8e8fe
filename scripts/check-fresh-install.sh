#!/usr/bin/env bash
# Prove the install's machine-level steps work from a machine state without them, on this
# machine: a green CI on a machine an earlier install prepared can hide a missing step.
#
#   bash scripts/check-fresh-install.sh            # the container step (CI runs this)
#   bash scripts/check-fresh-install.sh --venv     # also: a throwaway venv gets pdlaunch[dev]
#                                                  # from this clone and its CLI answers
#
# The container step: podman's containers.conf drop-in that scripts/container-image.sh writes
# (host rlimits, runc) is moved aside, then container-image.sh must classify the trial's
# failure and make podman start a container again by itself. The old drop-in is put back only
# if that fails, so the machine is never left worse than it was.
set -euo pipefail
cd "$(dirname "$0")/.."

conf=/etc/containers/containers.conf.d/50-pdlaunch-sandbox.conf
if [ "$(id -u)" = 0 ] && command -v podman >/dev/null 2>&1; then
  saved=""
  if [ -e "$conf" ]; then
    saved="$(mktemp)"
    mv "$conf" "$saved"
    echo "check-fresh-install: moved $conf aside"
  fi
  if ! bash scripts/container-image.sh; then
    [ -z "$saved" ] || mv "$saved" "$conf"
    echo "check-fresh-install: FAIL: the container step does not work from a fresh state" >&2
    exit 1
  fi
  [ -z "$saved" ] || rm -f "$saved"
  echo "check-fresh-install: container step ok ($([ -e "$conf" ] && echo "drop-in written anew" || echo "no drop-in needed"))"
else
  echo "check-fresh-install: container step not checked (needs root and podman)"
fi

if [ "${1:-}" = --venv ]; then
  venv="$(mktemp -d)"
  trap 'rm -rf "$venv"' EXIT
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q -e '.[dev]'
  "$venv/bin/pdlaunch" --help >/dev/null
  "$venv/bin/pdlaunch" validate topologies/local-cpu.yaml >/dev/null
  echo "check-fresh-install: venv ok (pdlaunch[dev] from this clone; --help and validate answer)"
fi
