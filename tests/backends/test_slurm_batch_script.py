"""The sbatch script and process scripts the Slurm backend renders (pure), run through bash
for real. The real slurmctld's verdict on them (`sbatch --test-only`):
tests/system/slurm/test_sbatch_test_only.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import load
from tests.support.slurm_specs import REPO, fake_spec, planned

LOCAL = REPO / "topologies" / "local-cpu.yaml"
GB200 = REPO / "topologies" / "gb200-xpyd.yaml"
PORTS = {"prefill": 18100, "decode": 18200, "side": 15600, "router": 18123, "metrics": 19123}


def _plan(path: Path):
    return build_plan(load(path)[0])


def _sbatch_lines(script: str) -> list[list[str]]:
    """The #SBATCH options of each component, split at `#SBATCH hetjob`."""
    comps: list[list[str]] = [[]]
    for line in script.splitlines():
        if line == "#SBATCH hetjob":
            comps.append([])
        elif line.startswith("#SBATCH "):
            comps[-1].append(line.split(" ", 1)[1])
    return comps


def _sruns(script: str) -> list[str]:
    """Each srun command of the driver, continuation lines joined."""
    joined = script.replace("\\\n", " ")
    return [
        " ".join(ln.split()) for ln in joined.splitlines() if " srun" in ln or ln.startswith("srun")
    ]


def _bash_syntax_ok(tmp_path: Path, text: str) -> None:
    f = tmp_path / "check.sh"
    f.write_text(text)
    res = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# -- local-cpu: one node group, one component (a plain job) ---------------------------------------
def test_local_cpu_is_one_component_on_one_node(tmp_path: Path) -> None:
    plan = _plan(LOCAL)
    script = slurm.sbatch_script(plan, slurm.SlurmOptions())
    comps = _sbatch_lines(script)
    # Prefill and decode share 127.0.0.1: one component (het components never share a node).
    assert len(comps) == 1 and "hetjob" not in script
    opts = comps[0]
    assert "--job-name=pdlaunch-local-cpu" in opts
    assert "--nodes=1" in opts and "--ntasks-per-node=1" in opts
    assert "--cpus-per-task=2" in opts  # core 0 for prefill, core 1 for decode
    assert not any(o.startswith("--gpus") for o in opts)
    assert "--output=/tmp/pdlaunch/local-cpu/logs/slurm-%j.log" in opts
    sruns = _sruns(script)
    assert len(sruns) == 3
    assert all("--het-group" not in s for s in sruns)
    assert "pdlaunch-node /tmp/pdlaunch/local-cpu/prefill-0.sh - - 0" in sruns[0]
    assert "pdlaunch-node /tmp/pdlaunch/local-cpu/decode-0.sh - - 1" in sruns[1]
    assert sruns[2].endswith("pdlaunch-node /tmp/pdlaunch/local-cpu/router.sh - - - &")
    assert '--nodelist="${pdl_nodes_0[0]}"' in sruns[2]
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    _bash_syntax_ok(tmp_path, script)


def test_side_channel_host_and_router_urls_are_decided_at_run_time() -> None:
    plan = _plan(LOCAL)
    scripts = {f.name: f.content for f in slurm.process_scripts(plan)}
    for name in ("prefill-0.sh", "decode-0.sh"):
        text = scripts[name]
        assert "export VLLM_NIXL_SIDE_CHANNEL_HOST=''\"${PDLAUNCH_NODE_ADDR}\"''" in text
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1" not in text
        assert "export VLLM_CPU_OMP_THREADS_BIND=''\"${PDLAUNCH_CPU_BIND}\"''" in text
    router = scripts["router.sh"]
    assert "--prefill 'http://'\"${PDLAUNCH_ADDR_0_0}\"':8100'" in router
    assert "--decode 'http://'\"${PDLAUNCH_ADDR_0_0}\"':8200'" in router
    assert "http://127.0.0.1:8100" not in router.split("set -euo pipefail")[1]


def test_a_dns_named_node_takes_the_drivers_address_and_resolves_nothing_itself() -> None:
    """Over SSH a named host's script resolves its side-channel address (plan/node_addr.py);
    under Slurm the driver sets the same variable from NodeAddr, so the script does not."""
    plan = _plan(REPO / "tests" / "fixtures" / "topologies" / "dns-named-cluster.yaml")
    scripts = {f.name: f.content for f in slurm.process_scripts(plan)}
    for name in ("prefill-0-node0.sh", "decode-0.sh", "decode-1.sh"):
        text = scripts[name]
        assert "export VLLM_NIXL_SIDE_CHANNEL_HOST=''\"${PDLAUNCH_NODE_ADDR}\"''" in text
        assert "pdl_resolve" not in text and "kv address:" not in text


