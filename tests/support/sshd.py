"""Start real OpenSSH servers on loopback, one per simulated host.

Pure helper module (no pytest import), usable from tests and from benchmark scripts::

    from tests.support.sshd import SshdCluster

    with SshdCluster() as cluster:
        hosts = cluster.start(32)            # 32 sshd processes, each on its own port
        cluster.known_hosts                  # known_hosts file trusting all of them
        cluster.key_file, cluster.user       # the client identity accepted by all of them
        cluster.write_ssh_config(path)       # "Host sim0 ... HostName 127.0.0.1 Port N ..."

Each simulated host gets its own directory with its own host key, sshd_config, pid file and log
file, and its own home directory: sshd sets ``HOME`` to it and a tiny ForceCommand wrapper
``cd``s there before running the client's command, so ``~/pdlaunch`` (and relative paths) on
"host 3" differ from those on "host 4" even though all of them share one machine. Processes,
pids and absolute paths are of course shared.

Gotchas handled here:

* sshd must be started with an absolute path (it re-execs itself).
* Running as root, sshd needs its privilege-separation directory (``/run/sshd`` on Debian);
  it is created if missing. ``PermitRootLogin prohibit-password`` lets root log in with a key.
* ``StrictModes no``: the temp dirs and key files are not in a home directory with the usual
  ownership/permission layout sshd insists on.
* ``UsePAM no``: PAM cannot work for a non-root sshd, and is not needed for key auth. With PAM off,
  sshd refuses accounts whose password field is locked ("!..." in /etc/shadow); root in Debian
  containers has ``*`` which is fine. A CI user created by ``useradd`` without a password is
  locked: give it one (``usermod -p '*' user``) or run the tests as root.
* A non-root sshd can only log in its own user; ``user`` defaults to the current user.
* ``MaxStartups``/``MaxSessions`` are raised so that many parallel connections or channels to one
  host are not randomly dropped (the defaults are 10:30:100 and 10).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
INSTALL_HINT = (
    "OpenSSH server not found: the ssh tests start real sshd processes on 127.0.0.1. "
    "Install it (Debian/Ubuntu: `apt-get install -y openssh-server`, which also brings "
    "ssh-keygen from openssh-client)."
)
LOOPBACK = "127.0.0.1"


class SshdError(RuntimeError):
    """The test sshd could not be set up or started."""


def find_sshd() -> str:
    """Absolute path of the sshd binary (``$PDLAUNCH_TEST_SSHD`` overrides the search), or
    SshdError with an install hint."""
    override = os.environ.get("PDLAUNCH_TEST_SSHD")
    if override:
        if os.path.isabs(override) and os.access(override, os.X_OK):
            return override
        raise SshdError(
            f"PDLAUNCH_TEST_SSHD={override} is not an executable absolute path. " + INSTALL_HINT
        )
    for cand in SSHD_CANDIDATES:
        if os.access(cand, os.X_OK):
            return cand
    found = shutil.which("sshd")
    if found:
        return os.path.abspath(found)
    raise SshdError(INSTALL_HINT)


def find_ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if not found:
        raise SshdError(INSTALL_HINT)
    return found


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago (callers must cope with losing a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(*names: str, host: str = LOOPBACK) -> dict[str, int]:
    """A distinct free TCP port per name: every socket stays bound until all are chosen, so two
    names never get the same port (two free_port() calls may: the kernel can hand the one just
    released out again, and a topology with a port twice is refused by validate)."""
    with contextlib.ExitStack() as stack:
        ports = {}
        for name in names:
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports[name] = s.getsockname()[1]
        return ports


def keygen(path: Path, *, comment: str = "pdlaunch-test", key_type: str = "ed25519") -> Path:
    """Create an unencrypted keypair at ``path`` / ``path.pub``; returns ``path``."""
    path = Path(path)
    for p in (path, path.with_name(path.name + ".pub")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    res = subprocess.run(
        [find_ssh_keygen(), "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if res.returncode != 0:
        raise SshdError(f"ssh-keygen failed for {path}: {res.stderr.strip()}")
    return path


def _sftp_server() -> str:
    # Not "internal-sftp": with ForceCommand, the subsystem's command goes through the wrapper.
    for cand in (
        "/usr/lib/openssh/sftp-server",
        "/usr/libexec/openssh/sftp-server",
        "/usr/libexec/sftp-server",
    ):
        if os.access(cand, os.X_OK):
            return cand
    return "internal-sftp"


def _ensure_privsep_dir() -> None:
    # Debian's sshd (running as root) refuses to start without its privsep chroot dir.
    if os.geteuid() != 0:
        return
    for d in ("/run/sshd", "/var/run/sshd"):
        if os.path.isdir(d):
            return
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def _proc_children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        with contextlib.suppress(IndexError, ValueError):
            children.setdefault(int(rest[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from /proc), children first."""
    children = _proc_children_map()
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


