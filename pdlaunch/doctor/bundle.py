"""The debug bundle: one tar.gz a user can attach to an issue, with every secret taken out.

Members (under ``<deployment>-doctor/``): ``manifest.json`` (what is inside, notes on what is
missing and why), ``summary.txt`` and ``findings.json``, ``state.json`` (the record on the
control host), ``topology.yaml``, ``plan.json`` and ``scripts/`` (rendered again from the
topology, or the scripts as uploaded when it no longer plans), per process ``logs/NAME.log``
(the tail the findings' line numbers point into) and ``metrics/NAME.prom``, ``versions.json``
(per host) and ``check.json`` when the caller ran ``pdlaunch check --json``.

Redaction is one choke point: every member's text goes through :class:`Redactor` on its way
into the archive. It replaces the values of the ``${env:VAR}`` secrets (the names recorded by
`up` in the state, and those the topology references when it is still there, read from the
control host's environment as ``up`` reads them), the values given to secret-bearing flags and
keys (``--api-key VALUE``, ``--api-key=VALUE``, ``["--api-key", "VALUE"]``,
``{"api_key": "VALUE"}``: found in every member first, then replaced wherever they stand), and
anything shaped like a credential (Hugging Face, OpenAI, GitHub, Slack and AWS tokens,
``Authorization:`` headers, ``Bearer``, ``token=``, ``password=``, long keys after ``key=``,
passwords in URLs, an empty user's too, private key blocks).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pdlaunch import __version__
from pdlaunch.doctor.collect import TopologyFile
from pdlaunch.doctor.diagnose import Finding
from pdlaunch.doctor.evidence import Evidence
from pdlaunch.fsutil import dumps_json_finite
from pdlaunch.plan.render import plan_json, render_plan
from pdlaunch.runtime.record import Record
from pdlaunch.runtime.state import DeploymentState

REDACTED = "[REDACTED]"
FORMAT = 1
SECRET_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")

_KEEP = r"(?!\$\{|\[REDACTED\])"  # a reference or an earlier redaction is not a secret
# plan.json maps a secret's variable to the control host's: "HF_TOKEN": "HF_TOKEN" is a name.
_NAMES_A_VARIABLE = r"(?![A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)\b)"
_SEP = r"""(?:["']\s*[:=]\s*["']?|\s*=\s*["']?|\s*:\s+["']?)(?:Some\(["']?)?"""
# What names a credential in a flag or key: ``--api-key``, ``api_key``, ``--hf-token``,
# ``HF_TOKEN``, ``db_password`` (``tokens``, ``tokenizer`` or ``max_tokens`` do not).
_CRED = r"(?:token|secret|passw(?:or)?d|passphrase|api[_-]?key|access[_-]?key|credentials?)"
_VALUE = r"[^\s\"',;&{}()\[\]]+"
# A secret-bearing flag and the value after it: ``--api-key VALUE`` (argv, shell, log lines),
# ``"--api-key", "VALUE"`` (JSON or Python lists, over lines too). The ``=``/``:`` forms are
# the key pattern's. A value that is the next flag, a reference or a redaction is left.
FLAG_VALUE = re.compile(
    r"(?i)(--?[a-z0-9_-]*" + _CRED + r"""["']?(?:\s+["']?|\s*,\s*["']))"""
    + r"(?!-|\$|\[REDACTED\])" + _NAMES_A_VARIABLE + "(" + _VALUE + ")"
)
KEY_VALUE = re.compile(
    r"(?i)(" + _CRED + _SEP + r")" + _KEEP + _NAMES_A_VARIABLE + "(" + _VALUE + ")"
)
# ``Authorization: Basic dXNlcjpw``, ``'Authorization': 'Bearer x'``: the scheme stays.
AUTH_HEADER = re.compile(
    r"""(?i)\b((?:proxy-)?authorization["']?\s*[:=]\s*["']?)"""
    r"(?:(basic|bearer|digest|negotiate|token)\s+)?"
    r"(?!\[REDACTED\]|(?:basic|bearer|digest|negotiate|token)\b)([^\s\"',;]+)"
)
TOKEN_PATTERNS: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
     REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), REDACTED),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (AUTH_HEADER, lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + REDACTED),
    (re.compile(r"(?i)\b(bearer)\s+" + _KEEP + r"[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    # key=value, key: value, "key": "value" where the key names a credential (HF_TOKEN=...,
    # "password": ...); a bare ':' must be followed by a space, so that shell's ${TOKEN:?msg}
    # in the rendered scripts stays intact.
    (KEY_VALUE, r"\1" + REDACTED),
    (FLAG_VALUE, r"\1" + REDACTED),
    # any other *key=: only what looks like key material (long hex or base64)
    (re.compile(
        r"(?i)(key" + _SEP + r")" + _KEEP
        + r"(?:[A-Fa-f0-9]{32,}|[A-Za-z0-9+/_-]{24,}={0,2})"
    ), r"\1" + REDACTED),
    # scheme://user:pw@host, and scheme://:pw@host (a password with no user).
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@"), r"\1" + REDACTED + "@"),
)  # fmt: skip


class Redactor:
    """Replaces secret values and token-shaped strings by ``[REDACTED]``."""

    def __init__(self, secrets: Iterable[str] = ()):
        variants: set[str] = set()
        for value in secrets:
            if not value:
                continue
            variants.add(value)
            # As it appears inside JSON strings (findings.json, state.json, check.json).
            variants.add(json.dumps(value)[1:-1])
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted(variants, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self._secrets:
            text = text.replace(value, REDACTED)
        for pattern, repl in TOKEN_PATTERNS:
            text = pattern.sub(repl, text)
        return text


def secret_names(topology_text: str | None, state: DeploymentState | None = None) -> list[str]:
    """Every variable a ``${env:VAR}`` reference names in the topology, wherever it stands
    (a misplaced one is still somebody's secret), and those `up` recorded in the state (the
    topology file may have moved since)."""
    names = set(SECRET_REF.findall(topology_text or ""))
    if state is not None:
        names.update(state.secret_names)
        for text in state.scripts.values():
            names.update(SECRET_REF.findall(text))
    return sorted(names)


def flagged_values(texts: Iterable[str]) -> set[str]:
    """The values given to secret-bearing flags and keys anywhere in ``texts``, so that each
    is redacted wherever else it stands too (a log line echoing it bare, a JSON string).
    Short ones, numbers and booleans are left to the patterns: replaced everywhere, they
    would take ordinary words out of every member."""
    found: set[str] = set()
    for text in texts:
        for pattern in (FLAG_VALUE, KEY_VALUE):
            for m in pattern.finditer(text):
                value = m.group(2)
                if len(value) >= 6 and not _ORDINARY.fullmatch(value):
                    found.add(value)
    return found


_ORDINARY = re.compile(r"(?i)\d+|true|false|none|null|\[REDACTED\]")


def secret_values(names: Iterable[str], env: Mapping[str, str]) -> list[str]:
    return [env[n] for n in names if env.get(n)]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def _json(data: Any) -> str:
    # A metrics value that was NaN or infinite is null: the bundle's JSON stays JSON.
    return dumps_json_finite(data, indent=2, sort_keys=True, default=str) + "\n"


def summary(findings: list[Finding]) -> str:
    if not findings:
        return "No known failure signature found.\n"
    out = []
    for f in findings:
        seen = f" (x{f.count}, last at line {f.last_line_no})" if f.count > 1 else ""
        out.append(f"[{f.severity}] {f.id} at {f.where}{seen}: {f.what}")
        if f.line:
            out.append(f"    log:    {f.line}")
        out.append(f"    cause:  {f.cause}")
        out.append(f"    fix:    {f.fix}")
        out.append(f"    source: {f.source}")
    return "\n".join(out) + "\n"


def members(
    state: DeploymentState,
    evidence: Evidence,
    findings: list[Finding],
    topology: TopologyFile | None = None,
    check_json: str | Mapping[str, Any] | None = None,
    record: Record | None = None,
) -> tuple[list[tuple[str, str]], list[str]]:
    """The bundle's files as (name, text), before redaction, and the notes for the manifest.
    ``record``: the deployment's record as found (format 2, in ``record.json``); a Slurm
    job's own record goes in as ``slurm.json`` (its per-process view is no state.json)."""
    files: list[tuple[str, str]] = []
    notes: list[str] = []
    files.append(("summary.txt", summary(findings)))
    files.append(("findings.json", _json([f.to_dict() for f in findings])))
    if record is not None:
        files.append(("record.json", record.to_json()))
    if record is not None and record.backend == "slurm":
        files.append(("slurm.json", _json(asdict(record.native))))
        if state.scripts:
            notes.append("scripts/ holds the Slurm job's files as written for sbatch")
        notes.append("versions.json: a Slurm job's nodes are not probed for versions")
    else:
        files.append(("state.json", _json(state.to_json())))
    if topology is not None and topology.note:
        notes.append(topology.note)
    if topology is not None and topology.text is not None:
        files.append(("topology.yaml", topology.text))
    if topology is not None and topology.plan is not None:
        files.append(("plan.json", plan_json(topology.plan)))
        for f in render_plan(topology.plan):
            if f.name != "plan.json":
                files.append((f"scripts/{_safe(f.name)}", f.content))
    else:
        for name, text in sorted(state.scripts.items()):
            files.append((f"scripts/{_safe(name)}", text))
        if state.scripts and (record is None or record.backend != "slurm"):
            notes.append("scripts/ holds the scripts as uploaded by `up` (recorded in the state)")
    for p in evidence.processes:
        base = _safe(p.name)
        if p.log is not None:
            files.append((f"logs/{base}.log", "\n".join(p.log) + ("\n" if p.log else "")))
        if p.log_error is not None:
            files.append((f"logs/{base}.error", p.log_error + "\n"))
        if p.metrics is not None:
            files.append((f"metrics/{base}.prom", p.metrics))
        if p.metrics_after is not None:
            files.append((f"metrics/{base}.after.prom", p.metrics_after))
        if p.metrics_error is not None:
            files.append((f"metrics/{base}.error", p.metrics_error + "\n"))
    if evidence.versions:
        files.append(("versions.json", _json([asdict(v) for v in evidence.versions])))
    if check_json is not None:
        text = check_json if isinstance(check_json, str) else _json(dict(check_json))
        files.append(("check.json", text))
    return files, notes


def write_bundle(
    path: str | os.PathLike[str],
    state: DeploymentState,
    evidence: Evidence,
    findings: list[Finding],
    *,
    topology: TopologyFile | None = None,
    check_json: str | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    record: Record | None = None,
) -> Path:
    """Write the redacted tar.gz at ``path`` (mode 0600, replaced atomically) and return it.
    ``env``: where the secrets' values are read (default: this process's environment)."""
    env = os.environ if env is None else env
    names = secret_names(topology.text if topology else None, state)
    if topology is not None and topology.plan is not None:
        planned = {v for p in topology.plan.processes for v in p.secret_env.values()}
        names = sorted(set(names) | planned)
    files, notes = members(state, evidence, findings, topology, check_json, record)
    flagged = flagged_values(text for _, text in files)
    redact = Redactor([*secret_values(names, env), *flagged])
    created = evidence.collected_at or time.time()
    manifest = {
        "format": FORMAT,
        "deployment": state.deployment,
        "created_at": created,
        "pdlaunch": __version__,
        "log_lines": evidence.lines,
        "members": [name for name, _ in files],
        "notes": notes,
        "redaction": (
            f"values of the secrets {names} read on the control host, and token-like "
            f"strings, are replaced by {REDACTED}"
        ),
    }
    files.insert(0, ("manifest.json", _json(manifest)))
    out = Path(path)
    root = f"{_safe(state.deployment)}-doctor"
    fd, tmp = tempfile.mkstemp(dir=out.parent or ".", prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, text in files:
                data = redact(text).encode("utf-8")
                info = tarfile.TarInfo(f"{root}/{name}")
                info.size = len(data)
                info.mode = 0o600
                info.mtime = int(created)
                tar.addfile(info, io.BytesIO(data))
        os.chmod(tmp, 0o600)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out
