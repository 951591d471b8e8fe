"""A real Slurm cluster on this machine for tests: munged, slurmctld and slurmd processes with
their own key, sockets, ports, state and spool in one temp dir.

Pure helper module (no pytest import)::

    with SlurmCluster(nodes=2) as cluster:
        cluster.env            # SLURM_CONF for the client commands (sbatch, squeue, ...)
        cluster.nodes          # ["vm", "vm-1"]: the first is `hostname -s`
        cluster.run(["sinfo"])

The first node is this machine under its own short name, with the CPUs and memory
``slurmd -C`` reports. Further nodes are the same machine again under other names (one
``slurmd -N NAME`` each, NodeAddr 127.0.0.1): Slurm's backfill scheduler, the only one that
starts heterogeneous jobs, reserves whole nodes for a pending job, so two components of one
het job never share a node, and a het job needs as many nodes as components.

Choices, each for this machine (no systemd, no cgroups, root):

* ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
  ``JobAcctGatherType=jobacct_gather/none``, no accounting storage (so no ``sacct``).
* ``SchedulerParameters=bf_interval=1``: het jobs wait for a backfill pass (30 s by default).
* ``MinJobAge=2``: a finished job leaves squeue within seconds; ``KillWait=5``.
* munged's socket directory (and every directory above it) must be searchable by all, so the
  temp dir is made under /tmp with mode 0755 (pytest's own tmp dirs are 0700).

`stop()` cancels every job, stops the daemons it started (by pid: SIGTERM, then SIGKILL),
checks that none of them (nor a slurmstepd of this cluster) is left, and removes the temp dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

INSTALL_HINT = (
    "Slurm or MUNGE not found: the Slurm tests start real munged, slurmctld and slurmd "
    "processes. Install them (Debian/Ubuntu: `apt-get install -y slurm-wlm munge`; "
    "scripts/install.sh does)."
)
DAEMONS = ("munged", "slurmctld", "slurmd")


class SlurmClusterError(Exception):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name: str) -> str:
    path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if not path:
        raise SlurmClusterError(f"{name} not found. {INSTALL_HINT}")
    return path


def node_resources() -> str:
    """``CPUs=2 Boards=1 ... RealMemory=24105`` as slurmd -C reports this machine."""
    out = subprocess.run(
        [_which("slurmd"), "-C"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    first = out.splitlines()[0].split()
    return " ".join(w for w in first if not w.startswith(("NodeName=", "UpTime=")))


def slurm_conf(
    root: Path,
    nodes: list[str],
    hostname: str,
    resources: str,
    ctld_port: int,
    node_ports: list[int],
    munge_socket: Path,
) -> str:
    lines = [
        "ClusterName=pdltest",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool-%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1",
        "MinJobAge=2",
        "KillWait=5",
        "SlurmdTimeout=60",
    ]
    for name, port in zip(nodes, node_ports, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={port} "
            f"{resources} State=UNKNOWN"
        )
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=60 State=UP")
    return "\n".join(lines) + "\n"


def _stat_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()[0].decode()


def _alive(pid: int) -> bool:
    return _stat_state(pid) not in (None, "Z", "X")


class SlurmCluster:
    def __init__(self, nodes: int = 2, root: Path | None = None):
        if nodes < 1:
            raise ValueError("a cluster needs a node")
        self.n_nodes = nodes
        self.root = Path(root or tempfile.mkdtemp(prefix="pdl-slurm-", dir="/tmp"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.env: dict[str, str] = {}
        self.nodes: list[str] = []
        self._logs: list = []

    # -- start -------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> SlurmCluster:
        try:
            self._start(timeout)
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def _start(self, timeout: float) -> None:
        munged, ctld, slurmd = (_which(d) for d in DAEMONS)
        _which("sbatch")
        root = self.root
        root.chmod(0o755)
        key_dir, sock_dir = root / "munge", root / "sock"
        key_dir.mkdir(mode=0o700)
        sock_dir.mkdir(mode=0o755)
        (root / "state").mkdir()
        key = key_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = sock_dir / "munge.sock"
        self._spawn(
            "munged",
            [
                munged, "--foreground", f"--socket={socket_path}", f"--key-file={key}",
                f"--pid-file={key_dir}/munged.pid", f"--log-file={key_dir}/munged.log",
                f"--seed-file={key_dir}/munged.seed",
            ],
        )  # fmt: skip
        self._wait(lambda: socket_path.exists(), timeout, "munged did not create its socket")

        hostname = socket.gethostname().split(".")[0]
        self.nodes = [hostname] + [f"{hostname}-{i}" for i in range(1, self.n_nodes)]
        conf = root / "slurm.conf"
        conf.write_text(
            slurm_conf(
                root,
                self.nodes,
                hostname,
                node_resources(),
                _free_port(),
                [_free_port() for _ in self.nodes],
                socket_path,
            )
        )
        for name in self.nodes:
            (root / f"spool-{name}").mkdir()
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        self._spawn("slurmctld", [ctld, "-D", "-f", str(conf)])
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", [slurmd, "-D", "-f", str(conf), "-N", name])

        def idle() -> bool:
            res = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
            return res.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

        self._wait(idle, timeout, "the nodes did not become idle in sinfo")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        env = {**os.environ, **self.env}
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SlurmClusterError(f"{what} ({self.diagnostics(dead)})")
            time.sleep(0.2)

    def diagnostics(self, names: list[str] | None = None) -> str:
        parts = []
        for name in names or list(self.procs):
            p = self.procs[name]
            out = self.root / f"{name}.out"
            text = out.read_text(errors="replace")[-1500:] if out.exists() else ""
            parts.append(f"{name} (exit {p.poll()}): {text.strip()}")
        return "; ".join(parts)

    # -- use ---------------------------------------------------------------------------------
    def run(self, argv: list[str], check: bool = True, timeout: float = 60.0):
        res = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and res.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)}: {res.stderr.strip() or res.stdout}")
        return res

    def jobs(self) -> list[str]:
        """Job ids (het components as ID+N) squeue shows, in any state."""
        res = self.run(["squeue", "-h", "-t", "all", "-o", "%i"], check=False)
        return [line.strip() for line in res.stdout.splitlines() if line.strip()]

    def stepds(self) -> list[int]:
        """slurmstepd processes of this cluster (they inherit its SLURM_CONF)."""
        mark = f"SLURM_CONF={self.env.get('SLURM_CONF', '')}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/comm") as f:
                    comm = f.read().strip()
                if comm != "slurmstepd" or not _alive(int(entry)):
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if mark in environ:
                found.append(int(entry))
        return found

    # -- stop --------------------------------------------------------------------------------
    def stop(self, check: bool = True) -> None:
        """Cancel every job, stop the daemons, remove the temp dir; with ``check``, raise
        SlurmClusterError naming anything of this cluster still alive."""
        problems = []
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--user", "root"], check=False)
            deadline = time.monotonic() + 30
            while (self.jobs() or self.stepds()) and time.monotonic() < deadline:
                time.sleep(0.3)
            if self.jobs():
                problems.append(f"jobs still in squeue: {self.jobs()}")
        # slurmd before slurmctld before munged: each needs the next to shut down cleanly.
        order = sorted(self.procs, key=lambda n: (n != "munged", n != "slurmctld"), reverse=True)
        for name in order:
            self._terminate(self.procs[name])
        for log in self._logs:
            log.close()
        left = [f"{n} (pid {p.pid})" for n, p in self.procs.items() if _alive(p.pid)]
        left += [f"slurmstepd (pid {pid})" for pid in self.stepds()]
        if left:
            problems.append("still running: " + ", ".join(left))
        shutil.rmtree(self.root, ignore_errors=True)
        self.procs.clear()
        if check and problems:
            raise SlurmClusterError("; ".join(problems))

    @staticmethod
    def _terminate(p: subprocess.Popen, grace: float = 10.0) -> None:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait(10)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(check=exc[0] is None)
