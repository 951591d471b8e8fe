# Functions the process scripts share (a library: defines, runs nothing).
# /proc/PID/stat: after the last ')' come field 3 (state), 4 (ppid), 5 (pgrp), ...,
# 22 (starttime) -> $1, $2, $3, ..., ${20} of _stat's output.
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
