"""UCX: the transports the planned UCX_TLS names exist in the node's UCX build (found the way
the engine loads it: with the planned LD_LIBRARY_PATH; from its module directory where no
ucx_info is installed, as with nixl[cu12] wheels), and no stray UCX_* variable in the login
environment overrides the plan."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Needs,
    Probe,
    ProbeContext,
    parse_sections,
    q,
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


# UCX loads its transports from modules in <libdir>/ucx/ (openucx/ucx config/module.am):
# what each module provides (src/uct/ib/Makefile.am: verbs, and mlx5 where UCX <= 1.17
# built it into libuct_ib; src/uct/ib/mlx5/Makefile.am; src/uct/cuda/Makefile.am;
# src/uct/cuda/gdr_copy/Makefile.am; src/uct/sm/scopy/{cma,knem}; src/uct/sm/mm/xpmem;
# src/uct/rocm; intel-staging/ucx src/uct/gaudi/Makefile.am: libuct_gaudi = gaudi_gdr).
UCX_MODULE_TLS: dict[str, tuple[str, ...]] = {
    "libuct_ib": ("rc_verbs", "ud_verbs", "rc_mlx5", "dc_mlx5", "ud_mlx5"),
    "libuct_ib_mlx5": ("rc_mlx5", "dc_mlx5", "ud_mlx5"),
    "libuct_ib_efa": ("srd",),
    "libuct_cuda": ("cuda_copy", "cuda_ipc"),
    "libuct_cuda_gdrcopy": ("gdr_copy",),
    "libuct_cma": ("cma",),
    "libuct_knem": ("knem",),
    "libuct_xpmem": ("xpmem",),
    "libuct_rocm": ("rocm_copy", "rocm_ipc"),
    "libuct_rocm_gdr": ("rocm_gdr",),
    "libuct_gaudi": ("gaudi_gdr",),
}
# Built into libuct itself (src/uct/sm/self, src/uct/tcp, src/uct/sm/mm/{posix,sysv}).
UCX_CORE_TLS = ("self", "tcp", "posix", "sysv")
# Where a UCX build keeps its modules when ucx_info is not installed: <dir>/ucx for each
# planned LD_LIBRARY_PATH entry (the Gaudi guide's /tmp/ucx_install/lib), the wheels on the
# node's Python path (nixl[cu12] ships nixl_cu12.libs/ucx and no ucx_info), system dirs.
_SYSTEM_MODULE_DIRS = (
    "/usr/lib/ucx",
    "/usr/lib64/ucx",
    "/usr/lib/x86_64-linux-gnu/ucx",
    "/usr/lib/aarch64-linux-gnu/ucx",
    "/usr/local/lib/ucx",
    "/opt/hpcx/ucx/lib/ucx",
)
_WHEEL_DIRS = (
    "import glob,os,sys; print(chr(10).join(sorted({g for p in sys.path if p "
    "for g in glob.glob(os.path.join(p, '*.libs', 'ucx'))})))"
)


def parse_ucx_modules(listing: str) -> list[str]:
    """Transports a UCX module directory listing (``ls DIR``) provides, core ones included."""
    out = set(UCX_CORE_TLS)
    for name in listing.split():
        out.update(UCX_MODULE_TLS.get(name.split(".", 1)[0], ()))
    return sorted(out)


def eval_ucx_transports(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``ucx_tls`` (the planned UCX_TLS for this host; empty/None = UCX default).

    Output: ``== ucx_info PATH ==`` then its filtered ``-d`` listing, or, without ucx_info,
    ``== modules DIR ==`` sections listing each UCX module directory found (the first is
    the one judged: the planned LD_LIBRARY_PATH comes first)."""
    tls = ctx.params.get("ucx_tls") or ""
    sections = parse_sections(out.stdout)
    modules = [
        (k.removeprefix("modules "), v) for k, v in sections.items() if k.startswith("modules ")
    ]
    where = ""
    if modules:
        where, listing = modules[0]
        names = parse_ucx_modules(listing)
        found = {n: [] for n in names}
        via = f" (by the UCX modules in {where}: no ucx_info there, so no device list)"
    else:
        found = parse_ucx_transports(out.stdout)
        names = sorted(found)
        via = ""
    if not found:
        return [unparsed(ctx, "ucx_info -d", out)]
    if not tls.strip():
        return [
            row(
                ctx,
                Status.OK,
                f"UCX offers {', '.join(names)} (UCX_TLS not set){via}",
                transports=names,
            )
        ]
    negate, items = split_ucx_tls(tls)
    if negate:
        return [
            row(
                ctx,
                Status.OK,
                f"UCX_TLS={tls} excludes {', '.join(items)}; UCX offers {', '.join(names)}{via}",
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
                f"UCX_TLS names '{name}' but "
                + (
                    f"no UCX module in {where} provides it"
                    if via
                    else "ucx_info -d offers no such transport"
                ),
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
                f"every transport in UCX_TLS={tls} is offered{via}",
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
    # In a container the login environment stays outside (variables go in by name); what
    # reaches the engine unasked is the image's own ENV.
    inside = ctx.where != "on host"
    where = "the image's environment" if inside else "the host environment"
    fix_at = (
        "the image (its ENV)"
        if inside
        else "the login environment (~/.bashrc, /etc/environment, modules)"
    )
    if not stray:
        return [row(ctx, Status.OK, f"no UCX_* variables in {where}")]
    results = []
    for k, v in sorted(stray.items()):
        if k in planned and str(planned[k]) == v:
            continue
        if k in planned:
            msg = f"{where} sets {k}={v}; the plan sets {k}={planned[k]}"
        else:
            msg = f"stray {k}={v} in {where} (not in the plan)"
        results.append(
            row(
                ctx,
                Status.WARN,
                msg,
                f"remove {k} from {fix_at} or set it explicitly in the topology",
                var=k,
                value=v,
            )
        )
    return results or [row(ctx, Status.OK, "UCX_* variables match the plan")]


# ------------------------------------------------------------------- plan -> params


def _transports_calls(facts: HostFacts) -> list[Call]:
    # one job per distinct (UCX_TLS, planned LD_LIBRARY_PATH) on the host; a UCX is needed
    # only when the UCX_TLS names a transport a plain UCX build may lack
    calls = []
    keys = {
        (x.ucx_tls or "", tuple(x.path_prepend.get("LD_LIBRARY_PATH", ()))) for x in facts.engines
    }
    for tls, dirs in sorted(keys):
        _, items = split_ucx_tls(tls)
        params = {"ucx_tls": tls, "lib_dirs": list(dirs), "python": facts.python}
        calls.append(Call(params, any(i not in BASIC_TLS for i in items)))
    return calls


_UCX_INFO_GREP = (
    "ucx_info -d | grep -E 'Memory domain:|Component:|Transport:|Device:|Type:|"
    "no supported devices'"
)


def _cmd_transports(params: Mapping[str, Any]) -> str:
    """ucx_info with the planned LD_LIBRARY_PATH (and the bin/ beside each of its dirs on
    PATH), as the engine will load UCX; without ucx_info, the module directories."""
    dirs = [str(d) for d in params.get("lib_dirs") or []]
    py = params.get("python") or "python3"
    env = ""
    if dirs:
        bins = [posixpath.join(posixpath.dirname(d.rstrip("/")), "bin") for d in dirs]
        env = (
            f"export LD_LIBRARY_PATH={q(':'.join(dirs))}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}; "
            f"PATH={q(':'.join(bins))}:$PATH; "
        )
    candidates = " ".join(q(posixpath.join(d, "ucx")) for d in dirs)
    return (
        f"{env}if command -v ucx_info >/dev/null 2>&1; then "
        'echo "== ucx_info $(command -v ucx_info) =="; '
        f"{_UCX_INFO_GREP}; exit 0; fi; found=0; "
        f"for d in {candidates} $({q(py)} -c {q(_WHEEL_DIRS)} 2>/dev/null) "
        f"{' '.join(_SYSTEM_MODULE_DIRS)}; do "
        '[ -d "$d" ] && ls "$d" 2>/dev/null | grep -q "^libuct_" && '
        '{ echo "== modules $d =="; ls "$d"; found=1; }; done; [ $found = 1 ] || exit 127'
    )


def _env_calls(facts: HostFacts) -> list[Call]:
    if not facts.engines:
        return []  # the host's engines all run in containers: it is their image's env
    planned: dict[str, str] = {}
    for proc in facts.processes:
        planned.update(proc.env)
    return [Call({"planned_env": planned})]


# ---------------------------------------------------------------------------- probes

_UCX = Needs(transports=frozenset({"ucx"}))

TRANSPORTS = Probe(
    "ucx.transports",
    "UCX transports vs UCX_TLS",
    _cmd_transports,
    eval_ucx_transports,
    "ucx_info -d",
    tool="ucx_info",
    install="no UCX found (neither ucx_info nor a UCX module directory under the planned "
    "LD_LIBRARY_PATH, the Python path's wheels or the system): install UCX tools "
    "(ucx / ucx-utils), NIXL's wheel (pip install nixl[cu12]) or the guide's UCX build",
    needs=_UCX,
    timeout_s=60.0,
    calls=_transports_calls,
    inside=True,
)
ENV = Probe(
    "ucx.env",
    "stray UCX_* variables",
    "env",
    eval_ucx_env,
    "env",
    needs=_UCX,
    calls=_env_calls,
    inside=True,
)

PROBES = (TRANSPORTS, ENV)
