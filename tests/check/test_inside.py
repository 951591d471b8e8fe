"""The container job of `check` (pdlaunch/check/inside.py), without a runtime: which processes
share a probe container, the `run` it starts (the flags `up` gives the engine, nothing that
`status`/`down` would take for the engine's own container), and what an unstartable one
reports. Running it for real, in podman over sshd: tests/system/containers/test_check_in_image.py.
"""

from __future__ import annotations

import shlex

import yaml

from pdlaunch.check.inside import image_groups
from pdlaunch.check.probes import CommandOutput
from pdlaunch.check.results import Status
from pdlaunch.check.runner import CheckOptions, group_hosts, host_jobs
from pdlaunch.plan.build import build_plan
from pdlaunch.plan.containers import run_argv
from pdlaunch.spec.load import load_text

TOPO = {
    "deployment": "ins",
    "model": {"name": "/models/tiny"},
    "defaults": {
        "vllm_bin": "/opt/venv/bin/vllm",
        "container": {"image": "localhost/pdl:1", "runtime": "podman",
                      "mounts": ["/models:/models:ro"], "pass_env": ["HF_HOME"]},
    },
    "prefill": [{"host": "10.0.0.1", "device": "cpu", "port": 8100}],
    "decode": [{"host": "10.0.0.1", "device": "cpu", "port": 8200},
               {"host": "10.0.0.1", "device": "cpu", "port": 8300,
                "container": {"mounts": ["/scratch:/scratch"]}}],
    "router": {"host": "10.0.0.1", "port": 8123, "container": {"enabled": False}},
}  # fmt: skip


def _plan(topo: dict = TOPO):
    t, _ = load_text(yaml.safe_dump(topo), "t.yaml")
    return build_plan(t)


def _outer(plan, fast: bool = True):
    (t,) = group_hosts(plan)
    return t, [j for j in host_jobs(plan, t, CheckOptions(fast=fast)) if j.inner]


def test_one_container_per_image_and_flags_and_the_software_probes_inside() -> None:
    plan = _plan()
    t, outer = _outer(plan)
    assert [[p.name for p in g] for g in image_groups(t)] == [["prefill-0", "decode-0"],
                                                              ["decode-1"]]  # fmt: skip
    assert len(outer) == 2
    # CPU engines: the NIXL progress shim is judged by the image's Python too
    assert {j.name for j in outer[0].inner} == {"versions", "ucx.transports", "ucx.env",
                                                 "model.path", "nixl.progress_shim"}  # fmt: skip
    on_host = {j.name for j in host_jobs(plan, t, CheckOptions(fast=True)) if not j.inner}
    # hardware and ports stay on the host; nothing of the software is probed there
    assert on_host == {"cpu.cores", "ports.listen"}
    # the interpreter is the image's venv (vllm_bin's sibling), not the host's
    assert "/opt/venv/bin/python" in outer[0].command


def test_the_probe_run_has_ups_flags_and_its_own_name() -> None:
    plan = _plan()
    _, outer = _outer(plan)
    argv = shlex.split(outer[1].command.split("; ", 1)[1])
    proc = next(p for p in plan.processes if p.name == "decode-1")
    assert proc.container is not None
    up = run_argv(proc.container, [])
    flags = up[up.index("--cidfile") + 2 :]
    flags = [x for i, x in enumerate(flags) if x != "--label" and flags[i - 1] != "--label"]
    i = argv.index("--name")
    assert argv[i + 1].startswith("pdl-ins-check-") and "--cidfile" not in argv
    assert "--label" not in argv  # `status`/`down` find engines by pdlaunch's labels
    assert argv[i + 2 : argv.index("--entrypoint")] == flags[:-1]  # all but the image
    assert argv[argv.index("--entrypoint") :][:4] == ["--entrypoint", "sh", "localhost/pdl:1",
                                                      "-c"]  # fmt: skip
    assert argv[argv.index("/scratch:/scratch") - 1 :][:2] == ["-v", "/scratch:/scratch"]
    assert argv[argv.index("HF_HOME") - 1 :][:2] == ["--env", "HF_HOME"]


def test_an_unstartable_container_fails_every_probe_with_the_runtimes_words() -> None:
    _, outer = _outer(_plan())
    job = outer[0]
    said = "Error: localhost/pdl:1: image not known"
    rows = job.evaluate(CommandOutput(125, "", said))
    assert {r.probe for r in rows} == {j.name for j in job.inner}
    assert all(r.status is Status.FAIL for r in rows)
    assert rows[0].message == f"podman could not run localhost/pdl:1 (rc=125): {said}"
    marker = job.command.split("echo ", 1)[1].split(";", 1)[0].strip("'")
    (absent,) = {r.message for r in job.evaluate(CommandOutput(127, marker + "\n", ""))}
    assert absent == "podman not found on host"


def test_engines_on_the_host_keep_their_probes_there() -> None:
    topo = {**TOPO, "defaults": {**TOPO["defaults"], "container": {"enabled": False}}}
    topo["decode"] = [TOPO["decode"][0]]
    plan = _plan(topo)
    t, outer = _outer(plan)
    assert outer == [] and image_groups(t) == []
    names = {j.name for j in host_jobs(plan, t, CheckOptions(fast=True))}
    assert {"versions", "model.path", "ucx.env"} <= names
