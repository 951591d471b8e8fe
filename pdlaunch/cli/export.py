"""`export k8s`: the same deployment as Kubernetes manifests (pdlaunch.backends.k8s)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdlaunch.backends import k8s, k8s_files
from pdlaunch.cli.app import app, failed, load_or_exit, out, plan_or_exit
from pdlaunch.cli.options import TopologyArg
from pdlaunch.rules import RUNTIME_ADDRESSED

export_app = typer.Typer(help="Write the deployment for another orchestrator", no_args_is_help=True)
app.add_typer(export_app, name="export")


@export_app.command("k8s")
def k8s_cmd(
    topology: TopologyArg,
    out_dir: Annotated[Path, typer.Option("-o", "--out", help="Directory for the manifests")],
    k8s_target: Annotated[
        str,
        typer.Option(
            "--k8s-target",
            help="disaggregatedset (LWS >= 0.9, default) or lws (two LeaderWorkerSets)",
        ),
    ] = "disaggregatedset",
    image: Annotated[
        str | None, typer.Option("--image", help="Engine image (default: per device kind)")
    ] = None,
) -> None:
    """Validate the topology, then write one YAML file per Kubernetes object (same input, same
    bytes). Secrets become secretKeyRefs to `<deployment>-secrets`, never values."""
    if k8s_target not in ("disaggregatedset", "lws"):
        failed(f"--k8s-target must be disaggregatedset or lws, not {k8s_target!r}")
    # Pods advertise status.podIP as their side-channel host (k8s.py), not the topology's.
    plan = plan_or_exit(topology, skip=RUNTIME_ADDRESSED)
    topo, source = load_or_exit(topology, False)
    try:
        paths = k8s_files.export_k8s(plan, topo, out_dir, k8s_target, image, source=source)  # type: ignore[arg-type]
    except k8s.ExportError as exc:
        failed(str(exc))
    except OSError as exc:
        failed(f"cannot write to {out_dir}: {exc}")
    out.print(f"wrote {len(paths)} manifest(s) to {out_dir} ({k8s_target})")
