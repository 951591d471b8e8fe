# _private_dirs: check the directories pdlaunch writes into (a library: defines, runs
# nothing). Each: ours, not a link, not writable by anyone else; every ancestor owned by root
# or us, and sticky where others may write (OpenSSH's StrictModes rule), so nobody else can
# swap a directory, a script or a secret file under our feet. One `stat` for all of them and
# their ancestors (each once): a fork per path made this most of `up`'s CPU on a host.
_private_dirs() {  # $@=dirs; creates missing ones (0700); stderr names the bad one
    _me=$(id -u); _n=$#; _seen='
'; _for=
    for _d in "$@"; do
        case $_d in /*) ;; *) _d=$PWD/$_d;; esac
        while [ "$_d" != / ] && [ "${_d%/}" != "$_d" ]; do _d=${_d%/}; done
        if [ -L "$_d" ]; then echo "$_d is a symbolic link" >&2; return 1; fi
        if [ ! -d "$_d" ]; then
            (umask 077 && mkdir -p -- "$_d") || return 1
        fi
        set -- "$@" "$_d"
        _seen="$_seen$_d
"  # a dir's own check is stricter than its check as another one's parent
    done
    shift "$_n"  # now: the dirs, absolute
    _n=$#
    for _d in "$@"; do
        _a=$_d
        while [ "$_a" != / ]; do
            _a=${_a%/*}; [ -n "$_a" ] || _a=/
            case $_seen in *"
$_a
"*) break;; esac  # and so are its parents
            _seen="$_seen$_a
"; _for="$_for$_d
"
            set -- "$@" "$_a"
        done
    done
    _i=0
    _out=$(stat -L -c '%u %a %U' -- "$@") || return 1
    for _p in "$@"; do
        _i=$((_i + 1))
        _l=${_out%%
*}; _out=${_out#*
}
        set -- $_l
        if [ "$_i" -le "$_n" ]; then
            if [ "$1" != "$_me" ]; then
                echo "$_p is owned by $3 (uid $1), not by $(id -un) (uid $_me)" >&2; return 1
            fi
            case $2 in *[2367]?|*[2367])
                echo "$_p is writable by others (mode $2)" >&2; return 1;; esac
            continue
        fi
        _d=${_for%%
*}; _for=${_for#*
}
        if [ "$1" != 0 ] && [ "$1" != "$_me" ]; then
            echo "$_p (a parent of $_d) is owned by $3 (uid $1): it could swap $_d" >&2
            return 1
        fi
        case $2 in
            [1357]???) ;;  # sticky: others cannot rename what is ours
            *[2367]?|*[2367])
                echo "$_p (a parent of $_d) is writable by others (mode $2), not sticky" >&2
                return 1;;
        esac
    done
    return 0
}
