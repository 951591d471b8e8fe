"""`FakeSlurm`: stand-ins for Slurm's client commands (sbatch, squeue, sacct, scancel,
scontrol, sinfo) that record every call, for testing automation that drives pdlaunch's Slurm
backend without a cluster, and for the faults a real cluster cannot be made to show on demand:
sbatch refusing a job, a job stuck PENDING, a record naming another user's job.

The commands are small Python scripts in a directory put first on PATH. Their shared state is
one JSON file: the jobs the "controller" holds (``{id: {name, user, workdir, state,
nodes, command}}``), what sbatch answers, and the calls so far. Output formats follow Slurm
22.05's for the fields pdlaunch asks for (``squeue -o`` with ``%i %T %N %r %j %u %Z %o``,
``sacct -P``, ``scontrol show hostnames``, ``scontrol show node -o``); an unknown job id makes
squeue fail as the real one does ("Invalid job id specified", exit 1). scancel applies
``--name``/``--user`` to the job id given, as the real one does (the repository's
tests/backends/test_slurm_faults.py checks that on a real cluster). sacct knows nothing (no
accounting): a job squeue forgot is gone.

    slurm = FakeSlurm.install(tmp_path / "slurm")
    with slurm.activated():          # PATH and the state file in os.environ
        ...                          # pdlaunch's Slurm client runs the fakes
    assert slurm.calls("sbatch")
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the variable the commands find their state file by
STATE_ENV = "PDL_FAKE_SLURM_STATE"

_COMMON = r'''
import fcntl, json, os, re, sys
STATE = os.environ["PDL_FAKE_SLURM_STATE"]
# One command at a time, as slurmctld serialises its RPCs: pdlaunch asks squeue from several
# threads at once (one health watcher per process), and two commands sharing the state file
# would lose each other's writes (or read a half-written one).
_LOCK = open(STATE + ".lock", "w")
fcntl.flock(_LOCK, fcntl.LOCK_EX)
def load():
    with open(STATE) as f:
        return json.load(f)
def save(s):
    tmp = STATE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(s, f)
    os.replace(tmp, STATE)
s = load()
s["calls"].append([os.path.basename(sys.argv[0])] + sys.argv[1:])
save(s)
args = sys.argv[1:]
def opt(name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None
'''

_SCRIPTS = {
    "sbatch": r'''
sb = s["sbatch"]
if sb.get("rc", 0):
    sys.stderr.write(sb.get("stderr", "sbatch: error: Batch job submission failed") + "\n")
    sys.exit(sb["rc"])
jid = str(sb.get("job_id", "4242"))
job = {"name": "", "user": s["user"], "workdir": "", "state": sb.get("state", "RUNNING"),
       "nodes": sb.get("nodes", "n1")}
script = [a for a in args if not a.startswith("-")][-1]
job["command"] = os.path.abspath(script)
# The first component's #SBATCH lines, the last of a repeated option winning, as the real
# sbatch reads them (tests/fixtures/slurm/sbatch-lines-22.05.8.txt).
for line in open(script):
    if line.startswith("#SBATCH hetjob") or not (line.startswith("#") or not line.strip()):
        break
    m = re.match(r"#SBATCH --(job-name|chdir)=(\S+)", line)
    if m:
        job["name" if m.group(1) == "job-name" else "workdir"] = m.group(2)
s["jobs"][jid] = job
save(s)
print(sb.get("answer", jid))
''',
    "squeue": r'''
jid, fmt = opt("-j"), opt("-o")
job = s["jobs"].get(jid)
if job is None:
    sys.stderr.write("slurm_load_jobs error: Invalid job id specified\n")
    sys.exit(1)
fields = {"i": jid, "T": job["state"], "N": job["nodes"], "r": "None", "j": job["name"],
          "u": job["user"], "Z": job["workdir"], "o": job.get("command", "")}
print(re.sub(r"%(\w)", lambda m: fields[m.group(1)], fmt))
''',
    "sacct": r'''
sys.exit(0)  # no accounting: a job squeue forgot is gone
''',
    "scancel": r'''
jid = [a for a in args if not a.startswith("-")][-1]
job = s["jobs"].get(jid)
name, user = opt("--name"), opt("--user")
if job is not None and name in (None, job["name"]) and user in (None, job["user"]):
    del s["jobs"][jid]
    save(s)
''',
    "scontrol": r'''
if args[:2] == ["show", "hostnames"]:
    print("\n".join(args[2].split(",")))
elif args[:2] == ["show", "node"]:
    print(f"NodeName={args[-1]} NodeAddr=127.0.0.1 State=IDLE")
''',
    "sinfo": r'''
print("2|(null)")
''',
}


@dataclass
class FakeSlurm:
    """The fake controller's state and the directory of its commands (:meth:`install`)."""

    state_file: Path
    user: str
    bin_dir: Path | None = None

    @classmethod
    def install(cls, directory: Path | str, user: str | None = None) -> FakeSlurm:
        """Write the commands into ``directory/bin`` and an empty controller (no jobs; sbatch
        answers job 4242 RUNNING on node n1) into ``directory/state.json``."""
        directory = Path(directory)
        bin_dir = directory / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name, body in _SCRIPTS.items():
            path = bin_dir / name
            path.write_text(f"#!{sys.executable} -S\n{_COMMON}\n{body}")
            path.chmod(0o755)
        user = user or pwd.getpwuid(os.getuid()).pw_name
        state = directory / "state.json"
        state.write_text(json.dumps({"calls": [], "jobs": {}, "sbatch": {}, "user": user}))
        return cls(state, user, bin_dir)

    def environ(self) -> dict[str, str]:
        """The variables under which Slurm commands are the fakes."""
        assert self.bin_dir is not None, "install() the commands first"
        return {
            STATE_ENV: str(self.state_file),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    @contextlib.contextmanager
    def activated(self) -> Iterator[FakeSlurm]:
        """Inside: this process (and what it starts) runs the fake commands."""
        saved = {k: os.environ.get(k) for k in (STATE_ENV, "PATH")}
        os.environ.update(self.environ())
        try:
            yield self
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def read(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    @contextlib.contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write under the lock the commands take (they may run meanwhile)."""
        with open(f"{self.state_file}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            s = self.read()
            yield s
            tmp = self.state_file.with_suffix(".tmp-api")
            tmp.write_text(json.dumps(s))
            os.replace(tmp, self.state_file)

    def update(self, **changes: Any) -> None:
        """Change the controller, e.g. ``update(sbatch={"rc": 1, "stderr": "..."})`` (sbatch
        refuses), ``update(sbatch={"state": "PENDING", "nodes": "n[1-2]"})``."""
        with self._changing() as s:
            s.update(changes)

    def calls(self, command: str | None = None) -> list[list[str]]:
        """Every call so far (``[command, *args]``), of ``command`` only if given."""
        return [c for c in self.read()["calls"] if command is None or c[0] == command]

    @property
    def jobs(self) -> dict[str, dict[str, str]]:
        return self.read()["jobs"]

    def add_job(self, job_id: str, **job: str) -> None:
        """A job the controller holds (RUNNING on n1, this user's, unless said otherwise)."""
        with self._changing() as s:
            s["jobs"][job_id] = {"state": "RUNNING", "nodes": "n1", "user": self.user, **job}

    def set_state(self, job_id: str, state: str) -> None:
        """A job's state from now on (``COMPLETING``, ``FAILED``...)."""
        with self._changing() as s:
            s["jobs"][job_id]["state"] = state
