"""What every probe module shares: the probe record, its inputs and the guard around it.

A probe is a shell command run on a host plus a pure evaluator over what it printed. Its
module keeps, side by side, the command, the parsers, the evaluator and the parameter
builder (:attr:`Probe.calls`: which jobs the plan needs on a host, with which params).
The probe id is written once, in its :class:`Probe`; evaluators learn it from
:attr:`ProbeContext.probe`, and the runner refers to probes by object.

Evaluators are plain functions that may raise on output they do not understand;
:meth:`Probe.judge` is the one guard: an absent tool becomes FAIL (needed) or SKIP, an
exception becomes a WARN "could not parse" row naming the probe.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from pdlaunch.check.results import CheckResult, Status
from pdlaunch.spec.devices import PROFILES

if TYPE_CHECKING:  # the plan's records are read, never built, here
    from pdlaunch.plan.build import Process

Scope = Literal["host", "pair"]


@dataclass(frozen=True)
class CommandOutput:
    """What running a probe command on a host produced."""

    rc: int
    stdout: str = ""
    stderr: str = ""


@dataclass(frozen=True)
class ProbeContext:
    """Who the probe ran for and what the plan expects there.

    target:   host name, or ``"src -> dst"`` for pair probes
    required: the topology needs this tool/feature on this target; an absent
              tool is then FAIL instead of SKIP
    params:   probe specific expectations (documented on each evaluator)
    probe:    the probe's id, set by :meth:`Probe.judge` (result rows carry it)
    where:    where the command ran, as absence messages say it ("on host", "in the image")
    """

    target: str
    required: bool = True
    params: Mapping[str, Any] = field(default_factory=dict)
    probe: str = ""
    where: str = "on host"


Evaluator = Callable[[CommandOutput, ProbeContext], list[CheckResult]]


@dataclass(frozen=True)
class Call:
    """One job of a probe on a host: its params and whether the plan needs the tool there."""

    params: Mapping[str, Any] = field(default_factory=dict)
    required: bool = True


@dataclass(frozen=True)
class HostFacts:
    """What the plan puts on one host, as the probes' parameter builders read it.

    Only typed plan facts: device kinds, device indices, port kinds, the connector.
    """

    label: str
    processes: tuple[Process, ...]
    kv_connector: str
    vllm_version: str
    python: str  # the interpreter that runs the Python probe snippets here

    @property
    def engines(self) -> list[Process]:
        return [x for x in self.processes if x.role != "router"]

    def engines_of(self, family: str) -> list[Process]:
        """Engines whose device kind names ``family`` among its probe families."""
        return [x for x in self.engines if x.device and family in families_of([x.device])]


def families_of(device_kinds: Iterable[str]) -> set[str]:
    """Probe families the device kinds' entries in devices.py name."""
    return {f for kind in device_kinds for f in PROFILES[kind].probe_families}


@dataclass(frozen=True)
class Needs:
    """When a probe applies.

    device:     only where a device kind's entry in devices.py names the probe's family
    transports: transport features that make it relevant (empty: any)
    """

    device: bool = False
    transports: frozenset[str] = frozenset()

    def matches(self, family: str, families: Iterable[str], transports: Iterable[str]) -> bool:
        if self.device and family not in set(families):
            return False
        return not (self.transports and not (self.transports & set(transports)))


def one_call(facts: HostFacts) -> list[Call]:
    """Default parameter builder: one job, no params."""
    return [Call()]


