"""Commands that only read the topology: `validate`, `plan`, `render`, `schema`. Exit codes:
0 valid, 1 rule findings, 2 unreadable input. `validate` and `render` with `--backend slurm`
hand over to :mod:`pdlaunch.cli.slurm` (the Slurm placement rules too; the sbatch job)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from pdlaunch.cli import k8s as k8s_cli
from pdlaunch.cli import slurm as slurm_cli
from pdlaunch.cli import summary
from pdlaunch.cli.backend_options import check_chosen
from pdlaunch.cli.common import (
    app,
    bad_input,
    finding_dict,
    judgement,
    load_or_exit,
    out,
    plan_or_exit,
    print_json,
)
from pdlaunch.cli.k8s import ImageOpt, K8sTargetOpt
from pdlaunch.cli.options import JsonOpt, TopologyArg
from pdlaunch.cli.slurm import (
    AccountOpt,
    BackendConfigOpt,
    CpusPerNodeOpt,
    ExclusiveOpt,
    GpusPerNodeOpt,
    MemOpt,
    NodelistOpt,
    PartitionOpt,
    QosOpt,
    SbatchOpt,
    SlurmFlags,
    StartTimeoutOpt,
    TimeOpt,
)
from pdlaunch.kv import progress
from pdlaunch.plan import kv_geometry as kvgeometry
from pdlaunch.plan import nixl_progress
from pdlaunch.plan.build import KvPair, Process
from pdlaunch.plan.kv_path import PairPath
from pdlaunch.plan.node_addr import on_node_hosts
from pdlaunch.spec.load import dotted
from pdlaunch.spec.topology import Topology


class SpecBackend(str, Enum):
    """`validate` and `render` also know Kubernetes, a render target (no `up` there yet)."""

    ssh = "ssh"
    slurm = "slurm"
    k8s = "k8s"


SpecBackendOpt = Annotated[
    SpecBackend | None,
    typer.Option(
        "--backend",
        case_sensitive=False,
        help="ssh (default): a script per process; slurm: one Slurm batch job; "
        "k8s: Kubernetes manifests",
        show_default=False,
    ),
]

# Short names for the plan's port kinds, so each port line fits a narrow terminal.
PORT_LABELS = {
    "http": "http",
    "nixl_side_channel": "nixl",
    "dp_rpc": "dp_rpc",
    "mooncake_kv": "mooncake",
    "router_http": "http",
    "router_metrics": "metrics",
}


def compact_ranges(ports: Iterable[int]) -> str:
    """``5600-5603,5608`` for 5600, 5601, 5602, 5603, 5608 (sorted, duplicates dropped)."""
    runs: list[list[int]] = []
    for port in sorted(set(ports)):
        if runs and port == runs[-1][1] + 1:
            runs[-1][1] = port
        else:
            runs.append([port, port])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def port_lines(process: Process) -> list[str]:
    """One ``<ports> <kind>`` line per port kind, in the order the plan lists them: a 4-rank
    side channel is one ``5600-5603 nixl`` line, not four."""
    by_kind: dict[str, list[int]] = {}
    for p in process.ports:
        by_kind.setdefault(p.kind, []).append(p.port)
    return [f"{compact_ranges(ports)} {PORT_LABELS.get(k, k)}" for k, ports in by_kind.items()]


@app.command("validate", short_help=summary("validate"))
def validate_cmd(
    ctx: typer.Context,
    topology: TopologyArg,
    as_json: JsonOpt = False,
    backend: SpecBackendOpt = None,
    partition: PartitionOpt = None,
    nodelist: NodelistOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    time_limit: TimeOpt = None,
    exclusive: ExclusiveOpt = None,
    mem: MemOpt = None,
    sbatch_opt: SbatchOpt = None,
    start_timeout: StartTimeoutOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    cpus_per_node: CpusPerNodeOpt = None,
    backend_config: BackendConfigOpt = None,
    k8s_target: K8sTargetOpt = None,
    image: ImageOpt = None,
) -> None:
    """Check a topology against every rule (with --backend slurm, the Slurm placement rules
    too; with --backend k8s, the manifests as Kubernetes checks them); nothing is started."""
    flags = SlurmFlags.of(locals())
    which = check_chosen(ctx, backend.value if backend else None)
    if which == "slurm":
        slurm_cli.validate_cmd(topology, flags, as_json)
        return
    if which == "k8s":
        k8s_cli.validate(topology, k8s_target, image, as_json)
        return
    topo, source = load_or_exit(topology, as_json)
    result = judgement(topology, topo, source, as_json)
    findings = result.findings
    paths = kvgeometry.pair_paths(topo)
    on_node = on_node_hosts(topo)
    if as_json:
        print_json(
            {
                "valid": True,
                "findings": [finding_dict(f) for f in findings],
                "accepted": [{**finding_dict(f), "reason": why} for f, why in result.accepted],
                "kv_paths": [_path_dict(p) for p in paths],
                "kv_address_on_node": on_node,
                "nixl_progress": nixl_progress.explain(topo),
            }
        )
    else:
        n = len(topo.prefill) + len(topo.decode)
        warnings = sum(f.severity == "warning" for f in findings)
        also = f", {len(result.accepted)} accepted" if result.accepted else ""
        out.print(f"[green]{topology}: valid[/] ({n} instances, {warnings} warning(s){also})")
        width = min(out.width, 100)
        for f, why in result.accepted:
            text = f"accepted [{f.rule}] {dotted(f.field)}: {why}"
            for line in textwrap.wrap(text, width, subsequent_indent="  "):
                out.print(f"[dim]{escape(line)}[/]")
        for line in kv_path_lines(paths, width):
            out.print(line)
        for line in on_node_lines(on_node, width):
            out.print(line)
        for line in wrapped(nixl_progress.explain(topo), width):
            out.print(line)


def on_node_lines(hosts: list[str], width: int = 80) -> list[str]:
    """Which hosts' NIXL side-channel address their nodes resolve at start (plan/node_addr.py),
    wrapped to `width` columns."""
    if not hosts:
        return []
    text = (
        "NIXL side-channel address resolved on the node at start (names without "
        f"hosts.<host>.address): {', '.join(hosts)}"
    )
    return [escape(w) for w in textwrap.wrap(text, width, subsequent_indent="  ",
                                             break_on_hyphens=False)]  # fmt: skip


def _path_dict(p: PairPath) -> dict[str, str]:
    return {"prefill": p.prefill, "decode": p.decode, "path": p.kind, "why": p.why,
            "source": p.source}  # fmt: skip


PATH_LABELS = {
    "none": "no conversion",
    "plugin": "plugin (native)",
    "vllm": "vLLM receive side",
    "extension": "pdlaunch KV extension",
    "refused": "refused",
}


def wrapped(texts: Iterable[str], width: int) -> list[str]:
    """Each text wrapped to ``width``, continuation lines indented, escaped for rich."""
    return [escape(w) for t in texts
            for w in textwrap.wrap(t, width, subsequent_indent="  ")]  # fmt: skip


def kv_path_lines(paths: Iterable[PairPath | KvPair], width: int = 80) -> list[str]:
    """`KV prefill-0 -> decode-0: plugin (native)` and the reason below it, wrapped to fit
    `width` columns, one per distinct pair geometry: who post-processes the KV pages
    (pdlaunch/plan/kv_path.py)."""
    lines = []
    for p in paths:
        kind = p.kind if isinstance(p, PairPath) else p.path
        lines.append(f"KV {escape(p.prefill)} -> {escape(p.decode)}: [bold]{PATH_LABELS[kind]}[/]")
        lines += [escape(w) for w in textwrap.wrap(p.why, width, initial_indent="  ",
                                                   subsequent_indent="  ")]  # fmt: skip
    return lines


@app.command("plan", short_help=summary("plan"))
def plan_cmd(topology: TopologyArg, as_json: JsonOpt = False) -> None:
    """Show every process the topology resolves to."""
    plan = plan_or_exit(topology, as_json)
    if as_json:
        print_json(plan.model_dump(mode="json"))
        return
    # A block per process instead of a table: a table folds the ports and URLs of a
    # multi-rank process word by word in 80 columns.
    out.print(
        f"[bold]{escape(plan.deployment)}[/]: {len(plan.processes)} processes, "
        f"agreed block size {plan.agreed_block_size}"
    )
    for line in kv_path_lines(plan.kv_paths, min(out.width, 100)):
        out.print(line)
    for p in plan.processes:
        out.print()
        head = f"[bold]{escape(p.name)}[/]  {p.role} on {escape(p.host)}"
        if p.plugin:
            head += f" ({escape(p.plugin)})"
        if p.devices:
            head += f", devices {','.join(map(str, p.devices))}"
        if p.vllm_version:
            release = f"vLLM {escape(p.vllm_version)}"
            # A long release (0.10.2rc2) on its own line rather than past 80 columns.
            fits = len(head) + len(release) - len("[bold][/]") + 2 <= 80
            head += f", {release}" if fits else f"\n  {release}"
        out.print(head)
        out.print(f"  health {escape(p.health_url or '(headless)')}")
        if p.node_addr:
            out.print(f"  kv address: {escape(p.node_addr.name)}, resolved on the node at start")
        if p.env.get(progress.ENV_VAR):
            out.print(f"  nixl   progress thread poll delay {p.env[progress.ENV_VAR]} us (shim)")
        for i, line in enumerate(port_lines(p)):
            out.print(f"  {'ports ' if i == 0 else '      '} {line}")
    out.print()
    # Not the file's path: it can be long enough to break the 80 columns on its own.
    out.print("[dim]argv, env, log paths and every port's purpose: pdlaunch plan FILE --json[/]")


@app.command("render", short_help=summary("render"))
def render_cmd(
    ctx: typer.Context,
    topology: TopologyArg,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Directory to write into", show_default=False)
    ],
    as_json: JsonOpt = False,
    backend: SpecBackendOpt = None,
    partition: PartitionOpt = None,
    nodelist: NodelistOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    time_limit: TimeOpt = None,
    exclusive: ExclusiveOpt = None,
    mem: MemOpt = None,
    sbatch_opt: SbatchOpt = None,
    start_timeout: StartTimeoutOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    cpus_per_node: CpusPerNodeOpt = None,
    backend_config: BackendConfigOpt = None,
    k8s_target: K8sTargetOpt = None,
    image: ImageOpt = None,
) -> None:
    """Write one runnable script per process, plus index.md and plan.json (with --backend
    slurm: the sbatch script slurm-job.sh too, and an index.md that says how to submit it;
    with --backend k8s: one YAML file per Kubernetes object, as `export k8s` did)."""
    from pdlaunch.plan.render import render_plan, write_files  # jinja2: only here

    flags = SlurmFlags.of(locals())
    which = check_chosen(ctx, backend.value if backend else None)
    if which == "slurm":
        slurm_cli.render_cmd(topology, output, flags, as_json)
        return
    if which == "k8s":
        k8s_cli.write(topology, output, k8s_target, image, as_json)
        return
    plan = plan_or_exit(topology, as_json)
    if output.exists() and not output.is_dir():
        bad_input(f"{output}: exists and is not a directory")
    try:
        written = write_files(render_plan(plan), output)
    except OSError as exc:
        bad_input(f"cannot write to {output}: {exc.strerror}")
    if as_json:
        print_json({"files": [str(p) for p in written]})
    else:
        for p in written:
            out.print(f"wrote {p}")
        named = list(dict.fromkeys(q.node_addr.name for q in plan.processes if q.node_addr))
        for line in on_node_lines(named, min(out.width, 100)):
            out.print(line)


@app.command("schema", short_help=summary("schema"))
def schema_cmd() -> None:
    """Print the topology JSON Schema (for yaml-language-server and editors)."""
    print_json(Topology.model_json_schema())
