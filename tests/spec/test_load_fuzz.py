"""No input makes pdlaunch raise anything but LoadError, or print a traceback.

(a) arbitrary text and bytes in a file -> `load` returns or raises LoadError;
(b) the seed topologies with values replaced, deleted or inserted at random paths ->
    load, validate and (when valid) plan and render raise nothing but LoadError, within
    time and memory bounds;
(c) the CLI on such files exits 0/1/2 without a traceback.
The regression tests at the end are inputs that once crashed.
"""

from __future__ import annotations

import copy
import resource
import signal
import subprocess
import sys
import textwrap
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pdlaunch.cli import app
from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import render_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import LoadError, load

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = {p.name: yaml.safe_load(p.read_text()) for p in (ROOT / "topologies").glob("*.yaml")}

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays reproducible
    database=None,  # nothing written into the shared checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SECONDS = 10  # per example
EXTRA_MEMORY = 2 << 30  # per example, on top of what the test process already maps


class TooSlow(Exception):
    pass


def _raise_too_slow(*_):
    raise TooSlow(f"one example ran over {SECONDS} s")


def _mapped_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


@contextmanager
def bounded():
    """Turn a runaway example into an error instead of hanging or exhausting the host."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _mapped_bytes() + EXTRA_MEMORY
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    old = signal.signal(signal.SIGALRM, _raise_too_slow)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.alarm(SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, old)


def pipeline(path: Path) -> None:
    with bounded():
        try:
            topo, source = load(path)
        except LoadError:
            return
        findings = validate(topo, source)
        if not has_errors(findings):
            render_plan(build_plan(topo))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# --------------------------------------------------------------------------- (a)

YAMLISH = st.text(
    alphabet=st.sampled_from([*"{}[]:,-&*!|>'\"%@`#? \t\n\r\\abcxyz019.", "\ufeff", "é"]),
    max_size=300,
)


@FUZZ
@given(content=st.one_of(st.text(max_size=300), st.binary(max_size=300), YAMLISH))
def test_any_file_content_is_load_error_or_topology(workdir, content):
    path = workdir / "a.yaml"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(content)
    with bounded(), suppress(LoadError):
        load(path)


# --------------------------------------------------------------------------- (b)


def _leaves(x: object) -> list:
    if isinstance(x, dict):
        return [v for item in x.values() for v in _leaves(item)]
    if isinstance(x, list):
        return [v for item in x for v in _leaves(item)]
    return [x]


def _keys(x: object) -> set[str]:
    if isinstance(x, dict):
        return set(x) | {k for v in x.values() for k in _keys(v)}
    if isinstance(x, list):
        return {k for v in x for k in _keys(v)}
    return set()


LEAVES = sorted({repr(v): v for t in TOPOLOGIES.values() for v in _leaves(t)}.values(), key=repr)
KEYS = sorted(
    {k for t in TOPOLOGIES.values() for k in _keys(t)}
    | {"dp", "size", "local_size", "hosts", "host", "devices", "side_channel_port", "tp"}
    | {"kv_layout", "block_size", "agreed_block_size", "kind", "mooncake", "kv_port"}
    | {"engine_id", "master_address", "rpc_port", "hybrid_lb", "name", "served_name"}
    | {"model_path", "dtype", "kv_cache_dtype", "bind", "local", "ssh", "kv_buffer_device"}
)
SPECIAL = ["auto", "NHD", "HND", "cuda", "hpu", "npu", "cpu", "nixl", "mooncake", "toy-proxy"]
SPECIAL += ["${env:HF_TOKEN}", "${env:}", "127.0.0.1", "::1", "localhost", "0.0.0.0", "", " "]
SPECIAL += ["1-2", "65535-1", "--port=1", "--pipeline-parallel-size=2", "-tp", "x" * 300]

SCALARS = st.one_of(
    st.integers(-5, 70000),
    st.sampled_from([0, -1, 1, 2, 3, 7, 16, 32, 65535, 65536, 10**6, 10**9, 2**63, 10**30]),
    st.integers(-(2**70), 2**70),
    st.sampled_from(LEAVES + SPECIAL),
    st.text(max_size=12),
    st.none(),
    st.booleans(),
    st.floats(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(x: object, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(x, dict):
        for k, v in x.items():
            out += _paths(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out += _paths(v, (*path, i))
    return out


def _get(x: object, path: tuple) -> object:
    for p in path:
        x = x[p]  # type: ignore[index]
    return x


@st.composite
def mutated_topology(draw) -> dict:
    data = copy.deepcopy(TOPOLOGIES[draw(st.sampled_from(sorted(TOPOLOGIES)))])
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(data)))
        op = draw(st.sampled_from(["replace", "delete", "insert"]))
        target = _get(data, path)
        if op == "insert" and isinstance(target, dict):
            target[draw(st.sampled_from(KEYS) | st.text(max_size=8))] = draw(VALUES)
        elif op == "insert" and isinstance(target, list):
            target.insert(draw(st.integers(0, len(target))), draw(VALUES))
        elif not path:
            continue
        elif op == "delete":
            del _get(data, path[:-1])[path[-1]]  # type: ignore[attr-defined]
        else:
            _get(data, path[:-1])[path[-1]] = draw(VALUES)  # type: ignore[index]
    return data


@FUZZ
@given(data=mutated_topology())
def test_mutated_topologies_never_crash(workdir, data):
    path = workdir / "b.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    pipeline(path)


# --------------------------------------------------------------------------- (c)

COMMANDS = [["validate"], ["validate", "--json"], ["plan", "--json"], ["render", "-o"]]


@FUZZ
@given(
    content=st.one_of(
        mutated_topology().map(lambda d: yaml.safe_dump(d, sort_keys=False)), YAMLISH
    ),
    command=st.sampled_from(COMMANDS),
)
def test_cli_exit_codes_without_traceback(workdir, content, command):
    path = workdir / "c.yaml"
    path.write_text(content, encoding="utf-8", errors="surrogatepass")
    args = [*command, str(path)]
    if command[-1] == "-o":
        args = [command[0], str(path), "-o", str(workdir / "c-out")]
    with bounded():
        result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- regressions


SEED_TOPOLOGIES = {
    "ascend-mooncake-tp2.yaml",
    "cuda-prefill-gaudi-decode.yaml",
    "gaudi-prefill-cuda-decode.yaml",
    "gb200-xpyd.yaml",
    "local-cpu.yaml",
}


def test_seed_topologies_pass_the_pipeline(workdir):
    """Every seed topology, and the re-dumped copy the fuzzing starts from, loads, validates
    without errors, plans and renders. Unlike `pipeline`, nothing is allowed to stop early:
    a LoadError or an error finding fails the test, and so does a missing topology file."""
    assert set(TOPOLOGIES) == SEED_TOPOLOGIES
    done = []
    for name in sorted(SEED_TOPOLOGIES):
        copy_path = workdir / name
        copy_path.write_text(yaml.safe_dump(TOPOLOGIES[name], sort_keys=False), encoding="utf-8")
        for path in (ROOT / "topologies" / name, copy_path):
            topo, source = load(path)
            errors = [f for f in validate(topo, source) if f.severity == "error"]
            assert not errors, (path, [f"{f.where}: {f.message}" for f in errors])
            plan = build_plan(topo)
            assert plan.processes, path
            assert render_plan(plan), path
            done.append(path.name)
    assert done == [n for n in sorted(SEED_TOPOLOGIES) for _ in range(2)]


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_yaml_is_a_load_error(workdir):
    # Was: RecursionError out of yaml.compose / load._expanded_size (depth ~500+).
    path = workdir / "deep.yaml"
    path.write_text(_deep(1000), encoding="utf-8")
    with pytest.raises(LoadError):
        load(path)
    path.write_text("a: " + "{a: " * 1000 + "1" + "}" * 1000, encoding="utf-8")
    with pytest.raises(LoadError):
        load(path)


def _run_bounded(code: str, *args: str) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    cmd = [sys.executable, "-c", textwrap.dedent(code), *args]
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, preexec_fn=limit, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after 120 s: {args}")


def test_very_deeply_nested_yaml_does_not_kill_the_process(workdir):
    # Was: SIGSEGV (rc -11) in libyaml's recursive composer (CSafeLoader) at depth ~30000,
    # a 60 KB file; `pdlaunch validate` dies without a message.
    path = workdir / "deeper.yaml"
    path.write_text(_deep(50_000), encoding="utf-8")
    proc = _run_bounded("from pdlaunch.cli import main; main()", "validate", str(path))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr


HUGE = {
    # Was: MemoryError in rules.devices (list(range(tp * local DP))).
    "tp": ("prefill", 0, "tp", 10**9),
    # Was: hang, then MemoryError in ports._side_channel_ports (one port per DP rank).
    "dp": ("prefill", 0, "dp", {"size": 10**9}),
    "local_size": ("decode", 0, "dp", {"size": 2, "local_size": 10**9}),
}


@pytest.mark.parametrize("case", sorted(HUGE))
def test_huge_parallel_sizes_are_findings_not_crashes(workdir, case):
    role, index, key, value = HUGE[case]
    data = copy.deepcopy(TOPOLOGIES["cuda-prefill-gaudi-decode.yaml"])
    data[role][index][key] = value
    path = workdir / f"huge-{case}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    proc = _run_bounded(
        """
        import sys
        from pdlaunch.spec.load import LoadError, load
        from pdlaunch.rules import has_errors, validate
        try:
            topo, source = load(sys.argv[1])
        except LoadError:
            print("load error")
        else:
            print("findings" if has_errors(validate(topo, source)) else "valid")
        """,
        str(path),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() in ("load error", "findings")
