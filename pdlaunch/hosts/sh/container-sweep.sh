# Stop and remove every container of deployment $DEP on this host, whatever the record says
# (_of_deployment: pdlaunch's labels and name; a container with the label but another name
# was not started by pdlaunch and is left alone), then prove each gone. Prints "removed ID...".
# Exit 3: one survived; 5: the runtime cannot say. Needs containers.sh and its variables.
found=$(_of_deployment) || exit 5
# shellcheck disable=SC2046  # ids are 64 hex digits: split on purpose
_remove $(echo "$found" | cut -d ' ' -f 1) || exit $?
