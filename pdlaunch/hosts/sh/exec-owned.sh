# Exec the script in $s only if it is a file (not a link) owned by the running user and
# writable by nobody else; exit 96 otherwise. Constant sh text: the SSH start command
# (exec_owned_script) and the Slurm node runner (templates/slurm/node-runner.sh.j2) end with it.
if [ -L "$s" ] || [ ! -f "$s" ] || [ "$(stat -c %u -- "$s")" != "$(id -u)" ]; then
    echo "pdlaunch: refusing to run $s: not a file owned by $(id -un)" >&2; exit 96
fi
case $(stat -c %a -- "$s") in *[2367]?|*[2367])
    echo "pdlaunch: refusing to run $s: writable by others" >&2; exit 96;; esac
exec "$s"