def test_process_scripts_are_the_rendered_ones_but_for_run_time_values() -> None:
    """Same template, same lines: only the values Slurm decides differ from `render`."""
    from pdlaunch.plan.render import render_plan

    plan = _plan(GB200)
    plain = {f.name: f.content for f in render_plan(plan)}
    for f in slurm.process_scripts(plan):
        a, b = plain[f.name].splitlines(), f.content.splitlines()
        assert len(a) == len(b), f.name
        changed = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
        assert all("PDLAUNCH_" in new and "PDLAUNCH_" not in old for old, new in changed)
        what = {new.split("=")[0].split()[-1] if "export" in new else new.split()[0]
                for _, new in changed}  # fmt: skip
        if f.name == "router.sh":
            assert what == {"--prefill", "--decode"} and len(changed) == 6
        else:
            assert what == {
                "VLLM_NIXL_SIDE_CHANNEL_HOST", "CUDA_VISIBLE_DEVICES", "--data-parallel-address"
            }, what  # fmt: skip


# -- GB200: 2 prefill + 1 decode instances, two nodes each: three het components ------------------
def test_gb200_components_gpus_and_het_groups(tmp_path: Path) -> None:
    plan = _plan(GB200)
    script = slurm.sbatch_script(plan, slurm.SlurmOptions(partition="gb200", time="02:00:00"))
    comps = _sbatch_lines(script)
    assert script.count("#SBATCH hetjob") == 2 and len(comps) == 3
    for opts in comps:
        assert "--nodes=2" in opts and "--ntasks-per-node=1" in opts
        assert "--gpus-per-node=4" in opts  # DP 8 over 2 nodes, TP 1: 4 GPUs a node
        assert "--partition=gb200" in opts and "--time=02:00:00" in opts
        assert not any(o.startswith("--cpus-per-task") for o in opts)
    sruns = _sruns(script)
    groups = [re.search(r"--het-group=(\d)", s).group(1) for s in sruns]
    assert groups == ["0", "0", "1", "1", "2", "2", "0"]  # 6 engine nodes, then the router
    for c in range(3):
        assert f'scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_{c}"' in script
    # Each node of an instance runs its own script on its own node of the component.
    assert 'pdl_nodes_0[1]}"' in sruns[1] and "prefill-0-node1.sh" in sruns[1]
    assert "decode-0-node0.sh CUDA_VISIBLE_DEVICES 0,1,2,3 -" in sruns[4]
    _bash_syntax_ok(tmp_path, script)


def test_gb200_dp_master_and_devices_come_from_slurm() -> None:
    plan = _plan(GB200)
    scripts = {f.name: f.content for f in slurm.process_scripts(plan)}
    worker = scripts["prefill-1-node1.sh"]
    assert "--data-parallel-address ''\"${PDLAUNCH_ADDR_1_0}\"''" in worker
    assert "gb200-p1-master" not in worker.split("set -euo pipefail")[1]
    assert "export CUDA_VISIBLE_DEVICES=''\"${PDLAUNCH_DEVICES}\"''" in worker
    # The secret stays a reference: the value is never in a script.
    assert ': "${HF_TOKEN:?secret HF_TOKEN is not set}"' in worker
    router = scripts["router.sh"]
    urls = re.findall(r"--(prefill|decode) (\S+)", router)
    assert [u[0] for u in urls] == ["prefill"] * 4 + ["decode"] * 2
    assert urls[0][1] == "'http://'\"${PDLAUNCH_ADDR_0_0}\"':8087'"
    assert urls[5][1] == "'http://'\"${PDLAUNCH_ADDR_2_1}\"':8087'"


def test_same_plan_same_bytes() -> None:
    opts = slurm.SlurmOptions(nodelist=("a", "b"))
    assert slurm.render_job(_plan(GB200), opts) == slurm.render_job(_plan(GB200), opts)


def test_components_merge_instances_that_share_a_host(tmp_path: Path) -> None:
    spec = fake_spec("m", tmp_path, ["n1", "n2"], _bins(tmp_path), PORTS)
    spec["prefill"].append(
        {"hosts": ["n2", "n3"], "device": "cpu", "port": 18300, "dp": {"size": 2}}
    )
    _, _, plan = planned(spec, tmp_path / "m.yaml")
    comps = slurm.components(plan)
    assert [c.hosts for c in comps] == [("n1",), ("n2", "n3")]
    assert comps[1].instances == ("prefill-1", "decode-0")
    assert comps[1].roles == ("prefill", "decode")


def _bins(tmp_path: Path) -> dict[str, Path]:
    return {"vllm": tmp_path / "bin" / "vllm", "router": tmp_path / "bin" / "router"}


# -- quoting: hostile values survive, run by bash for real ---------------------------------------
STUB = """#!/usr/bin/env python3
import json, os, sys
keys = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_CPU_OMP_THREADS_BIND", "PDL_HOSTILE")
with open(os.environ["STUB_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}, f)
"""


