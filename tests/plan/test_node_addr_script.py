"""A host written as a name without `hosts.<h>.address`: the plan marks its side-channel
address as resolved on the node, and the rendered script resolves it there (plan/node_addr.py).

The scripts are executed for real with a fake `vllm` that records the environment it got;
the names resolved here are `localhost` (answered by /etc/hosts, no DNS query). The cases that
need other names in /etc/hosts run in a mount namespace: tests/system/netns/
test_node_addr_on_node.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from ipaddress import ip_address
from pathlib import Path

import yaml

from pdlaunch.plan.build import build_plan
from pdlaunch.plan.node_addr import PLACEHOLDER, RESOLVE_SH
from pdlaunch.plan.render import render_plan, write_files
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load

ROOT = Path(__file__).resolve().parents[2]
DNS_FIXTURE = ROOT / "tests" / "fixtures" / "topologies" / "dns-named-cluster.yaml"
SIDE = "VLLM_NIXL_SIDE_CHANNEL_HOST"
EXPORT_RESOLVED = 'export VLLM_NIXL_SIDE_CHANNEL_HOST="${PDLAUNCH_NODE_ADDR}"'

FAKE = """#!{python}
import json, os, sys
with open(os.environ["PDLAUNCH_FAKE_OUT"], "w", encoding="utf-8") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
"""


def rendered(path: Path, out: Path) -> dict[str, str]:
    topo, source = load(path)
    findings = validate(topo, source)
    assert not has_errors(findings), [f.message for f in findings]
    written = write_files(render_plan(build_plan(topo)), out)
    return {p.name: p.read_text() for p in written}


def test_the_dns_fixture_renders_the_resolution_on_each_node(tmp_path):
    files = rendered(DNS_FIXTURE, tmp_path / "out")
    prefill = files["prefill-0-node0.sh"]
    assert "pdl_name=gpu-a01.dc1.example.com\n" in prefill
    assert RESOLVE_SH in prefill
    assert EXPORT_RESOLVED in prefill
    # Engines on other hosts dial it: a loopback answer stops the start.
    assert "but engines on other hosts dial it" in prefill
    assert "export VLLM_NIXL_SIDE_CHANNEL_HOST='" not in prefill
    assert "# kv address: gpu-a01.dc1.example.com as this node resolves it" in prefill
    assert "pdl_name=gpu-a02.dc1.example.com\n" in files["prefill-0-node1.sh"]
    assert "pdl_name=gpu-a03.dc1.example.com\n" in files["decode-0.sh"]
    # gpu-a04 has an explicit address: it wins, nothing is resolved there.
    decode1 = files["decode-1.sh"]
    assert "export VLLM_NIXL_SIDE_CHANNEL_HOST=10.20.0.14\n" in decode1
    assert "pdl_resolve" not in decode1
    assert "pdl_resolve" not in files["router.sh"]
    index = files["index.md"]
    assert "resolved on the node when its script starts" in index
    assert "prefill-0-node0 (gpu-a01.dc1.example.com)" in index
    assert "decode-1" not in index.split("resolved on the node")[1]
    plan = json.loads(files["plan.json"])
    by_name = {p["name"]: p for p in plan["processes"]}
    assert by_name["prefill-0-node0"]["env"][SIDE] == PLACEHOLDER
    assert by_name["decode-1"]["node_addr"] is None
    assert by_name["prefill-0-node0"]["node_addr"] == {
        "name": "gpu-a01.dc1.example.com",
        "peers_elsewhere": True,
    }
    for name, text in files.items():
        if name.endswith(".sh"):
            check = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
            assert check.returncode == 0, (name, check.stderr)


def _localhost_topology(tmp_path: Path, fake: Path) -> Path:
    data = {
        "deployment": "by-name",
        "model": {"name": "/models/m"},
        "defaults": {"work_dir": str(tmp_path / "work"), "vllm_bin": str(fake)},
        "prefill": [{"host": "localhost", "device": "cpu", "port": 8100}],
        "decode": [{"host": "localhost", "device": "cpu", "port": 8200}],
        "router": {"host": "localhost"},
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _addresses_of_this_machine() -> set[str]:
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True)
    # Other tests may add and remove interfaces meanwhile: read the address words only.
    return {str(ip_address(a)) for a in re.findall(r"\binet6? ([0-9a-f.:]+)/", out.stdout)}


def test_the_rendered_script_exports_an_address_of_this_machine(tmp_path):
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    files = rendered(_localhost_topology(tmp_path, fake), tmp_path / "out")
    assert EXPORT_RESOLVED in files["prefill-0.sh"]
    # One machine: loopback reaches every engine, so it is not refused.
    assert "but engines on other hosts dial it" not in files["prefill-0.sh"]
    record = tmp_path / "ran.json"
    proc = subprocess.run(
        ["bash", str(tmp_path / "out" / "prefill-0.sh")],
        env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PDLAUNCH_FAKE_OUT": str(record)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    env = json.loads(record.read_text())["env"]
    address = env[SIDE]
    mine = _addresses_of_this_machine()
    assert str(ip_address(address)) in mine, (address, sorted(mine))
    # The placeholder never reaches vLLM, and the name is not what it got.
    assert address not in (PLACEHOLDER, "localhost")
