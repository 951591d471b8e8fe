"""Let the real runtime judge what pdlaunch renders, without hardware.

* `vllm serve` argv: vLLM 0.32's own parser (the one `vllm` builds: FlexibleArgumentParser +
  the serve subparser), then `AsyncEngineArgs.from_cli_args`, then the KV connector class
  through vLLM's `KVConnectorFactory` (ours and stock; a plugin connector not installable here
  is checked against the fact recorded in pdlaunch.spec.facts.PLUGIN_CONNECTORS).
* A flag that a later flag overrides is caught by wrapping every argparse action of the real
  parser: an action that stores twice has lost its first value.
* Env: every `VLLM_*` variable must be one vLLM 0.32 reads (`vllm.envs.environment_variables`
  plus direct reads in the package, from the generated facts) or the device plugin's.
* vllm-router argv: vllm-router 0.1.17's own parser (launch_router.parse_router_args).
* Toy proxies: the flags and health route recorded from their source.

Each judge returns a list of problems (empty: accepted), so negative controls can show that a
planted mistake is caught.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from typing import Any

from pdlaunch.spec import facts, plugins
from pdlaunch.spec.devices import profile
from scripts.gen_vllm_facts import router_parser, vllm_parsers

# vLLM's toy proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, vllm-gaudi
# examples/nixl/toy_proxy_server.py:86-118) and vllm-ascend's load-balance proxy
# (examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py:670-711): the flags
# pdlaunch renders, and their health route (/healthcheck, :276 and :1264).
PROXY_FLAGS = {
    "--host",
    "--port",
    "--prefiller-hosts",
    "--prefiller-ports",
    "--decoder-hosts",
    "--decoder-ports",
}
PROXY_HEALTH = "/healthcheck"


def _recording(parser: argparse.ArgumentParser, stored: list[str]) -> None:
    for action in parser._actions:
        if isinstance(action, (argparse._AppendAction, argparse._CountAction)):
            continue
        cls = type(action)

        def call(self, parser, namespace, values, option_string=None, _cls=cls):
            stored.append(self.dest)
            return _cls.__call__(self, parser, namespace, values, option_string)

        action.__class__ = type(f"Recording{cls.__name__}", (cls,), {"__call__": call})


def _parse(build, argv: list[str]) -> tuple[Any, list[str], str]:
    """(namespace or None, dests stored, parser error text)."""
    stored: list[str] = []
    parser, sub = build()
    _recording(sub, stored)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit:
        return None, stored, err.getvalue().strip().splitlines()[-1] if err.getvalue() else "exit"
    return ns, stored, ""


def _vllm_parser():
    return vllm_parsers()


def _overrides(stored: list[str]) -> list[str]:
    seen, twice = set(), []
    for dest in stored:
        if dest in seen and dest not in twice:
            twice.append(dest)
        seen.add(dest)
    return twice


def judge_serve(
    argv: list[str], env: dict[str, str], device: str, plugin: str | None = None
) -> list[str]:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.engine.arg_utils import AsyncEngineArgs

    problems: list[str] = []
    if argv[1:2] != ["serve"]:
        return [f"not a `vllm serve` command: {argv[:2]}"]
    ns, stored, error = _parse(_vllm_parser, argv[1:])
    if ns is None:
        return [f"vllm serve rejects the argv: {error}"]
    problems += [
        f"--{d.replace('_', '-')} is given twice; the first is lost" for d in _overrides(stored)
    ]
    try:
        engine_args = AsyncEngineArgs.from_cli_args(ns)
    except Exception as exc:  # the judge reports, it does not crash the suite
        return [*problems, f"AsyncEngineArgs.from_cli_args: {exc!r}"]
    kvt = engine_args.kv_transfer_config
    if kvt is None:
        problems.append("no --kv-transfer-config")
    else:
        name = kvt.kv_connector
        prof = plugins.of(device, plugin)
        known_conn = prof.connector(name) if prof else None
        if known_conn is not None and known_conn.module is not None:
            # A connector of the node's plugin build (not installable here): the recorded
            # profile, generated from that build's source, is the judge.
            path = kvt.kv_connector_module_path
            if path is None and known_conn.module_path:
                problems.append(f"{name}: {prof.id} needs kv_connector_module_path "
                                f"{known_conn.module} ({known_conn.source})")  # fmt: skip
            elif path is not None and (path not in prof.modules or path != known_conn.module):
                problems.append(f"{name}: module path {path} is not {known_conn.module} in "
                                f"{prof.id} ({known_conn.source})")  # fmt: skip
            return _env_problems(problems, env, device, prof)
        plugin_fact = facts.PLUGIN_CONNECTORS.get(name)
        if plugin_fact and not kvt.kv_connector_module_path:
            pass  # registered by the plugin itself (recorded fact); not installable here
        elif plugin_fact and kvt.kv_connector_module_path != plugin_fact["module"]:
            problems.append(f"{name}: module path {kvt.kv_connector_module_path} is not "
                            f"{plugin_fact['module']} ({plugin_fact['source']})")  # fmt: skip
        else:
            try:
                KVConnectorFactory.get_connector_class(kvt)
            except Exception as exc:
                problems.append(f"KV connector {name} does not load: {exc!r}")
    return _env_problems(problems, env, device, plugins.of(device, plugin))


def _env_problems(
    problems: list[str], env: dict[str, str], device: str, prof: plugins.PluginProfile | None
) -> list[str]:
    # vLLM's own names, the device plugin's (devices.py) and the node's plugin release's.
    known = facts.vllm().env | profile(device).plugin_env | set(prof.env if prof else ())
    problems += [
        f"env {k} is not read by vLLM 0.32" for k in env if k.startswith("VLLM_") and k not in known
    ]
    return problems


def _router_parser():
    parser = router_parser()
    return parser, parser


def judge_router(argv: list[str], health_url: str | None, kind: str) -> list[str]:
    if kind == "toy-proxy":
        flags = {a for a in argv if a.startswith("--")}
        problems = [f"the proxy has no flag {f}" for f in sorted(flags - PROXY_FLAGS)]
        if not (health_url or "").endswith(PROXY_HEALTH):
            problems.append(f"the proxy serves {PROXY_HEALTH}, not {health_url}")
        return problems
    from vllm_router.router_args import RouterArgs

    ns, stored, error = _parse(_router_parser, argv[1:])
    if ns is None:
        return [f"vllm-router rejects the argv: {error}"]
    problems = [f"--{d.replace('_', '-')} is given twice" for d in _overrides(stored)]
    try:
        RouterArgs.from_cli_args(ns, use_router_prefix=False)
    except Exception as exc:
        problems.append(f"RouterArgs.from_cli_args: {exc!r}")
    if not (health_url or "").endswith("/health"):
        problems.append(f"vllm-router serves /health, not {health_url}")
    return problems


def judge_plan(plan) -> dict[str, list[str]]:
    out = {}
    for p in plan.processes:
        if p.role == "router":
            kind = "vllm-router" if "--vllm-pd-disaggregation" in p.argv else "toy-proxy"
            out[p.name] = judge_router(p.argv, p.health_url, kind)
        else:
            cfg = json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])
            out[p.name] = judge_serve(p.argv, p.env, cfg["kv_buffer_device"], p.plugin)
    return out
