"""Reading `pdlaunch export k8s` output in tests: the shipped topologies and variants of them,
objects by kind and role, pod templates and the command a pod ends up running (through the
LWS variables and kubelet expansion of tests/backends/kube.py), and a stand-in `vllm` that
reports the argv and LD_LIBRARY_PATH a container's shell would exec."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdlaunch.backends.k8s import manifests as k8s
from pdlaunch.plan.build import Plan, build_plan
from pdlaunch.spec.load import load_text
from tests.backends import kube

ROOT = Path(__file__).resolve().parents[2]  # the repository
SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))
TARGETS = k8s.TARGETS
HPU_IMAGE = "registry.example/vllm-gaudi:1.23.0"  # Gaudi has no default image (by design)
SENTINEL = "hf_SENTINEL_do_not_leak_7f3a"


def topology_data(name: str) -> dict:
    return yaml.safe_load((ROOT / "topologies" / name).read_text())


def topology(data: dict):
    return load_text(yaml.safe_dump(data, sort_keys=False), "variant.yaml")


def plan_of(data: dict) -> tuple[Plan, object]:
    topo, _ = topology(data)
    return build_plan(topo), topo


def with_vllm_router(data: dict) -> dict:
    # The shipped hetero topologies run a toy proxy, which has no service discovery.
    data["router"]["kind"] = "vllm-router"
    data["router"].pop("binary", None)
    return data


def non_hybrid(data: dict) -> dict:
    for inst in data["prefill"] + data["decode"]:
        inst["dp"]["hybrid_lb"] = False
    return data


def objects_by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out


def role_specs(objects: list[dict]) -> dict[str, dict]:
    """role -> LeaderWorkerSet spec, for either target."""
    kinds = objects_by_kind(objects)
    if "DisaggregatedSet" in kinds:
        (ds,) = kinds["DisaggregatedSet"]
        return {r["name"]: r["spec"] for r in ds["spec"]["roles"]}
    return {o["metadata"]["name"].rsplit("-", 1)[1]: o["spec"] for o in kinds["LeaderWorkerSet"]}


def templates(spec: dict) -> tuple[dict, dict | None]:
    """(leader pod template, worker pod template or None)."""
    lwt = spec["leaderWorkerTemplate"]
    if "leaderTemplate" in lwt:
        return lwt["leaderTemplate"], lwt["workerTemplate"]
    return lwt["workerTemplate"], None


def router_container(objects: list[dict]) -> dict:
    (dep,) = objects_by_kind(objects)["Deployment"]
    return dep["spec"]["template"]["spec"]["containers"][0]


def pod_command(template: dict, *, lws: str, group: int, worker: int, size: int) -> list[str]:
    pod = kube.lws_pod(template, lws=lws, group=group, worker=worker, size=size, ns="ns")
    c = pod["spec"]["containers"][0]
    return kube.command_line(c, kube.resolved_env(c, "10.1.2.3", "ns"))


def run_shell(line: list[str], env: dict[str, str], bin_dir: Path) -> dict:
    """Run a container's `/bin/sh -c SCRIPT` with a stand-in `vllm` that reports its argv and
    LD_LIBRARY_PATH: what the script would exec."""
    assert line[:2] == ["/bin/sh", "-c"], line
    proc = subprocess.run(
        line, env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def stand_in_vllm(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'ld': os.environ.get('LD_LIBRARY_PATH')}))\n"
    )
    script.chmod(0o755)
    return bin_dir
