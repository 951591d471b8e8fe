"""The canary over every prefill -> decode pair: each pair gets one request sent directly, as
the router would send it, and is proven on its own.

One request through the router (:func:`pdlaunch.observe.health.canary`) proves one path, the one the
router picked; a broken pair (a decode that cannot reach one prefill's NIXL side channel, a
prefill whose KV layout one decode misreads) only hurts the requests routed through it. So for
each (prefill, decode):

1. POST the prompt to the prefill with ``kv_transfer_params: {"do_remote_decode": true}`` and
   ``max_tokens: 1`` (what vllm-router and vLLM's toy proxy send; see :data:`REMOTE_DECODE`);
   its answer carries the ``kv_transfer_params`` (block ids, engine id, side channel) that
2. POST to the decode with the same prompt: decode pulls the KV over the connector and
   generates greedily;
3. read the decode's own ``/metrics`` before and after: ``prompt_tokens_by_source_total``
   must show the prompt loaded (``external_kv_transfer`` >= prompt - 1: vLLM may recompute the
   last token) and not computed there, and no NIXL transfer may have failed (vLLM falls back
   to recompute on a failed load, ``kv_load_failure_policy``: the answer is right and the pair
   is not disaggregated);
4. the same greedy request to the prefill alone must give the same text (KV that arrives in
   the wrong layout decodes into fluent garbage with HTTP 200).

Counters are per engine, so the pairs of one decode run one after the other; different
decodes' counters are disjoint and their pairs may run in parallel. Another request finishing
on the decode meanwhile makes its counters unattributable: the pair is retried with a fresh
prompt, and reported as unproven if that keeps happening.

A data-parallel engine is one API server in front of several ranks, each with its own NIXL
agent and side channel (and, across nodes, its own network path): a request through it proves
only the rank vLLM's load balancer picked. So every rank is a pair end of its own: the request
is pinned with vLLM's ``X-data-parallel-rank`` header (an index into the ranks the server
manages: ``_get_data_parallel_rank`` in vllm/entrypoints/generate/base/serving.py of vLLM 0.32,
used by ``DPLBAsyncMPClient.get_core_engine_for_request`` in vllm/v1/engine/core_client.py), and the
decode's counters are read for that rank only (its ``engine`` label). That also makes `up` do
each rank's first NIXL handshake, which users' first requests would otherwise wait for.

The request/verdict logic is here and I/O-light (HTTP through :mod:`pdlaunch.observe.health`); which
engines to pair, and which doctor findings explain a failure, the callers decide
(``pdlaunch.runtime.lifecycle.canary`` for ``up``, ``pdlaunch.cli.canary`` for ``pdlaunch canary``).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from pdlaunch.observe.health import (
    CanaryResult,
    base_url,
    canary_prompt,
    completion_text,
    get_text,
    post_json,
)
from pdlaunch.observe.watch import Counters

ARROW = "→"
MAX_TOKENS = 8  # greedy tokens compared with prefill alone
ATTEMPTS = 3  # tries of a pair whose decode served other requests meanwhile

# What a router sends prefill for a remotely decoded request (vllm-router 0.1.17, vLLM's
# examples/online_serving/disaggregated_serving/toy_proxy_server.py): prefill computes the
# prompt, keeps its KV for decode to pull, and answers with the kv_transfer_params to pass on.
REMOTE_DECODE: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the prefill half of a direct PD request: one token, not streamed."""
    return {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": dict(REMOTE_DECODE)}


DP_RANK_HEADER = "X-data-parallel-rank"


@dataclass(frozen=True)
class Engine:
    name: str
    url: str  # base URL: http://host:port
    # The data-parallel ranks its API server fronts (plan.Process.dp_ranks), in the order
    # the header counts them; empty (or one): nothing to pin.
    dp_ranks: tuple[int, ...] = ()

    def ranks(self) -> list[int | None]:
        """The pair ends it stands for: each DP rank, or itself (None)."""
        return list(self.dp_ranks) if len(self.dp_ranks) > 1 else [None]

    def headers(self, rank: int | None) -> dict[str, str]:
        return {} if rank is None else {DP_RANK_HEADER: str(self.dp_ranks.index(rank))}


class _HasHealth(Protocol):
    name: str
    role: str
    health_url: str | None
    dp_ranks: Sequence[int]


def engines(processes: Iterable[_HasHealth], role: str) -> list[Engine]:
    """The engines of ``role`` that serve HTTP (plan processes or recorded ones)."""
    return [
        Engine(p.name, base_url(p.health_url), tuple(p.dp_ranks))
        for p in processes
        if p.role == role and p.health_url
    ]


def end_name(name: str, rank: int | None) -> str:
    return name if rank is None else f"{name} (DP rank {rank})"


def pair_name(prefill: str, decode: str) -> str:
    return f"{prefill} {ARROW} {decode}"


def pair_count(prefills: Sequence[Engine], decodes: Sequence[Engine]) -> int:
    return sum(len(p.ranks()) for p in prefills) * sum(len(d.ranks()) for d in decodes)


@dataclass
class PairResult:
    prefill: str
    decode: str
    ok: bool
    message: str
    latency_s: float | None = None
    prompt_tokens: int | None = None
    delta: Counters | None = None
    attempts: int = 1
    findings: list[str] = field(default_factory=list)  # doctor's, for a failed pair
    prefill_rank: int | None = None  # the DP rank the requests were pinned to
    decode_rank: int | None = None

    @property
    def pair(self) -> str:
        return pair_name(
            end_name(self.prefill, self.prefill_rank), end_name(self.decode, self.decode_rank)
        )

    def describe(self) -> str:
        text = f"{self.pair}: {self.message}"
        if self.findings:
            text += " (doctor: " + "; ".join(self.findings) + ")"
        return text

    def to_dict(self) -> dict[str, Any]:
        d = self.delta
        return {
            "pair": self.pair,
            "prefill": self.prefill,
            "decode": self.decode,
            "prefill_dp_rank": self.prefill_rank,
            "decode_dp_rank": self.decode_rank,
            "ok": self.ok,
            "message": self.message,
            "latency_s": self.latency_s,
            "prompt_tokens": self.prompt_tokens,
            "decode_external_kv_transfer_tokens": None if d is None else d.external,
            "decode_local_compute_tokens": None if d is None else d.local,
            "decode_failed_transfers": None if d is None else d.failed,
            "attempts": self.attempts,
            "findings": list(self.findings),
        }


# -- the verdict (pure) ---------------------------------------------------------------------------
BUSY = "busy"


def judge(
    prompt_tokens: int | None, delta: Counters, pd_text: str, alone_text: str
) -> tuple[bool | None, str]:
    """A pair's verdict from its decode's counter deltas and the two answers: (True, what was
    proven), (False, what is wrong), or (None, why the counters cannot be attributed)."""
    if delta.problems:
        # Before any comparison: every comparison with NaN is False, so a NaN counter passed
        # every check below.
        return False, "decode's " + delta.no_evidence()
    if min(delta.requests, delta.local, delta.external, delta.failed) < 0:
        return False, "decode's counters went back during the canary: it restarted"
    if not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
        return False, "decode's answer does not say how many prompt tokens it read (usage)"
    if delta.requests > 1 or delta.local + delta.external > prompt_tokens:
        return None, (
            f"decode finished {delta.requests:g} request(s) and read "
            f"{delta.local + delta.external:g} prompt tokens for a {prompt_tokens}-token "
            "canary: other requests ran on it meanwhile"
        )
    wrong = []
    if delta.external <= 0:
        wrong.append(
            f"the KV did not move: decode loaded no prompt token over the KV connector and "
            f"computed {delta.local:g} of {prompt_tokens} itself (a failed or skipped transfer "
            "is recomputed by vLLM)"
        )
    elif delta.external < prompt_tokens - 1:
        wrong.append(
            f"decode loaded only {delta.external:g} of {prompt_tokens} prompt tokens over the "
            f"KV connector and computed {delta.local:g} itself: some of prefill's KV blocks "
            "were not transferred"
        )
    elif delta.local > 1:
        wrong.append(f"decode recomputed {delta.local:g} prompt tokens")
    if delta.failed > 0:
        wrong.append(f"{delta.failed:g} NIXL transfer(s) or notification(s) failed on decode")
    if pd_text != alone_text:
        wrong.append(
            f"answered {pd_text!r}, prefill alone answers {alone_text!r}: decode read KV it "
            "cannot use correctly (layout, block size or dtype mismatch; see `pdlaunch "
            "validate` and the decode log)"
        )
    if wrong:
        return False, "; ".join(wrong)
    return True, (
        f"KV moved ({delta.external:g} of {prompt_tokens} prompt tokens loaded over the "
        "connector) and the answer equals prefill alone"
    )


# -- one pair -------------------------------------------------------------------------------------
class PairError(Exception):
    """A request of the pair could not be made or was refused; the message names which."""


def _post(
    url: str,
    body: dict[str, Any],
    timeout: float,
    what: str,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    try:
        status, resp = post_json(url, body, timeout, headers=headers)
    except OSError as exc:
        # "canary request ... timed out": what tests/support/engines.py retries `up` on
        raise PairError(f"canary request to {what} failed: {exc}") from None
    if status != 200 or not isinstance(resp, dict) or completion_text(resp) is None:
        raise PairError(f"canary request to {what} answered HTTP {status}: {str(resp)[:300]}")
    return resp


def _metrics(engine: Engine, timeout: float) -> str:
    try:
        return get_text(engine.url + "/metrics", timeout)
    except OSError as exc:
        raise PairError(f"cannot read {engine.name}'s /metrics: {exc}") from None


def direct_pd(
    prefill: Engine,
    decode: Engine,
    body: dict[str, Any],
    timeout: float,
    prefill_rank: int | None = None,
    decode_rank: int | None = None,
) -> dict[str, Any]:
    """One request through the pair, without the router: prefill with ``do_remote_decode``,
    then decode with the ``kv_transfer_params`` prefill returned, each pinned to its DP rank
    when one is given. Decode's answer."""
    pre = _post(
        prefill.url + "/v1/completions",
        prefill_body(body),
        timeout,
        end_name(prefill.name, prefill_rank),
        prefill.headers(prefill_rank),
    )
    params = pre.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("remote_block_ids"):
        raise PairError(
            f"{prefill.name} returned no kv_transfer_params with block ids ({params!r}): it "
            "does not hand out KV (no KV connector, or not kv_producer/kv_both)"
        )
    return _post(
        decode.url + "/v1/completions",
        {**body, "kv_transfer_params": params},
        timeout,
        end_name(decode.name, decode_rank),
        decode.headers(decode_rank),
    )


def rank_delta(before: str, after: str, rank: int | None) -> tuple[Counters, str]:
    """Decode's counter deltas between two /metrics pages, for the canary: the pinned rank's
    (failures from the whole page, in case a release counts them without the rank label), or
    the whole page's. The note is set when the request ran on another rank than the one
    pinned: a release that does not read the header; the engine is then judged as a whole."""
    whole = Counters.parse(after) - Counters.parse(before)
    if rank is None:
        return whole, ""
    mine = Counters.parse(after, str(rank)) - Counters.parse(before, str(rank))
    if mine.requests == 0 and mine.local + mine.external == 0 and whole.local + whole.external:
        return whole, (
            f"DP rank {rank} not proven on its own: vLLM ran the request on another rank "
            f"(it does not read {DP_RANK_HEADER}); "
        )
    problems = tuple(dict.fromkeys(mine.problems + whole.problems))
    return (
        Counters(mine.requests, mine.local, mine.external, whole.failed, whole.expired, problems),
        "",
    )


def check_pair(
    prefill: Engine,
    decode: Engine,
    model: str,
    *,
    timeout: float = 60.0,
    settle: float = 5.0,
    min_prompt_tokens: int = 0,
    attempts: int = ATTEMPTS,
    prefill_rank: int | None = None,
    decode_rank: int | None = None,
) -> PairResult:
    """Prove one pair (see the module docstring), each end pinned to its DP rank when one is
    given. Never raises for what an engine answers."""
    ends = {"prefill_rank": prefill_rank, "decode_rank": decode_rank}
    for attempt in range(1, attempts + 1):
        body = {
            "model": model,
            "prompt": canary_prompt(min_prompt_tokens),
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        }
        t0 = time.monotonic()
        try:
            before = _metrics(decode, min(timeout, 30.0))
            resp = direct_pd(prefill, decode, body, timeout, prefill_rank, decode_rank)
            latency = time.monotonic() - t0
            usage = resp.get("usage")
            prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            after = _settled(decode, before, prompt_tokens, timeout, settle)
            alone = _post(
                prefill.url + "/v1/completions",
                body,
                timeout,
                f"{end_name(prefill.name, prefill_rank)} alone",
                prefill.headers(prefill_rank),
            )
        except PairError as exc:
            return PairResult(prefill.name, decode.name, False, str(exc), attempts=attempt, **ends)
        delta, note = rank_delta(before, after, decode_rank)
        ok, message = judge(
            prompt_tokens, delta, completion_text(resp) or "", completion_text(alone) or ""
        )
        result = PairResult(
            prefill.name,
            decode.name,
            bool(ok),
            note + (message if ok is not None else f"not proven: {message}"),
            round(latency, 3),
            prompt_tokens if isinstance(prompt_tokens, int) else None,
            delta,
            attempt,
            **ends,
        )
        if ok is not None:
            return result
    return result


def _settled(
    decode: Engine, before: str, prompt_tokens: object, timeout: float, settle: float
) -> str:
    """Decode's /metrics once its stats for the request are in (vLLM may update them just
    after answering): every prompt token accounted for, or ``settle`` s passed."""
    deadline = time.monotonic() + settle
    start = Counters.parse(before)
    while True:
        page = _metrics(decode, min(timeout, 30.0))
        delta = Counters.parse(page) - start
        done = isinstance(prompt_tokens, int) and delta.local + delta.external >= prompt_tokens
        if done or time.monotonic() > deadline:
            return page
        time.sleep(0.1)


# -- every pair -----------------------------------------------------------------------------------
def iter_pairs(
    prefills: Sequence[Engine],
    decodes: Sequence[Engine],
    model: str,
    *,
    timeout: float = 60.0,
    settle: float = 5.0,
    min_prompt_tokens: int = 0,
    parallel: bool = True,
) -> Iterator[PairResult]:
    """Every (prefill, decode) pair, a DP engine's ranks each an end of its own, each yielded
    as it finishes, so the caller reports progress in its own thread, without handing this
    module a callback. A decode's pairs run in turn (its counters are per engine); with
    ``parallel``, the decodes run at once."""

    def of_decode(decode: Engine) -> Iterator[PairResult]:
        for decode_rank in decode.ranks():
            for prefill in prefills:
                for prefill_rank in prefill.ranks():
                    yield check_pair(
                        prefill,
                        decode,
                        model,
                        timeout=timeout,
                        settle=settle,
                        min_prompt_tokens=min_prompt_tokens,
                        prefill_rank=prefill_rank,
                        decode_rank=decode_rank,
                    )

    if not parallel or len(decodes) <= 1:
        for decode in decodes:
            yield from of_decode(decode)
        return
    finished: queue.Queue[PairResult | BaseException] = queue.Queue()

    def one_decode(decode: Engine) -> None:
        try:
            for result in of_decode(decode):
                finished.put(result)
        except BaseException as exc:  # handed to the caller's thread, raised there
            finished.put(exc)

    with ThreadPoolExecutor(max_workers=len(decodes)) as pool:
        for decode in decodes:
            pool.submit(one_decode, decode)
        for _ in range(pair_count(prefills, decodes)):
            item = finished.get()
            if isinstance(item, BaseException):
                raise item
            yield item


def check_pairs(
    prefills: Sequence[Engine],
    decodes: Sequence[Engine],
    model: str,
    **options: Any,
) -> list[PairResult]:
    """Every pair of :func:`iter_pairs` (same options), in (prefill, decode) order whatever
    order they ran in."""
    return in_pair_order(iter_pairs(prefills, decodes, model, **options), prefills, decodes)


def in_pair_order(
    results: Iterable[PairResult], prefills: Sequence[Engine], decodes: Sequence[Engine]
) -> list[PairResult]:
    """``results`` (as :func:`iter_pairs` yielded them) in (prefill, decode) order, a DP
    engine's ranks in rank order."""
    by_pair = {(r.prefill, r.prefill_rank, r.decode, r.decode_rank): r for r in results}
    return [
        by_pair[(p.name, pr, d.name, dr)]
        for p in prefills
        for pr in p.ranks()
        for d in decodes
        for dr in d.ranks()
    ]


class _Finding(Protocol):
    id: str
    severity: str
    process: str
    what: str


def attach_findings(results: Iterable[PairResult], findings: Sequence[_Finding]) -> None:
    """Give each failed pair the doctor findings of its two engines that explain it: errors
    (warnings where there is no error), decode's first."""
    for r in results:
        if r.ok:
            continue
        mine = [f for f in findings if f.process in (r.decode, r.prefill)]
        errors = [f for f in mine if f.severity == "error"] or mine
        errors.sort(key=lambda f: f.process != r.decode)
        r.findings = [f"{f.id} on {f.process}: {f.what}" for f in errors[:3]]


def summarize(pairs: Sequence[PairResult], router: CanaryResult | None) -> CanaryResult:
    """One result for `up` and `pdlaunch canary`: the router check's details as before (so
    their JSON keeps its fields), plus ``pairs``; the message names every failed pair."""
    details: dict[str, object] = dict(router.details) if router is not None else {}
    details["pairs"] = [r.to_dict() for r in pairs]
    if router is not None:
        details["router"] = {"ok": router.ok, "message": router.message}
    bad = [r for r in pairs if not r.ok]
    if bad:
        message = f"{len(bad)} of {len(pairs)} prefill {ARROW} decode pair(s) failed: " + "; ".join(
            r.describe() for r in bad
        )
        return CanaryResult(False, message, details)
    parts = []
    if pairs:
        slowest = max((r.latency_s or 0.0) for r in pairs)
        parts.append(
            f"all {len(pairs)} prefill {ARROW} decode pair(s) moved their KV and answered as "
            f"prefill alone (slowest {slowest:.2f}s)"
        )
    if router is not None:
        parts.append(f"router: {router.message}")
    return CanaryResult(router is None or router.ok, "; ".join(parts), details)
