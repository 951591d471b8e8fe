"""Writing files on the control host so that a reader sees the old content or the new, never a
part, and a symlink planted by someone else is never written through."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets

# O_EXCL alone already refuses an existing name, symlinks included (open(2)); O_NOFOLLOW says
# so again where the platform has it.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
_ATTEMPTS = 100


def _open_new(path: str) -> int:
    """A file descriptor on a file this call created at `path` (mode 0600 until fchmod)."""
    return os.open(path, _NEW_FILE, 0o600)


def _create_temp(directory: str, base: str) -> tuple[int, str]:
    # The name is unguessable, so nobody can plant a link there in advance; a name that exists
    # anyway (a link or a file) is skipped, never opened.
    for _ in range(_ATTEMPTS):
        path = os.path.join(directory, f".{base}.{secrets.token_hex(8)}.tmp")
        try:
            return _open_new(path), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", directory)


def _fsync_dir(directory: str) -> None:
    """Make the rename durable: the new directory entry reaches the disk too."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems cannot sync a directory; the rename is still atomic there.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes | str, mode: int = 0o600) -> None:
    """Replace `path` with `data` (str: UTF-8) and permission bits `mode` (not umask's).

    The content goes to a new file in the same directory, is synced, and is renamed over
    `path`: a symlink at `path` is replaced by the file, not followed.
    """
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd, tmp = _create_temp(directory, os.path.basename(target))
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
