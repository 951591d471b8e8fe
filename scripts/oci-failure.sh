# Why an OCI runtime refused a trial container, from what podman printed; sourced by
# scripts/container-image.sh and by its tests (tests/packaging/test_container_install.py).
#
#   oci_failure_cause "$text"    # prints rlimit, hybrid-cgroups or other
#
# The same cause is worded differently by each runtime (tests/fixtures/install/ has each
# wording, with its source): runc says "error setting rlimit type 7: operation not
# permitted", crun "setrlimit `RLIMIT_NOFILE`: Operation not permitted"; crun alone refuses a
# host that mixes cgroup v1 and v2 ("cgroups in hybrid mode not supported").
oci_failure_cause() {
  local text
  text="$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]')"
  case $text in
    *"cgroups in hybrid mode"*) echo hybrid-cgroups ;;
    *setrlimit*"not permitted"*|*"setting rlimit"*"not permitted"*) echo rlimit ;;
    *) echo other ;;
  esac
}
