"""`up`'s last step before recording the deployment as up, on every runtime: the canary.

``all`` (the default): every prefill -> decode pair proven directly
(:mod:`pdlaunch.observe.canary`), then one request through the router
(:func:`pdlaunch.observe.health.canary`); ``router``: only the latter; ``off``: none. A
failing pair is named, with the doctor findings of its two engines, and fails `up` (which
rolls back).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdlaunch.observe import canary as pairs_canary
from pdlaunch.observe import health
from pdlaunch.plan.build import Plan
from pdlaunch.runtime.base import Launch

from .model import Failure, LaunchError, Reporter

if TYPE_CHECKING:
    from .run import Run

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


@dataclass(frozen=True)
class _Placed:
    """A process where it really listens (pdlaunch.observe.canary reads name, role, health_url and
    the DP ranks it fronts)."""

    name: str
    role: str
    health_url: str | None
    dp_ranks: list[int]


def run_canary(run: Run) -> health.CanaryResult | None:
    """The canary of ``opts.canary``'s mode, at the URLs the runtime placed the processes
    at; raises LaunchError naming what failed."""
    opts, plan, launch, reporter = run.opts, run.plan, run.launch, run.reporter
    mode = canary_mode(opts.canary)
    if mode == "off":
        return None
    min_tokens = 2 * max_prefill_block(plan) + 1
    placed = [_Placed(p.name, p.role, launch.health_url(p), p.dp_ranks) for p in plan.processes]

    def timeout() -> float:
        return min(opts.canary_timeout, max(5.0, run.deadline - time.monotonic()))

    def urls(role: str) -> list[str]:
        return [p.health_url for p in placed if p.role == role and p.health_url]

    results: list[pairs_canary.PairResult] = []
    if mode == "all":
        prefills = pairs_canary.engines(placed, "prefill")
        decodes = pairs_canary.engines(placed, "decode")
        reporter.step(
            f"canary: {pairs_canary.pair_count(prefills, decodes)} prefill "
            f"{pairs_canary.ARROW} decode "
            "pair(s), each sent directly"
        )
        for r in pairs_canary.iter_pairs(
            prefills,
            decodes,
            plan.served_model_name,
            timeout=timeout(),
            min_prompt_tokens=min_tokens,
        ):
            reporter.step(
                f"canary {r.pair}: {'ok' if r.ok else 'FAILED'} ({r.latency_s or 0:.2f}s)"
            )
            results.append(r)
        results = pairs_canary.in_pair_order(results, prefills, decodes)
        bad = [r for r in results if not r.ok]
        if bad:
            _explain(bad, launch, reporter)
            summary = pairs_canary.summarize(results, None)
            raise LaunchError(f"canary failed: {summary.message}", _pair_failures(run, bad))
    reporter.step("canary request through the router")
    router_url = launch.health_url(plan.router)
    router = health.canary(
        health.base_url(router_url) if router_url else plan.endpoint(),
        plan.served_model_name,
        urls("prefill"),
        urls("decode"),
        timeout=timeout(),
        reference_health=urls("prefill"),
        min_prompt_tokens=min_tokens,
    )
    if not router.ok:
        fails = [run.failure(plan.router, router.message)]
        for d in plan.by_role("decode")[:1]:
            fails.append(run.failure(d, "decode log"))
        raise LaunchError(f"canary failed: {router.message}", fails)
    if mode == "router":
        return router
    return pairs_canary.summarize(results, router)


def _explain(bad: list[pairs_canary.PairResult], launch: Launch, reporter: Reporter) -> None:
    """Attach the doctor findings (logs and metrics of the pair's engines) to failed pairs;
    a doctor that cannot look is no reason to hide the failure itself."""
    try:
        findings = launch.explain([n for r in bad for n in (r.prefill, r.decode)])
    except Exception as exc:  # the failure is reported either way
        reporter.warn(f"doctor could not explain the failed pair(s): {exc}")
        return
    pairs_canary.attach_findings(bad, findings)


def _pair_failures(run: Run, bad: list[pairs_canary.PairResult]) -> list[Failure]:
    """One Failure per engine of a failed pair (decode first), each with its log's end."""
    by_name = {p.name: p for p in run.plan.processes}
    out: list[Failure] = []
    seen: set[str] = set()
    for r in bad:
        for name in (r.decode, r.prefill):
            if name in seen:
                continue
            seen.add(name)
            out.append(run.failure(by_name[name], r.describe()))
    return out
