"""`up`'s last step before recording the deployment as up: the canary.

``all`` (the default): every prefill -> decode pair proven directly (:mod:`pdlaunch.canary`),
then one request through the router (:func:`pdlaunch.health.canary`); ``router``: only the
latter; ``off``: none. A failing pair is named, with the doctor findings of its two engines,
and fails `up` (which rolls back).
"""

from __future__ import annotations

import contextlib
import time

from pdlaunch import canary as pairs_canary
from pdlaunch import health
from pdlaunch.hosts import HostPool
from pdlaunch.plan import Plan
from pdlaunch.state import DeploymentState

from .model import Failure, LaunchError, Reporter, UpOptions
from .records import log_tail, proc_host

MODES = ("all", "router", "off")


def canary_mode(value: bool | str) -> str:
    """UpOptions.canary: True/False (the CLI's --canary/--no-canary) or a mode of MODES."""
    if value is True:
        return "all"
    if value is False:
        return "off"
    if value not in MODES:
        raise ValueError(f"canary mode {value!r}: expected one of {', '.join(MODES)}")
    return value


def max_prefill_block(plan: Plan) -> int:
    """The largest --block-size a prefill runs (0 if none is set): the canary's prompt spans
    more than two of them, so a re-blocked page and its sub-pages are all read back."""
    sizes = [0]
    for p in plan.by_role("prefill"):
        argv = list(p.argv)
        if "--block-size" in argv and argv.index("--block-size") + 1 < len(argv):
            with contextlib.suppress(ValueError):
                sizes.append(int(argv[argv.index("--block-size") + 1]))
    return max(sizes)


def run_canary(
    plan: Plan,
    state: DeploymentState,
    pool: HostPool,
    reporter: Reporter,
    opts: UpOptions,
    deadline: float,
) -> health.CanaryResult | None:
    """The canary of ``opts.canary``'s mode; raises LaunchError naming what failed."""
    mode = canary_mode(opts.canary)
    if mode == "off":
        return None
    min_tokens = 2 * max_prefill_block(plan) + 1

    def timeout() -> float:
        return min(opts.canary_timeout, max(5.0, deadline - time.monotonic()))

    results: list[pairs_canary.PairResult] = []
    if mode == "all":
        prefills = pairs_canary.engines(plan.processes, "prefill")
        decodes = pairs_canary.engines(plan.processes, "decode")
        reporter.step(
            f"canary: {len(prefills) * len(decodes)} prefill {pairs_canary.ARROW} decode "
            "pair(s), each sent directly"
        )
        results = pairs_canary.check_pairs(
            prefills,
            decodes,
            plan.served_model_name,
            timeout=timeout(),
            min_prompt_tokens=min_tokens,
            on_pair=lambda r: reporter.step(
                f"canary {r.pair}: {'ok' if r.ok else 'FAILED'} ({r.latency_s or 0:.2f}s)"
            ),
        )
        bad = [r for r in results if not r.ok]
        if bad:
            _explain(bad, state, pool, reporter)
            summary = pairs_canary.summarize(results, None)
            raise LaunchError(f"canary failed: {summary.message}", _pair_failures(plan, pool, bad))

    reporter.step("canary request through the router")
    router = health.canary(
        plan.endpoint(),
        plan.served_model_name,
        [p.health_url for p in plan.by_role("prefill") if p.health_url],
        [p.health_url for p in plan.by_role("decode") if p.health_url],
        timeout=timeout(),
        reference_health=[p.health_url for p in plan.by_role("prefill") if p.health_url],
        min_prompt_tokens=min_tokens,
    )
    if not router.ok:
        r = plan.router
        fails = [
            Failure(
                "router",
                r.host,
                router.message,
                r.log_path,
                log_tail(proc_host(pool, r), r.log_path),
            )
        ]
        for d in plan.by_role("decode")[:1]:
            tail = log_tail(proc_host(pool, d), d.log_path)
            fails.append(Failure(d.name, d.host, "decode log", d.log_path, tail))
        raise LaunchError(f"canary failed: {router.message}", fails)
    if mode == "router":
        return router
    return pairs_canary.summarize(results, router)


def _explain(
    bad: list[pairs_canary.PairResult],
    state: DeploymentState,
    pool: HostPool,
    reporter: Reporter,
) -> None:
    """Attach the doctor findings (logs and metrics of the pair's engines) to failed pairs;
    a doctor that cannot look is no reason to hide the failure itself."""
    from pdlaunch import doctor  # only on failure: it reads every log

    try:
        findings = doctor.diagnose(state, pool, lines=300)
    except Exception as exc:  # the failure is reported either way
        reporter.warn(f"doctor could not explain the failed pair(s): {exc}")
        return
    pairs_canary.attach_findings(bad, findings)


def _pair_failures(plan: Plan, pool: HostPool, bad: list[pairs_canary.PairResult]) -> list[Failure]:
    """One Failure per engine of a failed pair (decode first), each with its log's end."""
    by_name = {p.name: p for p in plan.processes}
    out: list[Failure] = []
    seen: set[str] = set()
    for r in bad:
        for name in (r.decode, r.prefill):
            if name in seen:
                continue
            seen.add(name)
            p = by_name[name]
            tail = log_tail(proc_host(pool, p), p.log_path)
            out.append(Failure(name, p.host, r.describe(), p.log_path, tail))
    return out
