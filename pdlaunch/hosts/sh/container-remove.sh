# Stop and remove the process's container(s) (by the id in $CIDF, and by name and labels),
# then prove each gone. Prints "removed ID...". Exit 3: one survived; 4: $CIDF holds no id;
# 5: the runtime cannot say. Needs containers.sh and its variables.
ids=
if [ -s "$CIDF" ]; then
    cid=$(_cid) || { echo "$CIDF does not hold a container id (64 hex digits)" >&2; exit 4; }
    ids=$cid
fi
ids="$ids $(_ours)"
removed=
for id in $ids; do
    _exists "$id"; rc=$?
    [ $rc = 1 ] && continue
    [ $rc = 5 ] && exit 5
    "$RT" stop -t "$GRACE" "$id" >/dev/null 2>&1
    "$RT" rm -f "$id" >/dev/null 2>&1
    _exists "$id"; rc=$?
    [ $rc = 5 ] && exit 5
    if [ $rc = 0 ]; then echo "container $id ($NAME) still exists after $RT rm -f" >&2; exit 3; fi
    removed="$removed $id"
done
rm -f -- "$CIDF"
echo "removed$removed"
