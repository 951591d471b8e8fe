# _find: is a process start.sh started still running? (a library: defines, runs nothing;
# needs proc.sh). A pid file alone is not proof: the pid may have been reused. A process
# start.sh started has its log open as stdout (an `up` that rotated the log renamed it to
# .prev).
_find() {  # $1=key $2=pid file $3=log file $4=pid ("" to read the pid file); prints "key pid starttime"
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
