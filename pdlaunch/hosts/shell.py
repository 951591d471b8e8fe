"""The sh text the host layer runs on every target: quoting, the owned-script guard, and the
process-management scripts (start, stop, find, private dirs, put) that read ``/proc``. Plain
constants and pure functions; :mod:`pdlaunch.hosts.base` sends them."""

from __future__ import annotations

import os
import shlex


def sh_quote_path(path: str) -> str:
    """Quote ``path`` for sh, expanding a leading ``~`` / ``~/`` to the target's ``$HOME``."""
    path = os.fspath(path)
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# Exec the script in $s only if it is a file (not a link) owned by the running user and
# writable by nobody else; exit 96 otherwise. Constant sh text: the SSH start command and the
# Slurm node runner (pdlaunch.backends.slurm) both end with it.
EXEC_OWNED = (
    'if [ -L "$s" ] || [ ! -f "$s" ] || [ "$(stat -c %u -- "$s")" != "$(id -u)" ]; then '
    'echo "pdlaunch: refusing to run $s: not a file owned by $(id -un)" >&2; exit 96; fi; '
    'case $(stat -c %a -- "$s") in *[2367]?|*[2367]) '
    'echo "pdlaunch: refusing to run $s: writable by others" >&2; exit 96;; esac; '
    'exec "$s"'
)


def exec_owned_script(script: str) -> str:
    """Exec the script only if it is still ours and nobody else could have changed it since
    the upload (the work dir is checked too, but a script is what runs with our rights)."""
    return f"s={sh_quote_path(script)}; {EXEC_OWNED}"


def _check_pid(pid: int) -> int:
    pid = int(pid)
    if pid <= 1:
        # kill -- -1 / -0 would hit every process we may signal: never allow it.
        raise ValueError(f"refusing to act on pid {pid}")
    return pid


# Shell functions shared by the process-management scripts. ``/proc/PID/stat``: after the last
# ')' come field 3 (state), 4 (ppid), 5 (pgrp), ..., 22 (starttime) -> $1, $2, $3, ..., ${20}.
_SH_FUNCS = r"""
_stat() { { read -r _l < "/proc/$1/stat"; } 2>/dev/null || return 1; set -- ${_l##*)}; echo "$*"; }
_alive() {  # $1=pid: running (not zombie/dead)
    _s=$(_stat "$1") || return 1; set -- $_s
    case $1 in Z|X|x) return 1;; esac; return 0; }
_group() {  # print live members of process group $PGID
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v pg="$PGID" '{
        s = $0; sub(/.*\) /, "", s); split(s, f, " ")
        if (f[3] == pg && f[1] !~ /^[ZXx]/) print $1 }'; }
_holders() {  # $1=log: "pid pgrp" of each live process with the log (or its .prev) as stdout/err
    _hl=$1
    for _hd in /proc/[0-9]*; do
        [ "$_hd/fd/1" -ef "$_hl" ] || [ "$_hd/fd/2" -ef "$_hl" ] \
            || [ "$_hd/fd/1" -ef "$_hl.prev" ] || [ "$_hd/fd/2" -ef "$_hl.prev" ] || continue
        _hs=$(_stat "${_hd#/proc/}") || continue
        set -- $_hs
        case $1 in Z|X|x) continue;; esac
        echo "${_hd#/proc/} $3"
    done; }
"""

_START_SCRIPT = r"""
pidf={pid_file}; logf={log_file}
case $pidf in /*) ;; *) pidf=$PWD/$pidf;; esac
case $logf in /*) ;; *) logf=$PWD/$logf;; esac
for d in "${{pidf%/*}}/" "${{logf%/*}}/"; do [ -d "$d" ] || mkdir -p -- "$d" || exit 97; done
rm -f -- "$pidf" "$pidf.tmp"
{cd}
command -v setsid >/dev/null 2>&1 || {{ echo "setsid not found (util-linux)" >&2; exit 97; }}
setsid -f sh -c 'set -C; echo $$ > "$1.tmp" && mv -f -- "$1.tmp" "$1" && exec sh -c "$2"' \
    pdlaunch-detached "$pidf" {command} </dev/null >>"$logf" 2>&1 || exit 97
i=0
while [ ! -s "$pidf" ]; do
    i=$((i+1)); [ $i -gt 1000 ] && {{ echo "pid file $pidf was not written" >&2; exit 97; }}
    sleep 0.01
done
read -r pid < "$pidf" || exit 97
# its start time in the same round trip: recorded with the pid, it tells a reused pid apart
s=$(_stat "$pid") && set -- $s || set -- X
case $1 in Z|X|x) echo "$pid";; *) echo "$pid ${{20}}";; esac
"""

