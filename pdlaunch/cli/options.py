"""Every option shared by several commands, declared once as an ``Annotated`` alias, so a
flag's name and help are the same wherever it appears."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdlaunch.hosts.options import ConnectOptions

TopologyArg = Annotated[Path, typer.Argument(help="Topology YAML file", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output")]
# Every command that writes files takes their directory as -o/--output.
OutputDirOpt = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="Directory to write into", show_default=False),
]
# `export k8s`'s old spelling of --output, hidden but still read so scripts do not break.
OldOutOpt = Annotated[Path | None, typer.Option("--out", hidden=True)]

# The SSH trio (up, down, status, logs, check, doctor): see connect_options. Their own help
# panel: under --backend slurm they are refused (backend_options).
_SSH = "SSH (the default backend)"
AcceptKeysOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        help="Trust SSH host keys seen for the first time and record them (default: refuse)",
        rich_help_panel=_SSH,
    ),
]
KnownHostsOpt = Annotated[
    Path | None,
    typer.Option(
        "--known-hosts",
        help="Extra known_hosts file (new keys are recorded there)",
        rich_help_panel=_SSH,
    ),
]
SshConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--ssh-config",
        help="ssh_config file replacing ~/.ssh/config (like ssh -F)",
        rich_help_panel=_SSH,
    ),
]

# `--timeout` bounds a different wait per command, so each meaning has its own help.
HealthTimeoutOpt = Annotated[
    float,
    typer.Option("--timeout", min=1, help="Seconds until every process must be healthy"),
]
BenchTimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=1, help="Seconds the whole benchmark may take")
]

TargetArg = Annotated[
    str | None,
    typer.Argument(
        help="Topology file or deployment name (default: the only recorded deployment)",
        show_default=False,
    ),
]


def connect_options(
    accept_new_host_keys: bool, known_hosts: Path | None, ssh_config: Path | None
) -> ConnectOptions:
    """The SSH trio as one value, built once per command (ConnectOptions expands ``~``)."""
    return ConnectOptions(
        accept_new_host_keys=accept_new_host_keys,
        known_hosts=str(known_hosts) if known_hosts is not None else None,
        ssh_config=str(ssh_config) if ssh_config is not None else None,
    )
