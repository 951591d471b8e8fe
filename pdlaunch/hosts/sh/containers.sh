# Functions the container scripts share (a library: defines, runs nothing). The caller sets
# RT (docker or podman), NAME, CIDF (the --cidfile), DEP and PROC (the deployment and the
# process), LD and LP (pdlaunch's label keys for them), GRACE (seconds).
# $RT inspect fails with "no such container" (docker: "No such container", podman: "no such
# container") when it is gone; any other failure (runtime missing, daemon down) proves
# nothing, and says so (exit 5).
_exists() {  # $1=id or name: 0 exists, 1 gone, 5 unknown (stderr says why)
    _o=$("$RT" container inspect --format '{{.Id}}' "$1" 2>&1) && return 0
    case $_o in *[Nn]"o such container"*|*"no container with"*) return 1;; esac
    printf '%s\n' "$RT container inspect $1: $_o" | head -c 500 >&2; return 5; }
_cid() {  # the id in $CIDF: 64 hex digits (docker and podman write the full id); at most 66
    # bytes are read, so a file that is no cid file is never read or echoed whole. 4: none.
    _c=$(head -c 66 -- "$CIDF" 2>/dev/null) || return 4
    case $_c in *[!0-9a-f]*) return 4;; esac
    [ "${#_c}" -eq 64 ] || return 4
    printf '%s' "$_c"; }
_ours() {  # ids of containers named $NAME carrying our deployment and process labels
    "$RT" ps -a -q --no-trunc --filter "name=^$NAME\$" \
        --filter "label=$LD=$DEP" --filter "label=$LP=$PROC" 2>/dev/null; }
_missing_image() {  # $1=runtime $2=image: "runtime<TAB>image<TAB>why" unless it has it
    _o=$("$1" image inspect --format '{{.Id}}' "$2" 2>&1) \
        || printf '%s\t%s\t%s\n' "$1" "$2" "$(echo "$_o" | tail -n 1)"; }
_of_deployment() {  # "id process" of each container of $DEP: its deployment label, and the
    # name pdlaunch gives its process label's process (pdl-$DEP-<process>). 5: cannot say.
    # stdout only (a runtime's warnings go to stderr); asked again for the reason on failure
    _ids=$("$RT" ps -a -q --no-trunc --filter "label=$LD=$DEP" 2>/dev/null) || {
        _e=$("$RT" ps -a -q --filter "label=$LD=$DEP" 2>&1)
        echo "$RT ps: $_e" | head -c 2000 >&2; return 5; }
    for _id in $_ids; do
        case $_id in ''|*[!0-9a-f]*) continue;; esac
        # docker prints the name with a leading /, podman without
        _i=$("$RT" container inspect --format "{{.Name}} {{index .Config.Labels \"$LP\"}}" \
            "$_id" 2>/dev/null) || continue
        _n=${_i%% *}; _n=${_n#/}; _p=${_i#* }
        case $_p in ''|.*|*/*|*[!A-Za-z0-9_.-]*) continue;; esac
        [ "$_n" = "pdl-$DEP-$_p" ] && echo "$_id $_p"
    done
    return 0; }
_remove() {  # stop and remove each id given, then prove it gone: prints "removed ID...";
    # 3: one survived (stderr names it), 5: the runtime cannot say
    _removed=
    for _id in "$@"; do
        _exists "$_id"; _rc=$?
        [ $_rc = 1 ] && continue
        [ $_rc = 5 ] && return 5
        "$RT" stop -t "$GRACE" "$_id" >/dev/null 2>&1
        "$RT" rm -f "$_id" >/dev/null 2>&1
        _exists "$_id"; _rc=$?
        [ $_rc = 5 ] && return 5
        if [ $_rc = 0 ]; then echo "container $_id still exists after $RT rm -f" >&2; return 3; fi
        _removed="$_removed $_id"
    done
    echo "removed$_removed"; }
