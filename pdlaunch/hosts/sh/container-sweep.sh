# Stop and remove every container of deployment $DEP on this host, whatever the record says
# (_of_deployment: pdlaunch's labels and name; a container with the label but another name
# was not started by pdlaunch and is left alone), then prove each gone. Prints "removed ID...".
# Exit 3: one survived; 5: the runtime cannot say. Needs containers.sh and its variables.
found=$(_of_deployment) || exit 5
removed=
for id in $(echo "$found" | cut -d ' ' -f 1); do
    _exists "$id"; rc=$?
    [ $rc = 1 ] && continue
    [ $rc = 5 ] && exit 5
    "$RT" stop -t "$GRACE" "$id" >/dev/null 2>&1
    "$RT" rm -f "$id" >/dev/null 2>&1
    _exists "$id"; rc=$?
    [ $rc = 5 ] && exit 5
    if [ $rc = 0 ]; then echo "container $id still exists after $RT rm -f" >&2; exit 3; fi
    removed="$removed $id"
done
echo "removed$removed"
