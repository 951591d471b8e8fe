"""UCX: the transports the planned UCX_TLS names exist in the node's UCX build, and no
stray UCX_* variable in the login environment overrides the plan."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Needs,
    Probe,
    ProbeContext,
    need,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status

# openucx/ucx src/ucp/core/ucp_context.c, ucp_tl_aliases[] (":aux" members do not count)
UCX_TL_ALIASES: dict[str, tuple[str, ...]] = {
    "mm": ("posix", "sysv", "xpmem"),
    "sm": ("posix", "sysv", "xpmem", "knem", "cma"),
    "shm": ("posix", "sysv", "xpmem", "knem", "cma"),
    "ib": ("rc_verbs", "ud_verbs", "rc_mlx5", "ud_mlx5", "dc_mlx5"),
    "ud_v": ("ud_verbs",),
    "ud_x": ("ud_mlx5",),
    "ud": ("ud_mlx5", "ud_verbs"),
    "rc_v": ("rc_verbs",),
    "rc_x": ("rc_mlx5",),
    "rc": ("rc_mlx5", "rc_verbs"),
    "dc": ("dc_mlx5",),
    "dc_x": ("dc_mlx5",),
    "ugni": ("ugni_smsg", "ugni_rdma"),
    "cuda": ("cuda_copy", "cuda_ipc", "gdr_copy"),
    "rocm": ("rocm_copy", "rocm_ipc", "rocm_gdr"),
}

_UCX_FIX = {
    "cuda_copy": "UCX was built without CUDA: rebuild with --with-cuda (or use the UCX bundled "
    "with NIXL / HPC-X)",
    "cuda_ipc": "UCX was built without CUDA: rebuild with --with-cuda",
    "gdr_copy": "build UCX --with-gdrcopy and load the gdrdrv module",
    "gaudi_gdr": "install a UCX build with Intel Gaudi support (gaudi_gdr transport)",
    "rocm_copy": "UCX was built without ROCm: rebuild with --with-rocm",
}
#: UCX_TLS names that run over verbs on an IB/RoCE port (aliases included)
IB_TLS = frozenset(
    {
        "ib",
        "rc",
        "rc_v",
        "rc_x",
        "rc_verbs",
        "rc_mlx5",
        "ud",
        "ud_v",
        "ud_x",
        "ud_verbs",
        "ud_mlx5",
        "dc",
        "dc_x",
        "dc_mlx5",
    }
)
#: UCX_TLS names that put traffic on an RDMA port: verbs, and Gaudi's direct RDMA
#: (gaudi_gdr, Intel's UCX branch src/uct/gaudi/gaudi_gdr)
RDMA_TLS = IB_TLS | {"gaudi_gdr"}
#: transports every UCX build has: ucx_info is then optional on the host (SKIP if absent)
BASIC_TLS = frozenset(
    {"tcp", "self", "sm", "shm", "mm", "posix", "sysv", "cma", "knem", "xpmem", "all"}
)


def parse_ucx_transports(text: str) -> dict[str, list[str]]:
    """``ucx_info -d`` (full or grep-filtered): ``{transport: [devices]}``."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        m = re.match(r"^#?\s*Transport:\s*(\S+)", line)
        if m:
            current = m.group(1)
            out.setdefault(current, [])
            continue
        m = re.match(r"^#?\s*Device:\s*(\S+)", line)
        if m and current is not None:
            out[current].append(m.group(1))
            current = None
    return out


def split_ucx_tls(tls: str) -> tuple[bool, list[str]]:
    """``"^tcp,cuda_ipc"`` -> ``(True, ["tcp", "cuda_ipc"])``; aux suffixes dropped."""
    s = tls.strip()
    negate = s.startswith("^")
    s = s.removeprefix("^")
    items = [i.strip().split(":")[0] for i in s.split(",") if i.strip()]
    return negate, items


def uses_rdma(tls: str | None) -> bool:
    """The UCX_TLS value asks for a transport that runs over an RDMA port."""
    negate, items = split_ucx_tls(tls or "")
    return not negate and any(i in RDMA_TLS for i in items)


def ucx_tls_missing(tls: str, available: Iterable[str]) -> list[str]:
    """Names in ``tls`` that the UCX build cannot satisfy (aliases resolved)."""
    negate, items = split_ucx_tls(tls)
    avail = set(available)
    if negate:
        return []  # an exclusion list never asks for a transport
    missing = []
    for name in items:
        if name == "all":
            continue
        members = UCX_TL_ALIASES.get(name, (name,))
        if not any(m in avail for m in members):
            missing.append(name)
    return missing


