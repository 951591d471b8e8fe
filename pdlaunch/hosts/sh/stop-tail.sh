# Stop a `tail` follow-log.sh started, if that pid still is a tail: closing an SSH channel
# does not stop a quiet `tail -F` on the host (no SIGPIPE until it writes).
# $1=pid
[ "$(cat "/proc/$1/comm" 2>/dev/null)" = tail ] && kill "$1" 2>/dev/null
true