@dataclass(frozen=True)
class Probe:
    """One preflight probe.

    id:        stable id, also the ``probe`` field of its results; its family (the module
               that defines it, named by devices.py for device probes) is the part before
               the first dot
    command:   shell command string, or a builder ``params -> str``
    evaluate:  pure ``(CommandOutput, ProbeContext) -> list[CheckResult]``
    what:      the output's name in "could not parse ... output" rows
    tool:      the binary :func:`tool_missing` looks for (None: the command always exists)
    install:   the fix when ``tool`` is absent
    needs:     when the probe is relevant for a host
    scope:     "host" (run once per host) or "pair" (run on the source of a pair)
    fast:      part of the quick subset `up` runs before launching
    optional:  only with an explicit flag (``--bandwidth``)
    alternative_to: the probe this one can replace (same facts from another tool); a
               runner normally runs only the primary
    calls:     the jobs the plan needs on a host (host scope)
    pair_call: for a pair probe run after the host probes: ``(prefill, decode, the decode
               host's label, the results on it) -> Call``, or a string saying why it
               cannot run
    cluster:   ``(hosts the probe was planned on, its results) -> rows`` compared across
               hosts once every host reported
    inside:    it judges the software an engine runs with (its Python, vLLM, NIXL, UCX, the
               model path it opens), so for engines in a docker/podman container it runs in
               their image with `up`'s flags (check/inside.py); hardware, ports and
               reachability are the host's own, which --net=host and the device flags hand
               through unchanged
    """

    id: str
    title: str
    command: str | Callable[[Mapping[str, Any]], str]
    evaluate: Evaluator
    what: str
    tool: str | None = None
    install: str = ""
    needs: Needs = field(default_factory=Needs)
    scope: Scope = "host"
    timeout_s: float = 20.0
    fast: bool = True
    optional: bool = False
    alternative_to: Probe | None = None
    calls: Callable[[HostFacts], list[Call]] = one_call
    pair_call: Callable[[Process, Process, str, Sequence[CheckResult]], Call | str] | None = None
    cluster: Callable[[Sequence[str], Sequence[CheckResult]], list[CheckResult]] | None = None
    inside: bool = False

    @property
    def family(self) -> str:
        return self.id.partition(".")[0]

    def render(self, params: Mapping[str, Any] | None = None) -> str:
        if callable(self.command):
            return self.command(params or {})
        return self.command

    def judge(self, out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
        """The evaluator behind the guard: never raises, every row names this probe."""
        ctx = replace(ctx, probe=self.id)
        if self.tool is not None and tool_missing(out):
            return absent(ctx, self.tool, self.install)
        try:
            return self.evaluate(out, ctx)
        except Exception as exc:
            res = unparsed(ctx, self.what, out)
            return [replace(res, message=f"{res.message} ({type(exc).__name__}: {exc})")]


# --------------------------------------------------------------------- shared helpers


def tool_missing(out: CommandOutput) -> bool:
    """The command (or the binary it wraps) is not installed on the host.

    rc 127 is what POSIX shells return for an unknown command; probe commands
    start with ``command -v TOOL >/dev/null || exit 127`` so this is reliable.
    """
    if out.rc == 127:
        return True
    return out.rc != 0 and not out.stdout.strip() and "command not found" in out.stderr


def absent(ctx: ProbeContext, tool: str, fix: str) -> list[CheckResult]:
    if ctx.required:
        return [row(ctx, Status.FAIL, f"{tool} not found {ctx.where}", fix)]
    return [row(ctx, Status.SKIP, f"{tool} not found (not needed by the plan here)")]


def unparsed(ctx: ProbeContext, what: str, out: CommandOutput) -> CheckResult:
    sample = (out.stdout.strip() or out.stderr.strip()).splitlines()[:1]
    hint = f": {sample[0][:120]!r}" if sample else ""
    return row(
        ctx,
        Status.WARN,
        f"could not parse {what} output (rc={out.rc}){hint}",
        "run the probe command by hand on the host and check its output",
    )


def row(ctx: ProbeContext, status: Status, msg: str, fix: str = "", **data: Any) -> CheckResult:
    return CheckResult(ctx.probe, ctx.target, status, msg, fix, data)


def need(tool: str) -> str:
    """Shell prefix: exit 127 when ``tool`` is absent, so absence is unambiguous."""
    return f"command -v {tool} >/dev/null 2>&1 || exit 127; "


def q(v: Any) -> str:
    return shlex.quote(str(v))


def ints(vals: Iterable[Any]) -> str:
    return " ".join(str(int(v)) for v in vals)


def probe_json(text: str) -> dict[str, Any] | None:
    """The last JSON line of a pdlaunch snippet (``"pdlaunch_probe": 1``), else None."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                return None
            if isinstance(data, dict) and data.get("pdlaunch_probe") == 1:
                return data
            return None
    return None


def parse_sections(text: str) -> dict[str, str]:
    """Split ``== KEY ==`` delimited output (printed by the probes' shell loops)."""
    sections: dict[str, list[str]] = {}
    key: str | None = None
    for line in text.splitlines():
        m = re.match(r"^== (.+?) ==$", line.strip())
        if m:
            key = m.group(1)
            sections[key] = []
        elif key is not None:
            sections[key].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}