_STOP_SCRIPT = r"""
PID={pid}; PGID={pid}; START={start}; GRACE_CS={grace_cs}; LOGF={log}
_now() {{  # centiseconds since boot
    read -r _u _ < /proc/uptime; _s=${{_u%.*}}; _c=${{_u#*.}}; echo $((_s * 100 + 1$_c - 100)); }}
mode=group; proven=
if s=$(_stat $PID); then
    set -- $s
    if [ -n "$START" ] && [ "${{20}}" != "$START" ]; then echo reused; exit 0; fi
    [ "$3" = "$PID" ] || mode=pid
    case $1 in Z|X|x) [ -n "$START" ] && proven=start;; *) proven=alive;; esac
fi
if [ -z "$proven" ] && [ -n "$LOGF" ]; then
    # The leader is gone (or a zombie we cannot date): its group (an engine's children) is
    # ours only while a member still holds our log; a group id is not reused while the group
    # has members.
    [ -n "$(_holders "$LOGF" | awk -v pg="$PGID" '$2 == pg')" ] || {{ echo none; exit 0; }}
fi
alive() {{ if [ $mode = group ]; then [ -n "$(_group)" ]; else _alive $PID; fi; }}
sig() {{ if [ $mode = group ]; then kill -s $1 -- -$PGID; else kill -s $1 $PID; fi; }} 2>/dev/null
alive || {{ echo none; exit 0; }}
sig TERM
end=$(( $(_now) + GRACE_CS ))
while alive; do
    [ "$(_now)" -ge $end ] && break
    sleep 0.1
done
alive || {{ echo term; exit 0; }}
sig KILL
end=$(( $(_now) + 3000 ))  # a 2 GB engine on a loaded host: seen alive 10 s after SIGKILL
while alive; do
    if [ "$(_now)" -ge $end ]; then
        echo "still alive after SIGKILL: $(_group | tr '\n' ' ')" >&2; exit 3
    fi
    sleep 0.05
done
echo kill
"""


# A pid file alone is not proof: the pid may have been reused. A process start_detached started
# has its log open as stdout (an `up` that rotated the log renamed it to .prev).
_FIND_FUNC = r"""
_find() {  # $1=key $2=pid file $3=log file $4=pid ("" to read the pid file)
    _k=$1; _lf=$3; _p=$4
    if [ -z "$_p" ]; then
        [ -f "$2" ] || return 0
        read -r _p < "$2" 2>/dev/null || return 0
    fi
    case $_p in ''|*[!0-9]*) return 0;; esac
    [ "$_p" -gt 1 ] || return 0
    { [ "/proc/$_p/fd/1" -ef "$_lf" ] || [ "/proc/$_p/fd/1" -ef "$_lf.prev" ]; } || return 0
    _s=$(_stat "$_p") || return 0
    set -- $_s
    case $1 in Z|X|x) return 0;; esac
    echo "$_k $_p ${20}"
}
"""

# Checks the directories pdlaunch writes into: ours, not a link, not writable by anyone else;
# and every ancestor owned by root or us, and sticky where others may write (OpenSSH's
# StrictModes rule), so nobody else can swap a directory, a script or a secret file under our
# feet. One `stat` for all of them and their ancestors (each once): a fork per path made
# this most of `up`'s CPU on a host.
_PRIVATE_DIR_FUNC = r"""
_private_dirs() {  # $@=dirs; creates missing ones (0700)
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
"""

# Writes the next SIZE bytes of stdin to PATH atomically (temp file in the same dir, 0600 until
# chmod, then rename). `head -c` reads no byte past SIZE (coreutils, busybox), so the files of
# one upload follow each other on one stdin; a short read (the upload was cut) is refused.
_PUT_FUNC = r"""
_put() {  # $1=path $2=mode (octal) $3=size
    _p=$1
    case $_p in */*) _d=${_p%/*}; [ -n "$_d" ] || _d=/;; *) _d=.;; esac
    [ -d "$_d" ] || mkdir -p -- "$_d" || return 1
    if [ -d "$_p" ]; then echo "$_p is a directory" >&2; return 1; fi
    _t=$(umask 077 && mktemp "$_d/.pdlaunch-put.XXXXXX") || return 1
    if head -c "$3" > "$_t" && [ "$(wc -c < "$_t")" -eq "$3" ] && chmod "$2" "$_t" \
        && mv -f -- "$_t" "$_p"; then return 0; fi
    rm -f -- "$_t"; return 1
}
_keep() {  # $1=path: renamed to PATH.prev if it exists (a log starts afresh; the old one stays)
    # A link there (dangling too) is removed: the start appends to this path, never through one.
    if [ -L "$1" ]; then rm -f -- "$1" || return 1
    elif [ -f "$1" ]; then mv -f -- "$1" "$1.prev" || return 1; fi; return 0
}
"""
