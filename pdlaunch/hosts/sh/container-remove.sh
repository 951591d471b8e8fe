# Stop and remove the process's container(s) (by the id in $CIDF, and by name and labels),
# then prove each gone. Prints "removed ID...". Exit 3: one survived; 4: $CIDF holds no id;
# 5: the runtime cannot say. Needs containers.sh and its variables.
ids=
if [ -s "$CIDF" ]; then
    cid=$(_cid) || { echo "$CIDF does not hold a container id (64 hex digits)" >&2; exit 4; }
    ids=$cid
fi
ids="$ids $(_ours)"
# shellcheck disable=SC2086  # ids are 64 hex digits: split on purpose
out=$(_remove $ids) || exit $?
rm -f -- "$CIDF"
echo "$out"