WRAPPER = """#!/bin/sh
# ForceCommand for a simulated host: run the client's command (or a login shell) in the
# simulated host's own home directory, with the user's login shell, like sshd itself would.
cd "$HOME" || exit 1
if [ -n "$SSH_ORIGINAL_COMMAND" ]; then
    exec "${SHELL:-/bin/sh}" -c "$SSH_ORIGINAL_COMMAND"
fi
exec "${SHELL:-/bin/sh}" -l
"""


@dataclass
class SshdHost:
    """One running sshd = one simulated host."""

    index: int
    host: str
    port: int
    dir: Path
    home: Path
    host_key: Path
    config_file: Path
    log_file: Path
    process: subprocess.Popen | None = field(default=None, repr=False)
    log_offset: int = field(default=0, repr=False)  # log size when this sshd was spawned

    @property
    def alias(self) -> str:
        """Name used for this host in ssh_config files written by the cluster."""
        return f"sim{self.index}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def host_key_line(self) -> str:
        """known_hosts line for this host (``[127.0.0.1]:PORT ssh-ed25519 AAAA...``)."""
        keytype, blob = Path(str(self.host_key) + ".pub").read_text().split()[:2]
        name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        return f"{name} {keytype} {blob}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def listening(self) -> bool:
        """This sshd (not an older one, not another process) logged that it is listening."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self.log_offset)
                return b"Server listening on" in f.read()
        except OSError:
            return False

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def accepts(self, timeout: float = 0.5) -> bool:
        """True when something on the port answers with an SSH banner."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as s:
                s.settimeout(timeout)
                return s.recv(64).startswith(b"SSH-")
        except OSError:
            return False

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sshd and everything it spawned (session processes); idempotent."""
        proc = self.process
        if proc is None:
            return
        victims = descendants(proc.pid)
        for pid in [proc.pid, *victims]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.process = None

    def rotate_host_key(self) -> None:
        """Give this host a new host key (restart sshd): simulates a changed/MITM host key."""
        self.stop()
        keygen(self.host_key, comment=f"host{self.index}")
        self.process = _spawn_sshd(self)
        if _wait_ready([self], timeout=10.0):
            raise SshdError(f"sshd {self.address} did not restart: {self.log_tail(5)}")


def _spawn_sshd(h: SshdHost) -> subprocess.Popen:
    log = open(h.log_file, "ab")  # noqa: SIM115 - handed to the child
    h.log_offset = log.seek(0, os.SEEK_END)
    try:
        return subprocess.Popen(
            [find_sshd(), "-D", "-e", "-f", str(h.config_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


def _wait_ready(hosts: Sequence[SshdHost], timeout: float) -> list[SshdHost]:
    """Wait until each host accepts; returns the hosts whose sshd exited (e.g. port taken)."""
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    failed: list[SshdHost] = []
    while pending:
        still = []
        for h in pending:
            if h.process is not None and h.process.poll() is not None:
                failed.append(h)
            elif not (h.listening() and h.accepts()):
                still.append(h)
        pending = still
        if not pending:
            break
        if time.monotonic() > deadline:
            details = "; ".join(f"{h.address}: {h.log_tail(5)!r}" for h in pending)
            raise SshdError(f"sshd did not start accepting within {timeout:.0f}s: {details}")
        time.sleep(0.02)
    return failed


class SshdCluster:
    """A set of independent sshd "hosts" on 127.0.0.1 sharing one client identity."""

    def __init__(self, root: str | os.PathLike | None = None, *, user: str | None = None):
        self.sshd = find_sshd()
        find_ssh_keygen()
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="pdl-sshd-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.user = user or pwd.getpwuid(os.geteuid()).pw_name
        self.client_dir = self.root / "client"
        self.client_dir.mkdir(exist_ok=True)
        self.key_file = keygen(self.client_dir / "id_ed25519", comment="pdlaunch-test-user")
        self.authorized_keys = self.client_dir / "authorized_keys"
        self.authorized_keys.write_text(Path(str(self.key_file) + ".pub").read_text())
        self.known_hosts = self.client_dir / "known_hosts"
        self.known_hosts.touch()
        self.hosts: list[SshdHost] = []
        self._used_ports: set[int] = set()
        self._ports_lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, n: int = 1, *, timeout: float = 20.0) -> list[SshdHost]:
        """Start ``n`` more sshd hosts in parallel; returns them once all accept connections."""
        _ensure_privsep_dir()
        base = len(self.hosts)
        with ThreadPoolExecutor(max_workers=min(16, max(1, n))) as pool:  # ssh-keygen in parallel
            new = list(pool.map(self._prepare, range(base, base + n)))
        self.hosts.extend(new)
        todo = new
        for _attempt in range(5):
            for h in todo:
                h.process = _spawn_sshd(h)
            todo = _wait_ready(todo, timeout)
            if not todo:
                break
            for h in todo:  # most likely lost the race for the port: pick another one
                h.process = None
                h.port = self._new_port()
                self._write_config(h)
        else:
            details = "; ".join(f"{h.address}: {h.log_tail(5)}" for h in todo)
            raise SshdError(f"sshd failed to start: {details}")
        self.write_known_hosts()
        return new

    def stop(self) -> None:
        for h in self.hosts:
            h.stop()

    def close(self) -> None:
        self.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SshdCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- client-side files ---------------------------------------------------------------------
    def write_known_hosts(
        self, path: str | os.PathLike | None = None, hosts: Iterable[SshdHost] | None = None
    ) -> Path:
        """Write a known_hosts file trusting ``hosts`` (default: all); default path is
        ``self.known_hosts``."""
        target = Path(path) if path is not None else self.known_hosts
        lines = [h.host_key_line() for h in (self.hosts if hosts is None else hosts)]
        target.write_text("".join(line + "\n" for line in lines))
        return target

    def ssh_config_text(
        self, hosts: Iterable[SshdHost] | None = None, *, known_hosts: str | None = None
    ) -> str:
        """ssh_config stanzas ``Host simN`` for the hosts (HostName/Port/User/IdentityFile)."""
        out = []
        for h in self.hosts if hosts is None else hosts:
            out.append(
                f"Host {h.alias}\n"
                f"    HostName {h.host}\n"
                f"    Port {h.port}\n"
                f"    User {self.user}\n"
                f"    IdentityFile {self.key_file}\n"
                f"    UserKnownHostsFile {known_hosts or self.known_hosts}\n"
            )
        return "".join(out)

    def write_ssh_config(
        self, path: str | os.PathLike, hosts: Iterable[SshdHost] | None = None
    ) -> Path:
        target = Path(path)
        target.write_text(self.ssh_config_text(hosts))
        return target

    # -- internals -------------------------------------------------------------------------------
    def _new_port(self) -> int:
        with self._ports_lock:
            while True:
                port = free_port()
                if port not in self._used_ports:
                    self._used_ports.add(port)
                    return port

    def _prepare(self, index: int) -> SshdHost:
        d = self.root / f"host{index}"
        home = d / "home"
        home.mkdir(parents=True, exist_ok=True)
        host_key = keygen(d / "ssh_host_ed25519_key", comment=f"host{index}")
        wrapper = d / "session.sh"
        wrapper.write_text(WRAPPER)
        wrapper.chmod(0o755)
        h = SshdHost(
            index=index,
            host=LOOPBACK,
            port=self._new_port(),
            dir=d,
            home=home,
            host_key=host_key,
            config_file=d / "sshd_config",
            log_file=d / "sshd.log",
        )
        self._write_config(h)
        return h

    def _write_config(self, h: SshdHost) -> None:
        h.config_file.write_text(
            f"""# simulated host {h.index} (written by tests/support/sshd.py)
Port {h.port}
ListenAddress {h.host}
AddressFamily inet
HostKey {h.host_key}
PidFile {h.dir}/sshd.pid
AuthorizedKeysFile {self.authorized_keys}
AllowUsers {self.user}
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
GSSAPIAuthentication no
AllowTcpForwarding yes
AllowAgentForwarding no
X11Forwarding no
PermitTTY yes
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 200:30:400
MaxSessions 100
MaxAuthTries 20
LoginGraceTime 30
ClientAliveInterval 0
SetEnv HOME={h.home}
ForceCommand {h.dir}/session.sh
Subsystem sftp {_sftp_server()}
LogLevel INFO
"""
        )
