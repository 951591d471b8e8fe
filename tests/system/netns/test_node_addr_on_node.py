"""The rendered script of a node named by DNS resolves its side-channel address on the node
(plan/node_addr.py), run for real: each case runs the script in a mount namespace whose
/etc/hosts says what the name means there and whose nsswitch.conf reads files only, so no DNS
query leaves the machine. A fake `vllm` records the environment the script handed it.

Needs root and util-linux `unshare` (scripts/install.sh installs it); it fails, not skips,
without them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdlaunch.plan.build import build_plan
from pdlaunch.plan.node_addr import EXIT_NO_ADDRESS
from pdlaunch.plan.render import render_plan, write_files
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load

FAKE = """#!{python}
import json, os, sys
with open(os.environ["PDLAUNCH_FAKE_OUT"], "w", encoding="utf-8") as f:
    json.dump({{"env": dict(os.environ)}}, f)
"""
PEER = "gpu-b01.dc1.example.com"  # decode, on another machine: loopback is refused


def _global_address(family: str) -> str:
    out = subprocess.run(
        ["ip", "-o", f"-{family}", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.search(r"\binet6? ([0-9a-f.:]+)/", out)
    assert found, f"this machine has no global IPv{family} address to resolve a name to"
    return found.group(1)


@pytest.fixture(scope="module")
def can_unshare() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and util-linux unshare (scripts/install.sh)", pytrace=False)


def _script(tmp_path: Path, host: str) -> Path:
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    data = {
        "deployment": "on-node",
        "model": {"name": "/models/m"},
        "defaults": {"work_dir": str(tmp_path / "work"), "vllm_bin": str(fake)},
        "prefill": [{"host": host, "device": "cuda"}],
        "decode": [{"host": PEER, "device": "cuda"}],
        "router": {"host": PEER},
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    topo, source = load(path)
    findings = validate(topo, source)
    assert not has_errors(findings), [f.message for f in findings]
    write_files(render_plan(build_plan(topo)), tmp_path / "out")
    return tmp_path / "out" / "prefill-0.sh"


def _run_on_node(tmp_path: Path, script: Path, hosts: str) -> tuple[int, str, dict]:
    etc_hosts, nss = tmp_path / "hosts", tmp_path / "nsswitch.conf"
    etc_hosts.write_text(f"127.0.0.1 localhost\n{hosts}")
    nss.write_text("hosts: files\n")
    record = tmp_path / "ran.json"
    record.unlink(missing_ok=True)
    inner = (
        f"mount --bind {shlex.quote(str(etc_hosts))} /etc/hosts && "
        f"mount --bind {shlex.quote(str(nss))} /etc/nsswitch.conf && "
        f"exec bash {shlex.quote(str(script))}"
    )
    proc = subprocess.run(
        ["unshare", "--mount", "bash", "-c", inner],
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "PDLAUNCH_FAKE_OUT": str(record),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    env = json.loads(record.read_text())["env"] if record.exists() else {}
    return proc.returncode, proc.stderr, env


@pytest.mark.parametrize("family", ["4", "6"])
def test_the_name_becomes_this_nodes_own_address(tmp_path, can_unshare, family):
    mine = _global_address(family)
    name = "gpu-a01.dc1.example.com"
    rc, err, env = _run_on_node(tmp_path, _script(tmp_path, name), f"{mine} {name}\n")
    assert rc == 0, err
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == mine


def test_a_non_loopback_address_is_preferred_to_debians_own_hostname_line(tmp_path, can_unshare):
    mine = _global_address("4")
    name = "gpu-a01"
    hosts = f"127.0.1.1 {name}\n{mine} {name}\n"
    rc, err, env = _run_on_node(tmp_path, _script(tmp_path, name), hosts)
    assert rc == 0, err
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == mine


@pytest.mark.parametrize(
    ("hosts", "says"),
    [
        ("127.0.1.1 gpu-a01\n", "resolves to the loopback address 127.0.1.1 on "),
        ("", "does not resolve on "),
        ("198.51.100.7 gpu-a01\n", "resolves to 198.51.100.7 on "),
    ],
    ids=["loopback-with-peers-elsewhere", "unresolved", "not-an-address-of-this-node"],
)
def test_the_start_stops_with_one_line_that_says_why(tmp_path, can_unshare, hosts, says):
    rc, err, env = _run_on_node(tmp_path, _script(tmp_path, "gpu-a01"), hosts)
    assert rc == EXIT_NO_ADDRESS and not env  # vLLM never started
    (line,) = err.strip().splitlines()
    assert line.startswith("pdlaunch: prefill-0: gpu-a01 ") and says in line
    assert "set hosts.gpu-a01.address" in line


def test_a_name_that_looks_like_an_option_stays_a_name(tmp_path, can_unshare):
    # The topology accepts `-n` as a host name; getent gets it after `--`.
    rc, err, _ = _run_on_node(tmp_path, _script(tmp_path, "-n"), "")
    assert rc == EXIT_NO_ADDRESS
    assert "pdlaunch: prefill-0: -n does not resolve" in err
