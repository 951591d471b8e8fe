# Start a command detached: its own session and process group (setsid; its pid is the pgid),
# stdin /dev/null, stdout+stderr appended to the log, its pid written to the pid file
# (atomically, before the command starts). Prints "PID STARTTIME" ("PID" alone when it had
# already ended). Needs proc.sh. Exit 97: could not start.
# $1=pid file $2=log file $3=command (run by sh -c) [$4=working directory]
pidf=$1; logf=$2; cmd=$3
case $pidf in /*) ;; *) pidf=$PWD/$pidf;; esac
case $logf in /*) ;; *) logf=$PWD/$logf;; esac
for d in "${pidf%/*}/" "${logf%/*}/"; do [ -d "$d" ] || mkdir -p -- "$d" || exit 97; done
rm -f -- "$pidf" "$pidf.tmp"
[ $# -lt 4 ] || cd -- "$4" || exit 97
command -v setsid >/dev/null 2>&1 || { echo "setsid not found (util-linux)" >&2; exit 97; }
setsid -f sh -c 'set -C; echo $$ > "$1.tmp" && mv -f -- "$1.tmp" "$1" && exec sh -c "$2"' \
    pdlaunch-detached "$pidf" "$cmd" </dev/null >>"$logf" 2>&1 || exit 97
i=0
while [ ! -s "$pidf" ]; do
    i=$((i+1)); [ $i -gt 1000 ] && { echo "pid file $pidf was not written" >&2; exit 97; }
    sleep 0.01
done
read -r pid < "$pidf" || exit 97
# its start time in the same round trip: recorded with the pid, it tells a reused pid apart
s=$(_stat "$pid") && set -- $s || set -- X
case $1 in Z|X|x) echo "$pid";; *) echo "$pid ${20}";; esac
