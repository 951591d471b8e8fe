# Every container of deployment $DEP on this host (_of_deployment), one "id process status"
# line each (status: the runtime's, or gone), then "end". Exit 5: the runtime cannot say.
# Needs containers.sh and its variables.
found=$(_of_deployment) || exit 5
echo "$found" | while read -r id proc; do
    [ -n "$id" ] || continue
    st=$("$RT" container inspect --format '{{.State.Status}}' "$id" 2>/dev/null) || st=gone
    echo "$id $proc $st"
done
echo end
