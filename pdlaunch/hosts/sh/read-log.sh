# The last lines of a log; nothing when it does not exist. pdlaunch never makes a log a link:
# one there is not followed (it could point at any file of the login user, and doctor's
# bundle is meant to be shared): exit 3. Nor is anything but a regular file read (a FIFO
# would block, a device never end): exit 3. At most the last $3 bytes are looked at, so a log
# of one endless line (or a sparse file of NULs) does not come back whole.
# $1=path $2=lines $3=bytes
if [ -L "$1" ]; then echo 'is a symbolic link; not read' >&2; exit 3; fi
[ -e "$1" ] || exit 0
if [ ! -f "$1" ]; then echo 'is not a regular file; not read' >&2; exit 3; fi
tail -c "$3" -- "$1" | tail -n "$2"
