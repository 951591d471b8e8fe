# Stop and remove every container of deployment $DEP on this host, whatever the record says:
# those carrying pdlaunch's deployment label $LD=$DEP whose name is pdlaunch's for the process
# their $LP label names (pdl-$DEP-<process>); a container with the label but another name
# was not started by pdlaunch and is left alone. Then prove each gone. Prints "removed ID...".
# Exit 3: one survived; 5: the runtime cannot say. Needs containers.sh and its variables.
ids=$("$RT" ps -a -q --no-trunc --filter "label=$LD=$DEP" 2>&1) \
    || { echo "$RT ps: $ids" | head -c 2000 >&2; exit 5; }
removed=
for id in $ids; do
    case $id in ''|*[!0-9a-f]*) continue;; esac
    # docker prints the name with a leading /, podman without
    info=$("$RT" container inspect --format "{{.Name}} {{index .Config.Labels \"$LP\"}}" \
        "$id" 2>/dev/null) || continue
    name=${info%% *}; name=${name#/}; proc=${info#* }
    case $proc in ''|.*|*/*|*[!A-Za-z0-9_.-]*) continue;; esac
    [ "$name" = "pdl-$DEP-$proc" ] || continue
    _exists "$id"; rc=$?
    [ $rc = 1 ] && continue
    [ $rc = 5 ] && exit 5
    "$RT" stop -t "$GRACE" "$id" >/dev/null 2>&1
    "$RT" rm -f "$id" >/dev/null 2>&1
    _exists "$id"; rc=$?
    [ $rc = 5 ] && exit 5
    if [ $rc = 0 ]; then echo "container $id ($name) still exists after $RT rm -f" >&2; exit 3; fi
    removed="$removed $id"
done
echo "removed$removed"
