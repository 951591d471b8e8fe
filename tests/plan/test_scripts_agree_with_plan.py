"""Every rendered process script agrees with its own header and with the plan it came from:
the ports it says it listens on, the variables it exports, the argv it execs, and the NIXL
side channel it advertises. Checked on the shipped topologies and a generated set (several
device kinds, many instances on one host, multi-node data parallel)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from pdlaunch.plan.build import build_plan
from pdlaunch.plan.containers import prepend_var
from pdlaunch.plan.render import container_argv, render_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.addresses import host_key, is_ip_literal
from pdlaunch.spec.load import load, load_text
from tests.support.fake_bins import container_runtime_standin

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))

LISTENS = re.compile(r"^# listens:\s+(\d+) \((.*)\)$")
HEADER = re.compile(r"^# (\w+):\s+(.*)$")
SIDE = re.compile(r"^NIXL side channel \(DP rank (\d+)\)$")
MOONCAKE = re.compile(r"^Mooncake KV \(DP (\d+), TP (\d+)\)$")


# ---------------------------------------------------------------------------------------------
# A generated set: valid topologies with many processes per host.


def _instance(kind: str, port: int, **kw) -> dict:
    return {"device": kind, "port": port, **kw}


def generated(
    kinds: tuple[str, str],
    counts: tuple[int, int],
    hosts: list[str],
    *,
    dp: int = 1,
    tp: int = 1,
    extras: dict | None = None,
) -> dict:
    """Instances placed round-robin on `hosts` (or across all of them when dp > 1), each with
    its own devices and ports, so the result is valid."""
    next_dev = dict.fromkeys(hosts, 0)
    port, rpc = 8100, 13345
    data: dict = {"deployment": "gen", "model": {"name": "m"}, "prefill": [], "decode": []}
    loopback = hosts == ["127.0.0.1"]
    for role, kind, n in (("prefill", kinds[0], counts[0]), ("decode", kinds[1], counts[1])):
        for i in range(n):
            inst = _instance(kind, port, tp=tp)
            port += 1
            if loopback:
                inst["bind"] = "127.0.0.1"
            if dp > 1:
                on = hosts
                inst["hosts"] = list(hosts)
                inst["dp"] = {"size": dp * len(hosts), "local_size": dp, "rpc_port": rpc}
                inst["dp"]["hybrid_lb"] = i % 2 == 1
                rpc += 1
            else:
                on = [hosts[(i + (role == "decode")) % len(hosts)]]
                inst["host"] = on[0]
            if kind != "cpu":
                start = max(next_dev[h] for h in on)
                need = tp * dp
                inst["devices"] = list(range(start, start + need))
                for h in on:
                    next_dev[h] = start + need
            data[role].append(inst)
    if "npu" in kinds:
        data["kv_connector"] = {"kind": "mooncake"}
        data["router"] = {"kind": "toy-proxy", "binary": "/opt/proxy.py", "host": hosts[0]}
    else:
        data["router"] = {"host": hosts[0], "port": 9123}
    for key, value in (extras or {}).items():
        data[key] = value
    return data


GENERATED = {
    "cuda-2p2d-one-host": generated(("cuda", "cuda"), (2, 2), ["10.0.0.1"], tp=2),
    "cuda-hpu-3p1d-two-hosts": generated(("cuda", "hpu"), (3, 1), ["10.0.0.1", "10.0.0.2"]),
    "hpu-cuda-reblock-one-host": generated(("hpu", "cuda"), (2, 2), ["10.0.0.1"]),
    "cuda-dp-multinode-shared-hosts": generated(
        ("cuda", "cuda"), (2, 2), ["10.0.0.1", "10.0.0.2"], dp=2
    ),
    "hpu-dp-multinode-three-hosts": generated(
        ("hpu", "hpu"), (1, 1), ["10.0.0.1", "10.0.0.2", "10.0.0.3"], dp=2, tp=2
    ),
    "npu-mooncake-3p2d-one-host": generated(("npu", "npu"), (3, 2), ["10.0.0.1"], tp=2),
    "npu-mooncake-dp": generated(("npu", "npu"), (1, 1), ["10.0.0.1", "10.0.0.2"], dp=2),
    "cpu-3p2d-loopback": generated(
        ("cpu", "cpu"),
        (3, 2),
        ["127.0.0.1"],
        extras={
            "defaults": {
                "env": {
                    "HF_TOKEN": "${env:HF_TOKEN}",
                    "HF_HOME": "/data",
                    "UCX_MEMTYPE_CACHE": "1",
                },
                "ld_library_path": ["/opt/ucx/lib", "/opt/nixl lib/x"],
                "extra_args": ["--seed=1", "--api-key", 'it\'s a "key" $HOME'],
            },
            "hosts": {"127.0.0.1": {"env": {"VLLM_CPU_KVCACHE_SPACE": "4", "A_B": "x y"}}},
        },
    ),
    # Values a shell would mangle if quoting slipped anywhere between plan and script.
    "cuda-tricky-values": generated(
        ("cuda", "cuda"),
        (1, 1),
        ["10.0.0.1", "10.0.0.2"],
        extras={
            "model": {"name": '/models/it\'s a "model" $HOME', "served_name": "m -x"},
            "defaults": {
                "env": {
                    "MULTI": "line one\nexec line two\n",
                    "QUOTES": "'\"`$(id)` ${HOME} \\ ;|&<> #",
                    "EMPTY": "",
                    "DASH": "--port=1",
                    "UNICODE": "caf\u00e9 \u2603",
                    "API": "${env:API_SECRET}",
                },
                "ld_library_path": ["/opt/it's here", "/opt/$x"],
                "extra_args": ["--api-key", "a b\nc'd", "--seed", "7"],
            },
        },
    ),
}


def _load_generated(name: str):
    text = yaml.safe_dump(GENERATED[name], sort_keys=False)
    return load_text(text, f"{name}.yaml")


CASES = [pytest.param(lambda p=p: load(p), id=p.name) for p in SHIPPED] + [
    pytest.param(lambda n=n: _load_generated(n), id=n) for n in GENERATED
]


def test_every_shipped_topology_is_covered():
    assert len(SHIPPED) >= 5


# ---------------------------------------------------------------------------------------------
# Reading a rendered script back.


def parse_script(text: str) -> dict:
    """Header (line by line: `comment` keeps it one line per field), then the body read as
    shell words, so a quoted value may span lines."""
    lines = text.split("\n")
    head_end = lines.index("set -euo pipefail")
    header: dict[str, str] = {}
    listens: list[tuple[int, str]] = []
    for line in lines[1:head_end]:
        if m := LISTENS.match(line):
            listens.append((int(m.group(1)), m.group(2)))
        elif m := HEADER.match(line):
            assert m.group(1) not in header, f"header {m.group(1)} twice"
            header[m.group(1)] = m.group(2)
    # `command` joins argv groups with " \\\n    ": bash's line continuation.
    body = "\n".join(lines[head_end + 1 :]).replace(" \\\n    ", " ")
    words = shlex.split(body, comments=True)
    at = words.index("exec")
    exports: list[tuple[str, str | None]] = []
    for i, word in enumerate(words[:at]):
        if word == "export":
            name, eq, value = words[i + 1].partition("=")
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), words[i + 1]
            exports.append((name, value if eq else None))
    return {"header": header, "listens": listens, "exports": exports, "argv": words[at + 1 :]}


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


# ---------------------------------------------------------------------------------------------
# The agreement checks.


@pytest.mark.parametrize("loader", CASES)
def test_rendered_scripts_agree_with_header_and_plan(loader):
    topo, source = loader()
    assert not has_errors(validate(topo, source))
    plan = build_plan(topo)
    files = {f.name: f for f in render_plan(plan)}
    # plan.json, as rendered, is the plan.
    plan_data = json.loads(files["plan.json"].content)
    assert plan_data == plan.model_dump(mode="json")
    procs = plan_data["processes"]
    assert {f"{p['name']}.sh" for p in procs} == set(files) - {"index.md", "plan.json"}

    for p in procs:
        s = parse_script(files[f"{p['name']}.sh"].content)
        head, argv = s["header"], s["argv"]
        assert head["host"] == p["host"]
        assert head["process"].split(" ", 1)[0] == p["name"]
        if p["health_url"]:
            assert head["health"] == p["health_url"]
        else:
            assert "health" not in head

        # Ports: the header lists exactly the plan's ports, in order.
        assert s["listens"] == [(x["port"], x["purpose"]) for x in p["ports"]]
        by_purpose: dict[str, int] = {}
        for port, purpose in s["listens"]:
            assert purpose not in by_purpose, f"{p['name']}: {purpose} twice"
            by_purpose[purpose] = port

        # Env: every variable exported once, plain values as the plan says, path-like ones
        # prepended, secrets exported by name only.
        names = [k for k, _ in s["exports"]]
        assert len(names) == len(set(names)), f"{p['name']}: exported twice: {names}"
        proc = plan.processes[procs.index(p)]
        # In a container the path-like variables travel as PDLAUNCH_PREPEND_<NAME>, prepended
        # inside to the image's own value (containers.in_container_argv).
        prepended = {
            (prepend_var(k) if proc.container else k): (k, parts)
            for k, parts in p["path_prepend"].items()
        }
        plain = {k: v for k, v in s["exports"] if v is not None and k not in prepended}
        assert plain == p["env"]
        # ... in the plan's order (plan.json sorts keys; the Process keeps the order).
        ordered = list(proc.env)
        assert [k for k, _ in s["exports"] if k in p["env"]] == ordered
        for exported, (key, parts) in prepended.items():
            tail = "" if proc.container else f"${{{key}:+:${key}}}"
            assert dict(s["exports"])[exported] == ":".join(parts) + tail
        assert {k for k, v in s["exports"] if v is None} == set(p["secret_env"])
        assert not set(p["secret_env"]) & set(p["env"])

        # Argv: the exec line is the plan's argv, word for word (in a container: the
        # runtime's `run` with the argv's first word as --entrypoint, the rest its last words).
        if proc.container is not None:
            assert argv == container_argv(proc)
            cmd = [argv[argv.index("--entrypoint") + 1],
                   *argv[argv.index(proc.container.image) + 1 :]]  # fmt: skip
            assert cmd[len(cmd) - len(p["argv"]) :] == p["argv"]
            argv = p["argv"]
        assert argv == p["argv"]

        if p["role"] == "router":
            assert int(flag_value(argv, "--port")) == by_purpose["router HTTP"]
            if "router metrics" in by_purpose:
                assert int(flag_value(argv, "--prometheus-port")) == by_purpose["router metrics"]
            continue

        # HTTP API: the port vLLM is told is the one the header lists (and health dials).
        if "--headless" in argv:
            assert "HTTP API" not in by_purpose and p["health_url"] is None
        else:
            assert int(flag_value(argv, "--port")) == by_purpose["HTTP API"]
            assert p["health_url"].endswith(f":{by_purpose['HTTP API']}/health")
        if "data-parallel RPC" in by_purpose:
            assert (
                int(flag_value(argv, "--data-parallel-rpc-port")) == by_purpose["data-parallel RPC"]
            )

        kv = json.loads(flag_value(argv, "--kv-transfer-config"))
        side = {int(m.group(1)): port for pur, port in by_purpose.items() if (m := SIDE.match(pur))}
        if plan.kv_connector == "nixl":
            # vLLM listens on VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank (base_scheduler.py:76).
            base = int(p["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"])
            # the host, or its hosts.<h>.address where the host is a name (side-channel-host)
            assert p["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == p["kv_host"]
            assert p["kv_host"] == head["host"] or (
                is_ip_literal(p["kv_host"]) and not is_ip_literal(head["host"])
            )
            start = int(flag_value(argv, "--data-parallel-start-rank") or 0)
            local = int(flag_value(argv, "--data-parallel-size-local") or 1)
            assert sorted(side) == list(range(start, start + local))
            assert side == {rank: base + rank for rank in side}
        else:
            assert not side and "VLLM_NIXL_SIDE_CHANNEL_PORT" not in p["env"]
            moon = {
                (int(m.group(1)), int(m.group(2))): port
                for pur, port in by_purpose.items()
                if (m := MOONCAKE.match(pur))
            }
            tp = int(flag_value(argv, "--tensor-parallel-size"))
            if p["role"] == "prefill":
                assert moon and all(
                    port == int(kv["kv_port"]) + d * tp + t for (d, t), port in moon.items()
                )
            else:
                assert not moon

    # One host, one owner per port.
    owners: dict[tuple[str, int], str] = {}
    for p in procs:
        for x in p["ports"]:
            key = (host_key(p["host"]), x["port"])
            assert key not in owners, f"{key} is both {owners[key]} and {p['name']}"
            owners[key] = p["name"]


def test_generated_set_really_shares_hosts():
    # The generated set is only worth its name if processes share hosts and DP spans nodes.
    for name in ("cuda-2p2d-one-host", "npu-mooncake-3p2d-one-host", "cpu-3p2d-loopback"):
        topo, _ = _load_generated(name)
        hosts = [p.host for p in build_plan(topo).processes]
        assert len(hosts) >= 4 and len(set(hosts)) == 1, name
    topo, _ = _load_generated("cuda-dp-multinode-shared-hosts")
    plan = build_plan(topo)
    assert any("--headless" in p.argv for p in plan.processes)
    assert any("--data-parallel-hybrid-lb" in p.argv for p in plan.processes)


def test_parse_script_catches_a_disagreeing_script():
    # Negative control: a script edited behind the plan's back is seen as different.
    topo, _ = load(ROOT / "topologies" / "local-cpu.yaml")
    plan = build_plan(topo)
    proc = plan.processes[0]
    text = next(f.content for f in render_plan(plan) if f.name == f"{proc.name}.sh")
    port = proc.ports[-1].port
    tampered = text.replace(f"# listens:    {port} ", f"# listens:    {port + 1} ")
    tampered = tampered.replace("export UCX_TLS=", "export UCX_TLS=x\nexport UCX_TLS=")
    s = parse_script(tampered)
    assert s["listens"] != [(x.port, x.purpose) for x in proc.ports]
    assert [k for k, _ in s["exports"]].count("UCX_TLS") == 2
    assert parse_script(text)["argv"] == proc.argv


# ---------------------------------------------------------------------------------------------
# And what bash itself makes of each script: run it with stand-ins for the programs it execs.

FAKE = """#!/bin/bash
printf '%s\\0' "$0" "$@" > "$FAKE_OUT.argv"
env -0 > "$FAKE_OUT.env"
"""
# `docker`/`podman` for processes in a container: the image's own PATH and FAKE_OUT.
IMAGE_ENV = '{"PATH": os.environ["PATH"], "FAKE_OUT": os.environ["FAKE_OUT"]}'
SECRET_VALUE = 's3cr\'et "v"\nline'
BASH_OWN = {"PATH", "FAKE_OUT", "PWD", "SHLVL", "_", "OLDPWD"}


@pytest.mark.parametrize("loader", CASES)
def test_bash_execs_exactly_the_plan(loader, tmp_path):
    topo, _ = loader()
    plan = build_plan(topo)
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    for name in {Path(p.argv[0]).name for p in plan.processes}:
        (fakebin / name).write_text(FAKE)
        (fakebin / name).chmod(0o755)
    for name in {p.container.runtime for p in plan.processes if p.container}:
        (fakebin / name).write_text(container_runtime_standin(IMAGE_ENV))
        (fakebin / name).chmod(0o755)
    scripts = {f.name: f.content for f in render_plan(plan)}
    ran = 0
    for p in plan.processes:
        if p.argv[0].startswith("/"):
            continue  # an absolute program path: the stand-in cannot take its place
        ran += 1
        script = tmp_path / f"{p.name}.sh"
        script.write_text(scripts[f"{p.name}.sh"])
        out = tmp_path / p.name
        env = {"PATH": f"{fakebin}:/usr/bin:/bin", "FAKE_OUT": str(out)}
        # `up` writes each target variable into the secrets file; by hand, the shell has it.
        env.update(dict.fromkeys(p.secret_env, SECRET_VALUE))
        r = subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=30)
        assert r.returncode == 0, (p.name, r.stderr)
        argv = out.with_suffix(".argv").read_bytes().decode().split("\0")[:-1]
        assert Path(argv[0]).name == Path(p.argv[0]).name
        assert argv[1:] == p.argv[1:], p.name
        got = dict(
            item.split("=", 1)
            for item in out.with_suffix(".env").read_bytes().decode().split("\0")[:-1]
        )
        want = dict(p.env)
        want.update({k: ":".join(parts) for k, parts in p.path_prepend.items()})
        if p.container is not None:
            want.update(p.container.env)  # what the device kind needs inside
        want.update(dict.fromkeys(p.secret_env, SECRET_VALUE))
        assert {k: got.get(k) for k in want} == want, p.name
        assert set(got) - set(want) <= BASH_OWN, (p.name, set(got) - set(want) - BASH_OWN)
    assert ran > 0
