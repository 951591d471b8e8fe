# The runtime's status of the process's container (running, exited, ...), or none. Exit 5:
# the runtime cannot say. Needs containers.sh and its variables.
id=
if [ -s "$CIDF" ]; then id=$(_cid) || id=; fi
[ -n "$id" ] || id=$(_ours | head -n 1)
[ -n "$id" ] || { echo none; exit 0; }
_exists "$id"; rc=$?
[ $rc = 1 ] && { echo none; exit 0; }
[ $rc = 5 ] && exit 5
"$RT" container inspect --format '{{.State.Status}}' "$id"
