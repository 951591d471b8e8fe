# Follow a log like `tail -F` (waits for it to appear, follows rotation). The first line
# is the pid of tail (this shell's, which tail replaces), so the caller can stop it for sure.
# As read-log.sh: a link is not followed, and only a regular file is read (tail on a device
# reads without end, its memory growing while it looks for a newline): exit 3.
# $1=path $2=lines of what is there already
if [ -L "$1" ]; then echo 'is a symbolic link; not read' >&2; exit 3; fi
if [ -e "$1" ] && [ ! -f "$1" ]; then echo 'is not a regular file; not read' >&2; exit 3; fi
echo $$
exec tail -n "$2" -F -- "$1" 2>/dev/null
