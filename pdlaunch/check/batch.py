"""Jobs and the batch that runs them: every command a host needs in ONE shell round trip,
run in parallel on the host, each job's output framed between boundary lines and judged by
its probe."""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdlaunch.check.probes import Call, CommandOutput, Probe, ProbeContext
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.hosts import Host, HostError

TIMEOUT_RC = 124  # coreutils `timeout`


@dataclass
class Job:
    """One command in a host's batch and how to turn its output into results."""

    command: str
    timeout: float
    evaluate: Callable[[CommandOutput], list[CheckResult]]
    name: str  # for timeout messages
    required: bool = True
    target: str = ""
    probe: Probe | None = None
    # the jobs a container job runs in its image (check/inside.py): what it stands for
    inner: tuple[Job, ...] = ()

    def probes(self) -> list[Probe]:
        """The probes this job runs, its inner jobs' included."""
        own = [self.probe] if self.probe is not None else []
        return own + [p for j in self.inner for p in j.probes()]


def probe_job(probe: Probe, target: str, call: Call, where: str = "on host") -> Job:
    """The job of one call of ``probe`` on ``target`` (``where``: as absence messages say
    the place the command runs)."""
    ctx = ProbeContext(target, call.required, call.params, where=where)
    return Job(
        probe.render(call.params),
        probe.timeout_s,
        lambda out: probe.judge(out, ctx),
        probe.id,
        call.required,
        target,
        probe,
    )


def batch_script(jobs: list[Job], boundary: str) -> str:
    """One sh script that runs every job in parallel (each in its own ``sh -c``, under
    ``timeout`` when the host has it) and prints each job's stdout, stderr and exit status
    between ``boundary`` marker lines."""
    b = shlex.quote(boundary)
    lines = [
        'd=$(mktemp -d "${TMPDIR:-/tmp}/pdlaunch-check.XXXXXX") || exit 99',
        "trap 'rm -rf \"$d\"' EXIT",
        "if command -v timeout >/dev/null 2>&1; then T=timeout; else T=; fi",
    ]
    for i, job in enumerate(jobs):
        c = shlex.quote(job.command)
        t = max(1, int(job.timeout + 0.999))
        f = f'"$d/{i}'
        lines.append(
            f"printf '%s %d out\\n' {b} {i} >{f}.a\"; printf '\\n%s %d err\\n' {b} {i} >{f}.c\"; "
            f'{{ if [ -n "$T" ]; then timeout -k 2 {t} sh -c {c}; else sh -c {c}; fi; '
            f'printf \'\\n%s %d rc %d\\n\' {b} {i} $? >{f}.e"; }} </dev/null >{f}.b" 2>{f}.d" &'
        )
    lines.append("wait")
    # every job's framing and output in one `cat` (few processes per host matter when many
    # simulated hosts share one machine); a job that never finished has no .e file
    files = " ".join(f'"$d/{i}.{x}"' for i in range(len(jobs)) for x in "abcde")
    lines.append(f"cat {files} 2>/dev/null")
    return "\n".join(lines) + "\n"


def parse_batch(text: str, boundary: str, n: int) -> dict[int, CommandOutput]:
    """Inverse of :func:`batch_script`: ``{job index: CommandOutput}`` for the jobs that
    reported back."""
    marker = re.compile(rf"^{re.escape(boundary)} (\d+) (out|err|rc)(?: (-?\d+))?$", re.M)
    parts: dict[int, dict[str, Any]] = {}
    matches = list(marker.finditer(text))
    for k, m in enumerate(matches):
        i, kind = int(m.group(1)), m.group(2)
        slot = parts.setdefault(i, {})
        if kind == "rc":
            slot["rc"] = int(m.group(3)) if m.group(3) is not None else 255
            continue
        start = m.end() + 1
        end = matches[k + 1].start() if k + 1 < len(matches) else len(text)
        chunk = text[start:end]
        slot[kind] = chunk[:-1] if chunk.endswith("\n") else chunk
    return {
        i: CommandOutput(s["rc"], s.get("out", ""), s.get("err", ""))
        for i, s in parts.items()
        if "rc" in s and i < n
    }


def run_jobs(host: Host, jobs: list[Job], label: str) -> list[CheckResult]:
    """Run ``jobs`` on ``host`` in one round trip and evaluate them."""
    if not jobs:
        return []
    boundary = f"@@pdlaunch-check-{uuid.uuid4().hex}"
    limit = max(j.timeout for j in jobs) + 15
    try:
        res = host.run(batch_script(jobs, boundary), timeout=limit)
    except HostError as exc:
        return [
            CheckResult(
                j.name,
                j.target or label,
                Status.FAIL,
                f"probe could not run: {exc}",
                "check the host is healthy and reachable, then rerun `pdlaunch check`",
            )
            for j in jobs
        ]
    outputs = parse_batch(res.stdout, boundary, len(jobs))
    detail = (res.stderr.strip() or res.stdout.strip())[-300:]
    return judge_outputs(jobs, outputs, label, f"batch rc={res.rc}: {detail}")


def judge_outputs(
    jobs: list[Job],
    outputs: dict[int, CommandOutput],
    label: str,
    why_none: str,
    needs: str = "the host needs a POSIX sh, mktemp and cat",
) -> list[CheckResult]:
    """Each job's rows from its output in ``outputs`` (by index); a job without one gets a
    FAIL saying ``why_none`` and what the batch ``needs``, one that timed out a FAIL/WARN."""
    results: list[CheckResult] = []
    for i, job in enumerate(jobs):
        out = outputs.get(i)
        if out is None:
            results.append(
                CheckResult(
                    job.name,
                    job.target or label,
                    Status.FAIL,
                    f"probe produced no report ({why_none})",
                    needs,
                )
            )
        elif out.rc == TIMEOUT_RC:
            results.append(
                CheckResult(
                    job.name,
                    job.target or label,
                    Status.FAIL if job.required else Status.WARN,
                    f"probe timed out after {job.timeout:g}s",
                    f"run it by hand on the host: {job.command[:160]}",
                )
            )
        else:
            results.extend(job.evaluate(out))
    return results
