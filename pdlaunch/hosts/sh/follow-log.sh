# Follow a log like `tail -F` (waits for it to appear, follows rotation). The first line
# is the pid of tail (this shell's, which tail replaces), so the caller can stop it for sure.
# $1=path $2=lines of what is there already
echo $$
exec tail -n "$2" -F -- "$1" 2>/dev/null