def test_hostile_values_survive_and_run_time_values_are_read_at_run_time(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    hostile = f"$(touch {pwned}) `touch {pwned}` ' \" \\ ${{HOME}} {{pdlaunch-ish}}"
    stub = tmp_path / "stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    spec = fake_spec(
        "hostile", tmp_path / "work", ["n1", "n2"], {"vllm": stub, "router": stub}, PORTS,
        prefill_env={"PDL_HOSTILE": hostile},
    )  # fmt: skip
    spec["model"]["name"] = f'/models/it\'s "$(touch {pwned})"'
    _, _, plan = planned(spec, tmp_path / "hostile.yaml")
    scripts = {f.name: f.content for f in slurm.process_scripts(plan)}
    out = tmp_path / "out.json"

    def run(name: str, **env: str) -> dict:
        path = tmp_path / name
        path.write_text(scripts[name])
        res = subprocess.run(
            ["bash", str(path)],
            env={"PATH": os.environ["PATH"], "STUB_OUT": str(out), **env},
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        return json.loads(out.read_text())

    got = run("prefill-0.sh", PDLAUNCH_NODE_ADDR="10.9.8.7", PDLAUNCH_CPU_BIND="0")
    assert got["env"]["PDL_HOSTILE"] == hostile
    assert got["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.9.8.7"
    assert got["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert got["argv"][1] == spec["model"]["name"]
    # Another node, another address: nothing was fixed at render time.
    got = run("prefill-0.sh", PDLAUNCH_NODE_ADDR="192.0.2.44", PDLAUNCH_CPU_BIND="auto")
    assert got["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "192.0.2.44"
    got = run("router.sh", PDLAUNCH_ADDR_0_0="10.0.0.1", PDLAUNCH_ADDR_1_0="10.0.0.2")
    args = got["argv"]
    assert args[args.index("--prefill") + 1] == f"http://10.0.0.1:{PORTS['prefill']}"
    assert args[args.index("--decode") + 1] == f"http://10.0.0.2:{PORTS['decode']}"
    assert not pwned.exists()
    # Without the driver's variables a script refuses to start instead of guessing.
    path = tmp_path / "prefill-0.sh"
    res = subprocess.run(["bash", str(path)], env={"PATH": os.environ["PATH"]}, text=True,
                         capture_output=True)  # fmt: skip
    assert res.returncode != 0 and "PDLAUNCH_NODE_ADDR" in res.stderr


def test_placeholder_text_in_the_topology_is_refused(tmp_path: Path) -> None:
    spec = fake_spec("ph", tmp_path, ["n1", "n2"], _bins(tmp_path), PORTS,
                     prefill_env={"X": "{pdlaunch:PDLAUNCH_NODE_ADDR}"})  # fmt: skip
    _, _, plan = planned(spec, tmp_path / "ph.yaml")
    with pytest.raises(slurm.SlurmError, match="reserves"):
        slurm.process_scripts(plan)


@pytest.mark.parametrize(
    "opts",
    [
        {"partition": "gpu\n#SBATCH --uid=0"},
        {"account": "a b"},
        {"nodelist": ("n1", "n'2")},
        {"extra_sbatch": ("--comment=$(reboot)",)},
        {"extra_sbatch": ("-w n1",)},
        {"nodelist": ()},
        {"gpus_per_node": 0},
    ],
)
def test_options_that_would_change_an_sbatch_line_are_refused(opts: dict) -> None:
    with pytest.raises(slurm.SlurmError):
        slurm.SlurmOptions(**opts)


def test_a_work_dir_unfit_for_an_sbatch_line_is_refused(tmp_path: Path) -> None:
    spec = fake_spec("wd", tmp_path / "a dir", ["n1", "n2"], _bins(tmp_path), PORTS)
    _, _, plan = planned(spec, tmp_path / "wd.yaml")
    with pytest.raises(slurm.SlurmError, match="work dir"):
        slurm.sbatch_script(plan, slurm.SlurmOptions())


# -- the node runner (constant bash), run for real ----------------------------------------------
def _runner(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "show.sh"
    script.write_text("#!/bin/bash\necho \"devices=${PDLAUNCH_DEVICES-unset} "
                      "bind=${PDLAUNCH_CPU_BIND-unset}\"\n")  # fmt: skip
    script.chmod(0o755)
    return subprocess.run(
        ["bash", "-c", slurm.node_runner(), "pdlaunch-node", str(script), *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
    )


def test_node_runner_maps_plan_devices_into_what_slurm_gave(tmp_path: Path) -> None:
    res = _runner(tmp_path, ["CUDA_VISIBLE_DEVICES", "1,2", "-"], CUDA_VISIBLE_DEVICES="4,5,6")
    assert res.stdout.strip() == "devices=5,6 bind=unset", res.stderr
    res = _runner(tmp_path, ["CUDA_VISIBLE_DEVICES", "0,3", "-"], CUDA_VISIBLE_DEVICES="4,5,6")
    assert res.returncode == 95 and "device 3 is not among the 3" in res.stderr
    res = _runner(tmp_path, ["CUDA_VISIBLE_DEVICES", "2,3", "-"])  # Slurm set none: as planned
    assert res.stdout.strip() == "devices=2,3 bind=unset"


def test_node_runner_keeps_the_plan_cores_only_within_the_allowed_cpus(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    inside = str(allowed[-1])
    res = _runner(tmp_path, ["-", "-", inside])
    assert res.stdout.strip() == f"devices=unset bind={inside}", res.stderr
    res = _runner(tmp_path, ["-", "-", f"{inside}|{max(allowed) + 1}"])
    assert res.stdout.strip() == "devices=unset bind=auto"
    assert "are not all among this step's CPUs" in res.stderr
