"""What a real sbatch does with one more ``#SBATCH`` line after pdlaunch's own
(``--job-name``, ``--chdir``, ``--output``): the facts behind pdlaunch/spec/sbatch_args.py.

Starts the tests' one-node Slurm cluster (tests/support/slurm_cluster.py), submits a
``sleep`` script per case with ``sbatch --parsable`` (as pdlaunch does), prints what sbatch
answered and what squeue then says of the job (id, name, user, work dir, state, command),
and cancels it. The output is kept in tests/fixtures/slurm/sbatch-lines-22.05.8.txt.

    python scripts/probe_sbatch_lines.py > tests/fixtures/slurm/sbatch-lines-22.05.8.txt
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.slurm_cluster import SlurmCluster

CASES = [
    "--job-name=nightly",
    "--job=nightly",
    "-Jnightly",
    "--ch=/tmp",
    "--d=afterok:1",
    "-W",
    "--test-only",
    "-H",
    "--uid=nobody",
    "-a0-1",
    "--export=NONE",
    "-Q",
    "--help",
    "--version",
    "--wrap=true",
]


def main() -> None:
    with SlurmCluster(nodes=1) as cluster:
        work = Path(tempfile.mkdtemp(prefix="pdl-sbatch-probe-"))
        version = subprocess.run(["sbatch", "--version"], env=cluster.env, capture_output=True)
        print(f"# {version.stdout.decode().strip()}; each script: #SBATCH --job-name=pdlaunch-x,")
        print("# --chdir=<dir>, --output=/dev/null, then the case's line; sbatch --parsable")
        for i, case in enumerate(CASES):
            script = work / f"case{i}.sh"
            lines = ["--job-name=pdlaunch-x", f"--chdir={work}", "--output=/dev/null", case]
            script.write_text(
                "#!/bin/bash\n" + "".join(f"#SBATCH {x}\n" for x in lines) + "sleep 30\n"
            )
            try:
                res = subprocess.run(
                    ["sbatch", "--parsable", str(script)],
                    env=cluster.env,
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                answer, rc, err = res.stdout.strip(), res.returncode, res.stderr.strip()
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
                answer, rc, err = out.strip(), "no exit within 20 s", ""
            job = answer.split(";")[0]
            seen = ""
            if job.isdigit():
                seen = subprocess.run(
                    ["squeue", "-h", "-j", job, "-o", "%i|%j|%u|%Z|%T"],
                    env=cluster.env,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
                subprocess.run(["scancel", job], env=cluster.env, check=False)
            seen = seen.replace(str(work), "<dir>")
            err = err.splitlines()[0] if err else ""
            print(f"{case}\tsbatch: {answer!r} ({rc}) {err}\tsqueue: {seen}")


if __name__ == "__main__":
    main()
