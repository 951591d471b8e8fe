#!/usr/bin/env bash
# Regenerate pdlaunch/spec/facts/vllm-*.json for every vLLM series pdlaunch supports, each from the
# release's own wheel, and run the matrix check (scripts/check_vllm_matrix.py) against it.
#
#   scripts/gen_all_vllm_facts.sh               # every release in VERSIONS
#   scripts/gen_all_vllm_facts.sh 0.23.0 0.27.1 # some
#   KEEP=0 scripts/gen_all_vllm_facts.sh ...    # delete each venv after use (disk: ~1 GB each)
#   CHECK=1 scripts/gen_all_vllm_facts.sh ...   # only verify the shipped files are current
#
# The base (0.32) comes from the project's .venv (`python scripts/gen_vllm_facts.py`; a test
# keeps it current). Every other release gets a throwaway venv /tmp/vv-X (scripts/vllm_venv.sh)
# and ships as its differences from the base. To add a release: add it to VERSIONS, run this
# for it, commit the new JSON and the matrix line it prints (docs/vllm-versions.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export VLLM_TARGET_DEVICE=cpu  # describe each release as its CPU build (0.33: `vllm` wheel)
VERSIONS=(0.10.2 0.11.2 0.12.0 0.13.0 0.14.1 0.15.1 0.16.0 0.17.1 0.18.1 0.19.1 0.20.2
          0.21.0 0.22.1 0.23.0 0.24.0 0.25.1 0.26.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.33.0)
[ $# -gt 0 ] && VERSIONS=("$@")
cd "$root"
check=(); [ "${CHECK:-0}" = 1 ] && check=(--check)
"$root/.venv/bin/python" scripts/gen_vllm_facts.py "${check[@]}"
for v in "${VERSIONS[@]}"; do
  dir=/tmp/vv-$v
  scripts/vllm_venv.sh "$v" "$dir" > "/tmp/vv-$v.log" 2>&1 || { echo "$v: venv failed (see /tmp/vv-$v.log)"; continue; }
  "$dir/bin/python" scripts/gen_vllm_facts.py --vllm-only "${check[@]}" 2> "/tmp/vv-$v.gen.log" \
    || { echo "$v: generator failed or facts stale (see /tmp/vv-$v.gen.log)"; continue; }
  "$dir/bin/python" scripts/check_vllm_matrix.py > "/tmp/vv-$v.check.log" 2>&1 || true
  echo "$v: $(grep -v '^[A-Z]' "/tmp/vv-$v.check.log" | tail -1)   (details: /tmp/vv-$v.check.log)"
  [ "${KEEP:-1}" = 0 ] && rm -rf "$dir"
done
