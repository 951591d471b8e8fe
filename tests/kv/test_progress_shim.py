"""The NIXL progress-delay shim (pdlaunch/kv/nixl_progress/sitecustomize.py).

In-process against stand-in bindings for its edges (field missing, a caller's own delay,
twice installed, a failing config), then as Python really runs it: a fresh interpreter with
the shim's directory on PYTHONPATH, once with stand-in NIXL wheels and once with this venv's
real nixl 1.5.1, whose progress thread must stop spinning.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from pdlaunch.kv import progress

SHIM_FILE = progress.SHIM_DIR / "sitecustomize.py"


def _load_shim() -> types.ModuleType:
    """A private copy of the shim module (not named sitecustomize: nothing installs)."""
    spec = importlib.util.spec_from_file_location("pdlaunch_shim_under_test", SHIM_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def shim():
    return _load_shim()


class _Config:
    pthrDelay = 0  # a class attribute, as pybind11's property on nixlAgentConfig


def _bindings(config_type: type = _Config) -> types.ModuleType:
    mod = types.ModuleType("nixl_cu12._bindings")
    mod.nixlAgentConfig = config_type  # type: ignore[attr-defined]
    mod.built = []  # type: ignore[attr-defined]
    mod.nixlAgent = lambda name, config: mod.built.append((name, config.pthrDelay))  # type: ignore[attr-defined]
    return mod


def test_the_shim_and_the_plan_name_the_same_variable_and_lines(shim):
    assert shim.ENV_VAR == progress.ENV_VAR
    assert shim.MARK == progress.MARK
    assert shim.UNCHANGED == progress.UNCHANGED
    assert shim.MAX_DELAY_US == progress.MAX_DELAY_US
    # the directory on PYTHONPATH shadows nothing but sitecustomize
    assert sorted(p.name for p in progress.SHIM_DIR.iterdir() if p.suffix == ".py") == [
        "sitecustomize.py"
    ]


def test_an_agent_built_with_the_hard_coded_zero_gets_the_delay(shim, capsys):
    b = _bindings()
    assert shim.patch(b, 1000)
    b.nixlAgent("agent-a", _Config())
    assert b.built == [("agent-a", 1000)]
    assert f"{progress.MARK}: 1000 us for agent agent-a" in capsys.readouterr().err


def test_a_delay_the_caller_chose_stands(shim, capsys):
    b = _bindings()
    shim.patch(b, 1000)
    config = _Config()
    config.pthrDelay = 7
    b.nixlAgent("agent-b", config)
    assert b.built == [("agent-b", 7)]
    assert f"{progress.UNCHANGED}: agent agent-b already has pthrDelay 7" in capsys.readouterr().err


def test_patching_twice_wraps_once(shim):
    b = _bindings()
    assert shim.patch(b, 1000) and shim.patch(b, 5000)
    b.nixlAgent("agent-c", _Config())
    assert b.built == [("agent-c", 1000)]


def test_bindings_without_the_field_are_left_alone_with_one_line(shim, capsys):
    class Other:
        pass

    b = _bindings(Other)
    real = b.nixlAgent
    assert not shim.patch(b, 1000)
    assert b.nixlAgent is real
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(progress.UNCHANGED), err


def test_a_config_that_refuses_the_value_still_builds_the_agent(shim, capsys):
    class Refusing(_Config):
        def __setattr__(self, name, value):
            if name == "pthrDelay" and value:
                raise TypeError("read-only")
            super().__setattr__(name, value)

    b = _bindings(Refusing)
    shim.patch(b, 1000)
    b.nixlAgent("agent-d", Refusing())
    assert b.built == [("agent-d", 0)]
    assert "TypeError('read-only')" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "delay"),
    [(None, None), ("", None), ("0", None), (" 250 ", 250), ("1000000", 1000000)],
)
def test_delay_values(shim, value, delay):
    assert shim.parse_delay(value) == delay


@pytest.mark.parametrize("value", ["-1", "1.5", "abc", "1000001", "1e3", "0x10"])
def test_bad_delay_values_are_refused(shim, value):
    with pytest.raises(ValueError, match=progress.ENV_VAR):
        shim.parse_delay(value)


def test_install_is_idempotent_and_off_without_the_variable(shim, monkeypatch, capsys):
    before = list(sys.meta_path)
    try:
        assert shim.install({}) is None
        assert shim.install({progress.ENV_VAR: "soon"}) is None
        assert progress.UNCHANGED in capsys.readouterr().err
        assert sys.meta_path == before
        first = shim.install({progress.ENV_VAR: "1000"})
        assert first is not None and sys.meta_path[0] is first
        # a second copy of the file (another module object, another class) adds nothing
        assert _load_shim().install({progress.ENV_VAR: "1000"}) is None
        assert sum(getattr(f, "_pdlaunch_progress_delay", False) for f in sys.meta_path) == 1
        # any other import passes through
        assert first.find_spec("json", None) is None
    finally:
        sys.meta_path[:] = before


# -- as Python runs it: a fresh interpreter, the shim's directory on PYTHONPATH ---------------

STANDIN_BINDINGS = """
class nixlAgentConfig:
    pthrDelay = 0
