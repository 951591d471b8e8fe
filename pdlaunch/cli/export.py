"""`export k8s`: the old name of `render --backend k8s`, kept so scripts do not break; both
run :func:`pdlaunch.cli.k8s.write`."""

from __future__ import annotations

from pathlib import Path

import typer

from pdlaunch.cli import k8s as k8s_cli
from pdlaunch.cli import summary
from pdlaunch.cli.common import app, bad_input
from pdlaunch.cli.k8s import ImageOpt, K8sTargetOpt
from pdlaunch.cli.options import JsonOpt, OldOutOpt, OutputDirOpt, TopologyArg

export_app = typer.Typer(help="Write the deployment for another orchestrator", no_args_is_help=True)
app.add_typer(export_app, name="export", short_help=summary("export"))


@export_app.command("k8s")
def k8s_cmd(
    topology: TopologyArg,
    output: OutputDirOpt = None,
    old_out: OldOutOpt = None,
    k8s_target: K8sTargetOpt = None,
    image: ImageOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Same as `render FILE -o DIR --backend k8s`: validate the topology, then write one YAML
    file per Kubernetes object. Secrets become secretKeyRefs, never values."""
    k8s_cli.write(topology, output_dir(output, old_out), k8s_target, image, as_json)


def output_dir(output: Path | None, old_out: Path | None) -> Path:
    """`-o/--output`, or its old spelling `--out` (one of them, once)."""
    if output is not None and old_out is not None:
        bad_input("--out is the old name of -o/--output: give one of them")
    path = output if output is not None else old_out
    if path is None:
        bad_input("missing option -o/--output DIR")
    return path