def eval_ucx_transports(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``ucx_tls`` (the planned UCX_TLS for this host; empty/None = UCX default)."""
    tls = ctx.params.get("ucx_tls") or ""
    found = parse_ucx_transports(out.stdout)
    if not found:
        return [unparsed(ctx, "ucx_info -d", out)]
    names = sorted(found)
    if not tls.strip():
        return [
            row(
                ctx,
                Status.OK,
                f"UCX offers {', '.join(names)} (UCX_TLS not set)",
                transports=names,
            )
        ]
    negate, items = split_ucx_tls(tls)
    if negate:
        return [
            row(
                ctx,
                Status.OK,
                f"UCX_TLS={tls} excludes {', '.join(items)}; UCX offers {', '.join(names)}",
                transports=names,
            )
        ]
    results = []
    for name in ucx_tls_missing(tls, found):
        if name in IB_TLS:
            fix = (
                "no usable IB/RoCE port for UCX, or UCX built without verbs/mlx5: check "
                "`ucx_info -d | grep Transport`, rdma ports, and UCX --with-verbs"
            )
        else:
            fix = _UCX_FIX.get(
                name, f"install a UCX build that provides '{name}', or drop it from UCX_TLS"
            )
        results.append(
            row(
                ctx,
                Status.FAIL,
                f"UCX_TLS names '{name}' but ucx_info -d offers no such transport",
                fix,
                missing=name,
                transports=names,
            )
        )
    if not results:
        results.append(
            row(
                ctx,
                Status.OK,
                f"every transport in UCX_TLS={tls} is offered",
                transports=names,
            )
        )
    return results


_ENV_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def parse_env(text: str) -> dict[str, str]:
    """``env`` output; continuation lines of multi-line values are ignored."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        m = _ENV_LINE.match(line)
        if m:
            env[m.group(1)] = m.group(2)
    return env


def eval_ucx_env(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``planned_env`` (the env the launcher will set on this host)."""
    if out.rc != 0 and not out.stdout.strip():
        return [unparsed(ctx, "env", out)]
    env = parse_env(out.stdout)
    planned: Mapping[str, str] = ctx.params.get("planned_env") or {}
    stray = {k: v for k, v in env.items() if k.startswith("UCX_")}
    if not stray:
        return [row(ctx, Status.OK, "no UCX_* variables in the host environment")]
    results = []
    for k, v in sorted(stray.items()):
        if k in planned and str(planned[k]) == v:
            continue
        if k in planned:
            msg = f"host environment sets {k}={v}; the plan sets {k}={planned[k]}"
        else:
            msg = f"stray {k}={v} in the host environment (not in the plan)"
        results.append(
            row(
                ctx,
                Status.WARN,
                msg,
                f"remove {k} from the login environment (~/.bashrc, /etc/environment, "
                "modules) or set it explicitly in the topology",
                var=k,
                value=v,
            )
        )
    return results or [row(ctx, Status.OK, "UCX_* variables match the plan")]


# ------------------------------------------------------------------- plan -> params


def _transports_calls(facts: HostFacts) -> list[Call]:
    # one job per distinct UCX_TLS on the host; ucx_info is needed only when one of them
    # names a transport a plain UCX build may lack
    calls = []
    for tls in sorted({x.ucx_tls or "" for x in facts.engines}):
        _, items = split_ucx_tls(tls)
        calls.append(Call({"ucx_tls": tls}, any(i not in BASIC_TLS for i in items)))
    return calls


def _env_calls(facts: HostFacts) -> list[Call]:
    planned: dict[str, str] = {}
    for proc in facts.processes:
        planned.update(proc.env)
    return [Call({"planned_env": planned})]


# ---------------------------------------------------------------------------- probes

_UCX = Needs(transports=frozenset({"ucx"}))

TRANSPORTS = Probe(
    "ucx.transports",
    "UCX transports vs UCX_TLS",
    need("ucx_info") + "ucx_info -d | grep -E 'Memory domain:|Component:|Transport:|"
    "Device:|Type:|no supported devices'",
    eval_ucx_transports,
    "ucx_info -d",
    tool="ucx_info",
    install="install UCX tools (ucx / ucx-utils) or put the NIXL/UCX bin dir on PATH",
    needs=_UCX,
    timeout_s=60.0,
    calls=_transports_calls,
)
ENV = Probe(
    "ucx.env",
    "stray UCX_* variables",
    "env",
    eval_ucx_env,
    "env",
    needs=_UCX,
    calls=_env_calls,
)

PROBES = (TRANSPORTS, ENV)
