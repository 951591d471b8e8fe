"""Which backend each backend-specific option belongs to (one table), and the one check every
command with a backend runs: an option the chosen backend does not read is refused with exit
2, naming it and the backend, never silently ignored (a `--known-hosts` under
`--backend slurm` would otherwise look honoured).

Options not in the table apply on every backend (`EVERY_BACKEND` lists them, so a test can
prove each option of each command is classified)."""

from __future__ import annotations

from typing import Any

import typer

from pdlaunch.cli.common import bad_input

SSH = frozenset({"ssh"})
SLURM = frozenset({"slurm"})
K8S = frozenset({"k8s"})
SSH_TRIO = ["--accept-new-host-keys", "--known-hosts", "--ssh-config"]
LABEL = {"ssh": "SSH", "slurm": "Slurm", "k8s": "Kubernetes"}

OPTION_BACKENDS: dict[str, frozenset[str]] = {
    # How pdlaunch reaches the hosts itself: a Slurm job runs on its nodes, reads logs in its
    # shared work dirs, and Kubernetes manifests reach no host at all.
    "--accept-new-host-keys": SSH,
    "--known-hosts": SSH,
    "--ssh-config": SSH,
    # What `up`/`down` over SSH do on the hosts: Slurm stops a job by scancel (its own
    # signal and KillWait) and has no preflight of pdlaunch's.
    "--grace": SSH,
    "--skip-check": SSH,
    # sbatch and the Slurm placement rules.
    "--partition": SLURM,
    "--nodelist": SLURM,
    "--account": SLURM,
    "--qos": SLURM,
    "--time": SLURM,
    "--exclusive": SLURM,
    "--mem": SLURM,
    "--sbatch-opt": SLURM,
    "--start-timeout": SLURM,
    "--gpus-per-node": SLURM,
    "--cpus-per-node": SLURM,
    "--backend-config": SLURM,  # its one block today is slurm: (pdlaunch/spec/backend_settings.py)
    # The manifests.
    "--k8s-target": K8S,
    "--image": K8S,
}

# Options of backend-taking commands that every backend they offer reads.
EVERY_BACKEND = frozenset(
    {
        "--backend",
        "--json",
        "--output",
        "--out",  # export k8s's old spelling of --output
        "--timeout",
        "--canary",
        # the one lifecycle (runtime/lifecycle) reads them on every runtime
        "--canary-scope",
        "--replace",
        "--watch",
        "--interval",
        "--count",
        "--follow",
        "--lines",
        "--bundle",
        # canary: how it sends its requests, the same to engines wherever a runtime put them
        "--router",
        "--sequential",
        "--help",
    }
)

# What to do instead, where the refusal alone does not say it.
_HINTS: dict[str, str] = {}


def long_name(param: Any) -> str:
    """The option's first ``--long`` spelling (its table key)."""
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def given_options(ctx: typer.Context) -> list[str]:
    """The options typed on this command line (not defaults), in the command's order."""
    # By name: typer carries its own copy of click, whose classes are not `click`'s.
    return [
        long_name(p)
        for p in ctx.command.params
        if p.param_type_name == "option"
        and p.name is not None
        and getattr(ctx.get_parameter_source(p.name), "name", "") == "COMMANDLINE"
    ]


def refuse_foreign(ctx: typer.Context, backend: str, why: str = "", suggest: bool = True) -> None:
    """Exit 2 when an option typed on the command line belongs to other backends than
    ``backend``. ``why`` says how the backend was chosen (e.g. " (the default)");
    ``suggest``: say which `--backend` reads them (not for a backend a record chose)."""
    foreign = [o for o in given_options(ctx) if backend not in OPTION_BACKENDS.get(o, {backend})]
    if not foreign:
        return
    owners = {b for o in foreign for b in OPTION_BACKENDS[o]}
    kind = " or ".join(LABEL[b] for b in sorted(owners))
    message = f"{', '.join(foreign)}: {kind} option(s), not read with --backend {backend}{why}"
    hints = [_HINTS[o] for o in foreign if o in _HINTS]
    if suggest and len(owners) == 1 and not hints:
        hints.append(f"add --backend {next(iter(owners))} or drop them")
    bad_input(message + ("; " + "; ".join(hints) if hints else ""))


def check_chosen(ctx: typer.Context, backend: str | None, default: str = "ssh") -> str:
    """The backend `--backend` names (else ``default``), once every option typed applies."""
    refuse_foreign(ctx, backend or default, "" if backend else " (the default)")
    return backend or default


def check_recorded(ctx: typer.Context, backend: str, explicit: bool, deployment: str) -> None:
    """Refuse options ``backend`` does not read, when the deployment's record (not
    ``--backend``, ``explicit``) chose it: no "add --backend" hint, the record decides."""
    if explicit:
        refuse_foreign(ctx, backend)
    else:
        why = f" (the backend {deployment!r} is recorded on)"
        refuse_foreign(ctx, backend, why, suggest=False)


def refuse_unused(ctx: typer.Context, options: list[str], why: str) -> None:
    """Exit 2 when any of ``options`` was typed: the mode chosen (``why``, e.g. "without
    --watch") does not read them, whatever the backend."""
    typed = [o for o in given_options(ctx) if o in options]
    if typed:
        bad_input(f"{', '.join(typed)}: not read {why}")
