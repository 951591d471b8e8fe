# The last lines of a log; nothing when it does not exist. pdlaunch never makes a log a link:
# one there is not followed (it could point at any file of the login user, and doctor's
# bundle is meant to be shared): exit 3.
# $1=path $2=lines
if [ -L "$1" ]; then echo 'is a symbolic link; not read' >&2; exit 3; fi
[ -e "$1" ] || exit 0
tail -n "$2" -- "$1"
