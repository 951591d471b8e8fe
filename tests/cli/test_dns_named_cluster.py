"""A cluster named by DNS, as a rack is (tests/fixtures/topologies/dns-named-cluster.yaml): it
validates with no finding, and `validate`, `plan` and `render` say which engines resolve their
NIXL side-channel address on the node (plan/node_addr.py). Run as the user runs pdlaunch."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli_runner import REPO, pdl

FIXTURE = REPO / "tests" / "fixtures" / "topologies" / "dns-named-cluster.yaml"
RESOLVED = ["gpu-a01.dc1.example.com", "gpu-a02.dc1.example.com", "gpu-a03.dc1.example.com"]


def test_validate_passes_with_no_finding_and_names_the_hosts_resolved_on_the_node():
    res = pdl("validate", FIXTURE, "--json")
    assert res.rc == 0, res
    doc = res.json()
    assert doc["valid"] is True and doc["findings"] == []
    assert doc["kv_address_on_node"] == RESOLVED  # gpu-a04 has an address: not listed
    res = pdl("validate", FIXTURE)
    assert res.rc == 0, res
    assert "valid (3 instances, 0 warning(s))" in res.stdout
    text = " ".join(res.stdout.split())
    assert "NIXL side-channel address resolved on the node at start" in text
    assert ", ".join(RESOLVED) in text and "gpu-a04" not in text


def test_plan_and_render_show_the_resolution(tmp_path: Path):
    res = pdl("plan", FIXTURE)
    assert res.rc == 0, res
    assert "kv address: gpu-a03.dc1.example.com, resolved on the node at start" in res.stdout
    assert "gpu-a04.dc1.example.com, resolved" not in res.stdout
    out = tmp_path / "out"
    res = pdl("render", FIXTURE, "-o", out)
    assert res.rc == 0, res
    text = " ".join(res.stdout.split())
    assert "NIXL side-channel address resolved on the node at start" in text
    assert ", ".join(RESOLVED) in text
    script = (out / "decode-0.sh").read_text()
    assert "pdl_name=gpu-a03.dc1.example.com" in script
    assert 'export VLLM_NIXL_SIDE_CHANNEL_HOST="${PDLAUNCH_NODE_ADDR}"' in script
    assert "export VLLM_NIXL_SIDE_CHANNEL_HOST=10.20.0.14" in (out / "decode-1.sh").read_text()
