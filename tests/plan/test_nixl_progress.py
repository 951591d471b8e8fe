"""kv_connector.progress_delay_us: what the plan renders for NIXL's progress thread.

CPU instances get the delay by default (the variable and the shim first on PYTHONPATH, in the
plan and in the rendered script); accelerator instances only when asked; 0 turns it off; a
Mooncake deployment has no NIXL thread and gets nothing; bad values are one-line schema errors.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from pdlaunch.kv import progress
from pdlaunch.plan.build import build_plan
from pdlaunch.plan.nixl_progress import explain
from pdlaunch.plan.render import render_plan, write_files
from pdlaunch.rules import validate
from pdlaunch.spec.load import load_text

SHIM = str(progress.SHIM_DIR)


def _inst(device: str, port: int) -> dict:
    inst = {"host": "127.0.0.1", "device": device, "port": port}
    if device == "cpu":
        inst["block_size"] = 32
    return inst


def topo_text(prefill: str = "cpu", decode: str = "cpu", **kv) -> str:
    data: dict = {
        "deployment": "t",
        "model": {"name": "/m"},
        "hosts": {"127.0.0.1": {"cpus": 8}},
        "prefill": [_inst(prefill, 8100)],
        "decode": [_inst(decode, 8200)],
        "kv_connector": kv,
    }
    return yaml.safe_dump(data, sort_keys=False)


def engines(text: str) -> dict:
    topo, _ = load_text(text, "t.yaml")
    return {p.name: p for p in build_plan(topo).processes if p.role != "router"}


def delay_of(p) -> tuple[str | None, list[str]]:
    return p.env.get(progress.ENV_VAR), p.path_prepend.get("PYTHONPATH", [])


def test_cpu_instances_get_the_delay_by_default():
    for p in engines(topo_text()).values():
        assert delay_of(p) == ("1000", [SHIM])


def test_accelerator_instances_keep_nixls_busy_poll_unless_asked():
    procs = engines(topo_text("cuda", "cuda"))
    assert {n: delay_of(p) for n, p in procs.items()} == {
        "prefill-0": (None, []),
        "decode-0": (None, []),
    }
    # a mixed pair under "auto": only the CPU side
    mixed = engines(topo_text("cuda", "cpu"))
    assert delay_of(mixed["prefill-0"]) == (None, [])
    assert delay_of(mixed["decode-0"]) == ("1000", [SHIM])


def test_an_explicit_value_applies_to_every_nixl_instance():
    for p in engines(topo_text("cuda", "cpu", progress_delay_us=250)).values():
        assert delay_of(p) == ("250", [SHIM])


def test_zero_turns_it_off_on_cpu():
    for p in engines(topo_text(progress_delay_us=0)).values():
        assert delay_of(p) == (None, [])


def test_mooncake_has_no_nixl_thread_and_gets_nothing():
    text = topo_text("npu", "npu", kind="mooncake", progress_delay_us=1000)
    for p in engines(text).values():
        assert delay_of(p) == (None, [])
        assert "PYTHONPATH" not in p.env


def test_the_rendered_script_exports_both(tmp_path):
    topo, _ = load_text(topo_text(), "t.yaml")
    write_files(render_plan(build_plan(topo)), tmp_path)
    script = (tmp_path / "prefill-0.sh").read_text()
    assert f"export {progress.ENV_VAR}=1000\n" in script
    assert f'export PYTHONPATH={SHIM}"${{PYTHONPATH:+:$PYTHONPATH}}"\n' in script
    # before the engine starts
    assert script.index(progress.ENV_VAR) < script.index("exec vllm serve")


def test_the_users_pythonpath_comes_after_the_shim(tmp_path):
    data = yaml.safe_load(topo_text())
    data["defaults"] = {"env": {"PYTHONPATH": "/opt/mine"}}
    topo, _ = load_text(yaml.safe_dump(data), "t.yaml")
    write_files(render_plan(build_plan(topo)), tmp_path)
    out = subprocess.run(
        ["bash", "-c", f"sed -n '/^export/p' {tmp_path / 'decode-0.sh'} > env.sh; "
         ". ./env.sh; echo \"$PYTHONPATH\""],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == f"{SHIM}:/opt/mine"


def test_the_variable_is_the_topologys_not_the_envs():
    data = yaml.safe_load(topo_text())
    data["prefill"][0]["env"] = {progress.ENV_VAR: "5"}
    topo, src = load_text(yaml.safe_dump(data), "t.yaml")
    found = [f for f in validate(topo, src) if f.severity == "error"]
    assert any(
        progress.ENV_VAR in f.message and "kv_connector.progress_delay_us" in (f.message + f.fix)
        for f in found
    ), found


def test_the_cpu_budget_does_not_count_a_sleeping_progress_thread():
    def busy(text: str) -> str:
        topo, src = load_text(text, "t.yaml")
        return " ".join(f.message for f in validate(topo, src) if "threads busy" in f.message)

    def on_two_cores(**kv) -> str:
        data = yaml.safe_load(topo_text(**kv))
        data["hosts"]["127.0.0.1"]["cpus"] = 2
        data["decode"].append({**_inst("cpu", 8201)})
        return yaml.safe_dump(data)

    # 3 engines x (1 OMP thread + the worker's loop) = 6; spinning: + 1 each = 9
    assert "keep 6 threads busy" in busy(on_two_cores())
    assert "keep 9 threads busy" in busy(on_two_cores(progress_delay_us=0))


def test_validate_and_plan_say_who_gets_it_and_why():
    topo, _ = load_text(topo_text("cuda", "cpu"), "t.yaml")
    lines = explain(topo)
    assert len(lines) == 2
    assert lines[0].startswith("NIXL progress thread prefill-0: NIXL's own busy poll")
    assert lines[1].startswith("NIXL progress thread decode-0: waits up to 1000 us")
    assert "nixl_cu12/_api.py:226" in lines[1]


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pdlaunch", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_validate_json_and_plan_show_it(tmp_path):
    (tmp_path / "t.yaml").write_text(topo_text())
    res = _cli("validate", "t.yaml", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    said = json.loads(res.stdout)["nixl_progress"]
    assert len(said) == 1 and "prefill-0, decode-0: waits up to 1000 us" in said[0]
    res = _cli("plan", "t.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("progress thread poll delay 1000 us (shim)") == 2


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("-1", "greater than or equal to 0"),
        ("1000001", "less than or equal to 1000000"),
        ("ten", "valid integer"),
        ("1.5", "valid integer"),
        ("true", "valid integer"),
        ("[1000]", "valid integer"),
    ],
)
def test_hostile_values_are_one_line_schema_errors(tmp_path, value, says):
    text = topo_text().replace("kv_connector: {}", f"kv_connector: {{progress_delay_us: {value}}}")
    assert "progress_delay_us" in text
    (tmp_path / "t.yaml").write_text(text)
    res = _cli("validate", "t.yaml", cwd=tmp_path)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr + res.stdout
    err = [line for line in (res.stderr + res.stdout).splitlines() if line.strip()]
    assert len(err) == 1 and "kv_connector.progress_delay_us" in err[0] and says in err[0], err


def test_a_container_gets_the_shim_mounted_and_prepended_inside():
    data = yaml.safe_load(topo_text())
    data["defaults"] = {"container": {"image": "vllm-cpu:0.32", "runtime": "podman"}}
    topo, _ = load_text(yaml.safe_dump(data), "t.yaml")
    for p in engines(yaml.safe_dump(data)).values():
        assert p.container is not None
        assert f"{SHIM}:{SHIM}:ro" in p.container.mounts
    files = {f.name: f.content for f in render_plan(build_plan(topo))}
    script = files["prefill-0.sh"]
    # prepended inside the container, to the image's own PYTHONPATH
    assert f"export PDLAUNCH_PREPEND_PYTHONPATH={SHIM}\n" in script
    assert f"-v {SHIM}:{SHIM}:ro" in script
    assert f"--env {progress.ENV_VAR}" in script
