"""Topologies for the Slurm tests, loaded, judged by every rule and planned."""

from __future__ import annotations

from pathlib import Path

import yaml

from pdlaunch.plan.build import Plan, build_plan
from pdlaunch.rules import RUNTIME_ADDRESSED, has_errors, validate
from pdlaunch.spec.load import Source, load
from pdlaunch.spec.topology import Topology

REPO = Path(__file__).resolve().parents[2]


def fake_spec(
    name: str,
    work_root: Path,
    nodes: list[str],
    bins: dict[str, Path],
    ports: dict[str, int],
    *,
    prefill_env: dict | None = None,
    decode_env: dict | None = None,
) -> dict:
    """1P1D (+ router) on two Slurm nodes: prefill on ``nodes[0]``, decode on ``nodes[1]``
    (two het components), every listener on the wildcard, stand-in engines and router."""
    return {
        "deployment": name,
        "model": {"name": "fake-model"},
        "defaults": {"work_dir": str(work_root), "vllm_bin": str(bins["vllm"])},
        "prefill": [
            {
                "host": nodes[0],
                "device": "cpu",
                "port": ports["prefill"],
                "env": dict(prefill_env or {}),
            }
        ],
        "decode": [
            {
                "host": nodes[1],
                "device": "cpu",
                "port": ports["decode"],
                "devices": [1],
                "env": dict(decode_env or {}),
            }
        ],
        "kv_connector": {"side_channel_port": ports["side"]},
        "router": {
            "host": nodes[0],
            "port": ports["router"],
            "prometheus_port": ports["metrics"],
            "binary": str(bins["router"]),
        },
    }


def planned(spec: dict, path: Path) -> tuple[Topology, Source, Plan]:
    """Write, load and plan ``spec``; the pdlaunch rules must find no error in it (as the
    Slurm backend runs them: each node's side-channel address is its own at run time)."""
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    topo, source = load(path)
    findings = validate(topo, source, RUNTIME_ADDRESSED)
    assert not has_errors(findings), [f"{f.rule}: {f.message}" for f in findings]
    return topo, source, build_plan(topo)
