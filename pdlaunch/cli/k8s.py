"""Kubernetes on the command line: its options, declared once, and the manifests
`render --backend k8s` writes (pdlaunch.backends.k8s). `export k8s` is the same command
under its old name: both call :func:`write`, so their files and output are the same."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from pdlaunch.cli.common import (
    EXIT_FINDINGS,
    failed,
    finding_dict,
    load_or_exit,
    load_valid,
    out,
    plan_or_exit,
    print_error,
    print_json,
)

# The Kubernetes backend is imported by the functions that use it (`validate` without
# --backend k8s loads none of it).


class K8sTarget(str, Enum):
    disaggregatedset = "disaggregatedset"
    lws = "lws"


_PANEL = "Kubernetes (with --backend k8s)"
# A choice: a bad value is a usage error (exit 2) naming the choices, from click itself.
K8sTargetOpt = Annotated[
    K8sTarget | None,
    typer.Option(
        "--k8s-target",
        case_sensitive=False,
        help="disaggregatedset (LWS >= 0.9; the default behind vllm-router) or lws (two "
        "LeaderWorkerSets; the default behind a fixed-list proxy)",
        rich_help_panel=_PANEL,
    ),
]
ImageOpt = Annotated[
    str | None,
    typer.Option("--image", help="Engine image (default: per device kind)", rich_help_panel=_PANEL),
]


def write(
    topology: Path, output: Path, target: K8sTarget | None, image: str | None, as_json: bool
) -> None:
    """Validate the topology, then write one YAML file per Kubernetes object (same input,
    same bytes). Secrets become secretKeyRefs to `<deployment>-secrets`, never values."""
    from pdlaunch.backends.k8s import files as k8s_files
    from pdlaunch.backends.k8s import manifests as k8s
    from pdlaunch.rules import RUNTIME_ADDRESSED

    # Pods advertise status.podIP as their side-channel host (k8s.py), not the topology's.
    plan = plan_or_exit(topology, as_json, skip=RUNTIME_ADDRESSED)
    topo, source = load_or_exit(topology, as_json)
    try:
        chosen = target.value if target else k8s.default_target(plan)
        paths = k8s_files.export_k8s(plan, topo, output, chosen, image, source=source)  # type: ignore[arg-type]
    except k8s.ExportError as exc:
        failed(str(exc))
    except OSError as exc:
        failed(f"cannot write to {output}: {exc}")
    if as_json:
        print_json({"files": [str(p) for p in paths]})
    else:
        out.print(f"wrote {len(paths)} manifest(s) to {escape(str(output))} ({chosen})")


def validate(topology: Path, target: K8sTarget | None, image: str | None, as_json: bool) -> None:
    """Every rule the export runs, then the manifests built and checked as Kubernetes would
    check them; nothing written. Exit 2 unreadable input, 1 refused."""
    from pdlaunch.backends.k8s import files as k8s_files
    from pdlaunch.backends.k8s import manifests as k8s
    from pdlaunch.plan.build import build_plan
    from pdlaunch.rules import RUNTIME_ADDRESSED

    topo, findings = load_valid(topology, as_json, RUNTIME_ADDRESSED)
    try:
        export, _, _ = k8s_files.manifests(
            build_plan(topo),
            target.value if target else None,  # type: ignore[arg-type]
            image,
        )
    except k8s.ExportError as exc:
        if as_json:
            print_json({"valid": False, "backend": "k8s", "error": str(exc)})
        else:
            print_error(f"{topology}: cannot be exported to Kubernetes: {exc}")
        raise typer.Exit(EXIT_FINDINGS) from None
    if as_json:
        print_json(
            {
                "valid": True,
                "backend": "k8s",
                "target": export.target,
                "objects": len(export.objects),
                "findings": [finding_dict(f) for f in findings],
            }
        )
        return
    out.print(
        f"[green]{escape(str(topology))}: valid for Kubernetes[/] ({len(export.objects)} "
        f"object(s), {export.target}, {len(findings)} warning(s))"
    )
