# Stop the process group led by a pid: SIGTERM, wait up to the grace, SIGKILL, then prove it
# gone. Prints none (nothing of ours ran), reused (the pid is another process now, or it holds
# no log of ours), term or kill; exit 3 when the group is still alive after SIGKILL. Needs
# proc.sh.
# $1=pid $2=its start time ('' unknown) $3=grace in centiseconds $4=its log file ('' none)
PID=$1; PGID=$1; START=$2; GRACE_CS=$3; LOGF=$4
_now() {  # centiseconds since boot
    read -r _u _ < /proc/uptime; _s=${_u%.*}; _c=${_u#*.}; echo $((_s * 100 + 1$_c - 100)); }
mode=group; proven=
if s=$(_stat $PID); then
    set -- $s
    if [ -n "$START" ] && [ "${20}" != "$START" ]; then echo reused; exit 0; fi
    [ "$3" = "$PID" ] || mode=pid
    case $1 in Z|X|x) [ -n "$START" ] && proven=start;; *) proven=alive;; esac
fi
if [ "$proven" = alive ] && [ -n "$LOGF" ]; then
    # A live pid with the right start time is ours only while it, or a member of its group,
    # holds our log: a pid and its start time can be read from /proc and copied into a record.
    [ -n "$(_holders "$LOGF" | awk -v p="$PID" -v pg="$PGID" '$1 == p || $2 == pg')" ] \
        || { echo reused; exit 0; }
fi
if [ -z "$proven" ] && [ -n "$LOGF" ]; then
    # The leader is gone (or a zombie we cannot date): its group (an engine's children) is
    # ours only while a member still holds our log; a group id is not reused while the group
    # has members.
    [ -n "$(_holders "$LOGF" | awk -v pg="$PGID" '$2 == pg')" ] || { echo none; exit 0; }
fi
alive() { if [ $mode = group ]; then [ -n "$(_group)" ]; else _alive $PID; fi; }
sig() { if [ $mode = group ]; then kill -s $1 -- -$PGID; else kill -s $1 $PID; fi; } 2>/dev/null
alive || { echo none; exit 0; }
sig TERM
end=$(( $(_now) + GRACE_CS ))
while alive; do
    [ "$(_now)" -ge $end ] && break
    sleep 0.1
done
alive || { echo term; exit 0; }
sig KILL
end=$(( $(_now) + 3000 ))  # a 2 GB engine on a loaded host: seen alive 10 s after SIGKILL
while alive; do
    if [ "$(_now)" -ge $end ]; then
        echo "still alive after SIGKILL: $(_group | tr '\n' ' ')" >&2; exit 3
    fi
    sleep 0.05
done
echo kill