class nixlAgent:
    def __init__(self, name, config):
        print("built", name, config.pthrDelay)
"""

PROGRAM = "import nixl_cu12._bindings as b; b.nixlAgent('agent-x', b.nixlAgentConfig())"


def _run(env_extra: dict[str, str], program: str, *paths: Path, python: str = sys.executable):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", progress.ENV_VAR)}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(progress.SHIM_DIR), *map(str, paths)])
    return subprocess.run(
        [python, "-c", program], env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _wheel(root: Path, bindings: str = STANDIN_BINDINGS) -> Path:
    pkg = root / "nixl_cu12"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_bindings.py").write_text(textwrap.dedent(bindings))
    return root


def test_python_runs_the_shim_at_start_up(tmp_path):
    res = _run({progress.ENV_VAR: "2500"}, PROGRAM, _wheel(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "built agent-x 2500" in res.stdout
    assert f"{progress.MARK}: 2500 us for agent agent-x" in res.stderr


def test_without_the_variable_nothing_changes_and_nothing_is_said(tmp_path):
    res = _run({}, PROGRAM, _wheel(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "built agent-x 0" in res.stdout
    assert "pdlaunch" not in res.stderr


def test_bindings_that_differ_change_nothing_and_say_so_once(tmp_path):
    res = _run({progress.ENV_VAR: "1000"}, PROGRAM, _wheel(tmp_path, "class nixlAgent:\n"
               "    def __init__(self, name, config):\n        print('built', name)\n"
               "class nixlAgentConfig:\n    pass\n"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "built agent-x" in res.stdout
    lines = [line for line in res.stderr.splitlines() if "pdlaunch" in line]
    assert len(lines) == 1 and lines[0].startswith(progress.UNCHANGED), res.stderr


def test_without_nixl_nothing_changes_and_one_line_says_so():
    # the interpreter this venv was made from: no nixl in its site-packages
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    res = _run({progress.ENV_VAR: "1000"}, "import importlib.util as u; "
               "print(u.find_spec('nixl_cu12'))", python=str(base))  # fmt: skip
    assert res.returncode == 0 and res.stdout.strip() == "None", res.stderr
    lines = [line for line in res.stderr.splitlines() if "pdlaunch" in line]
    assert len(lines) == 1 and "no NIXL wheel" in lines[0], res.stderr


def test_the_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.OTHER_SITE = 1\n")
    res = _run({progress.ENV_VAR: "1000"}, "import builtins; print(builtins.OTHER_SITE)",
               _wheel(tmp_path / "w"), other)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1"


# The real nixl 1.5.1 of this venv: its agent's progress thread, stock vs with the shim.
AGENT_CPU = """
import os, time
from nixl._api import nixl_agent
agent = nixl_agent("cpu-probe")
time.sleep(0.5)
def ticks():
    out = {}
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[t] = int(fields[11]) + int(fields[12])
    return out
t0 = ticks(); time.sleep(2.0); t1 = ticks()
print("busiest", max((t1[t] - t0.get(t, 0)) / os.sysconf("SC_CLK_TCK") / 2.0 for t in t1))
"""


def _busiest(res: subprocess.CompletedProcess) -> float:
    assert res.returncode == 0, res.stderr[-2000:]
    return float(res.stdout.split("busiest")[-1])


def test_real_nixl_progress_thread_sleeps_with_the_shim():
    if importlib.util.find_spec("nixl") is None:
        pytest.fail("nixl is not installed in this venv (scripts/install-node-cpu.sh)")
    stock = _busiest(_run({}, AGENT_CPU))
    shimmed = _run({progress.ENV_VAR: "1000"}, AGENT_CPU)
    assert f"{progress.MARK}: 1000 us for agent cpu-probe" in shimmed.stderr
    # stock nixl 1.5.1 spins poll(..., 0): a thread on a core whenever the host lets it
    # (0.25-1.0 of a core here, by load); with the delay: under 5 %
    assert stock > 0.15, stock
    assert _busiest(shimmed) < 0.05
