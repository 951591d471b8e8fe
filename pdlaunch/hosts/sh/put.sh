# _put and _keep: write files from stdin (a library: defines, runs nothing).
# _put writes the next SIZE bytes of stdin to PATH atomically (temp file in the same dir,
# 0600 until chmod, then rename). `head -c` reads no byte past SIZE (coreutils, busybox), so
# the files of one upload follow each other on one stdin; a short read (the upload was cut)
# is refused.
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
