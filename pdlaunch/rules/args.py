"""Rules on what reaches vLLM and the router besides the derived values: `extra_args`, `env:`
and secret references. Flags are read the way the real parsers read them (pdlaunch.spec.facts),
so `--block_size=32`, `--blo 32` and `--block-size 32` are one flag, as they are to vLLM.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from typing import Any

from pdlaunch.plan.env import managed_env
from pdlaunch.plan.ports import all_nodes
from pdlaunch.rules.base import NIXL, Finding, error, rule, warning
from pdlaunch.spec import facts, plugins
from pdlaunch.spec.addresses import address_key
from pdlaunch.spec.devices import profile
from pdlaunch.spec.load import FieldPath
from pdlaunch.spec.topology import SECRET_MARK, SECRET_REF, Instance, Topology, instance_name

GENERATOR = "pdlaunch/spec/facts (scripts/gen_vllm_facts.py)"

# vLLM destinations the plan derives -> the topology key that sets them. The spelling a user
# writes is resolved to its destination by the parser facts, so every alias is covered.
MANAGED_VLLM = {
    "model_tag": "model.name",
    "model": "model.name",
    "tokenizer": "model.tokenizer",
    "served_model_name": "model.served_name",
    "trust_remote_code": "model.trust_remote_code",
    "dtype": "model.dtype / dtype",
    "kv_cache_dtype": "model.kv_cache_dtype / kv_cache_dtype",
    "max_model_len": "model.max_model_len",
    "host": "bind",
    "port": "port",
    "block_size": "block_size",
    "kv_transfer_config": "kv_connector",
    "tensor_parallel_size": "tp",
    "data_parallel_size": "dp.size",
    "data_parallel_size_local": "dp.local_size",
    "data_parallel_address": "dp.master_address",
    "data_parallel_start_rank": "dp (derived per node)",
    "data_parallel_rpc_port": "dp.rpc_port",
    "data_parallel_hybrid_lb": "dp.hybrid_lb",
    "headless": "dp / hosts (derived per node)",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "enable_prefix_caching": "prefix_caching",
    "enforce_eager": "enforce_eager",
    # A YAML of flags (argparse_utils.py:_pull_args_from_config) could set any of the above
    # where pdlaunch leaves vLLM's default (e.g. an unpinned --block-size) unseen by the rules.
    "config": "extra_args (list the flags there, where they are checked)",
}

MANAGED_ROUTER = {
    "host": "router.bind",
    "port": "router.port",
    "prometheus_port": "router.prometheus_port",
    "prefill": "prefill instances",
    "decode": "decode instances",
    "worker_urls": "prefill / decode instances",
    "vllm_pd_disaggregation": "router.kind",
    "policy": "router.policy",
    "max_concurrent_requests": "router.max_concurrent_requests",
    "intra_node_data_parallel_size": "router.intra_node_data_parallel_size",
}


def vllm_facts(topo: Topology) -> facts.Facts | None:
    try:
        return facts.vllm(topo.model.vllm_version)
    except KeyError:
        return None


def instance_facts(topo: Topology, inst: Instance) -> facts.Facts | None:
    """The facts of the release this instance runs (its own vllm_version, else the model's)."""
    try:
        return facts.vllm(topo.vllm_version_of(inst))
    except KeyError:
        return None


def _all_facts(topo: Topology, insts: list[Instance]) -> list[facts.Facts]:
    """The distinct releases of `insts` (the model's when there are none), known ones only."""
    found = [instance_facts(topo, i) for i in insts] if insts else [vllm_facts(topo)]
    return list({f.version: f for f in found if f is not None}.values())


def _user_argvs(
    topo: Topology,
) -> Iterator[tuple[FieldPath, list[tuple[FieldPath, str]], facts.Facts | None]]:
    """Per instance, the user's words in the order they reach argv (defaults, then own), and
    the facts of the release that reads them."""
    for role, i, inst in topo.instances():
        words = [(("defaults", "extra_args", j), a) for j, a in enumerate(topo.defaults.extra_args)]
        words += [((role, i, "extra_args", j), a) for j, a in enumerate(inst.extra_args)]
        yield (role, i), words, instance_facts(topo, inst)


def _scanned(topo: Topology) -> Iterator[tuple[FieldPath, list[str], facts.Facts, bool]]:
    """(path, words, facts, is_vllm) for every extra_args list, against each release that
    receives it (defaults.extra_args reach every instance)."""
    for vf in _all_facts(topo, [inst for _, _, inst in topo.instances()]):
        yield ("defaults", "extra_args"), topo.defaults.extra_args, vf, True
    for role, i, inst in topo.instances():
        vf = instance_facts(topo, inst)
        if vf is not None:
            yield (role, i, "extra_args"), inst.extra_args, vf, True
    if topo.router.kind == "vllm-router":
        yield ("router", "extra_args"), topo.router.extra_args, facts.router(), False


def _scan(topo: Topology, words: list[str], fx: facts.Facts) -> tuple[list[facts.Arg], list[int]]:
    """`facts.scan`, once per distinct parser and words (a pure function of both): six rules
    scan every instance's extra_args, and on a large topology most instances share them."""
    cache = topo.derived("extra_args_scans", lambda _: {})
    key = (fx.tool, fx.version, tuple(words))
    if key not in cache:
        cache[key] = facts.scan(words, fx)
    args, positionals = cache[key]
    return list(args), list(positionals)


@rule("vllm-version", "the topology names a vLLM series pdlaunch has facts for", GENERATOR)
def vllm_version(topo: Topology) -> Iterator[Finding]:
    declared: list[tuple[FieldPath, str]] = [(("model", "vllm_version"), topo.model.vllm_version)]
    declared += [
        ((role, i, "vllm_version"), inst.vllm_version)
        for role, i, inst in topo.instances()
        if inst.vllm_version is not None
    ]
    for path, version in declared:
        try:
            facts.vllm(version)
        except KeyError:
            yield error(
                "vllm-version",
                path,
                f"pdlaunch has no facts for vLLM {version}, so it cannot render flags, "
                "environment, ports and connector paths that release reads",
                f"use one of: {', '.join(facts.supported_vllm())} (or add the release: "
                "scripts/gen_all_vllm_facts.sh)",
                GENERATOR,
            )


@rule("managed-flag", "extra_args must not set flags pdlaunch derives, in any spelling", GENERATOR)
def managed_flags(topo: Topology) -> Iterator[Finding]:
    for path, words, fx, is_vllm in _scanned(topo):
        managed = MANAGED_VLLM if is_vllm else MANAGED_ROUTER
        for arg in _scan(topo, words, fx)[0]:
            if arg.dest in managed:
                canonical = arg.flag.options[0] if arg.flag and arg.flag.options else arg.dest
                same = "" if arg.spelling == canonical else f" (read by {fx.tool} as {canonical})"
                yield error(
                    "managed-flag",
                    (*path, arg.index),
                    f"{arg.spelling}{same} is derived by pdlaunch from the topology; a second "
                    "value here would replace the one every rule checked",
                    f"remove it from extra_args and set `{managed[arg.dest]}` instead",
                    f"{fx.label} parser ({GENERATOR})",
                )


def _unknown_message(arg: facts.Arg, fx: facts.Facts) -> tuple[str, str]:
    removed = fx.removed_flags.get(arg.spelling.replace("_", "-") if fx.flexible else arg.spelling)
    if removed:
        return (
            f"{arg.spelling} was removed before {fx.label}: {removed['why']}",
            f"remove it{'; use ' + removed['replacement'] if removed['replacement'] else ''}",
        )
    if arg.ambiguous:
        return (
            f"{arg.spelling} abbreviates several {fx.tool} flags "
            f"({', '.join(arg.ambiguous[:4])}): {fx.tool} exits with 'ambiguous option'",
            "write the flag in full",
        )
    hint = fx.suggest(arg.spelling.replace("_", "-") if fx.flexible else arg.spelling)
    return (
        f"{arg.spelling} is not a flag of {fx.label}: it exits with 'unrecognized arguments'",
        f"did you mean {hint}?" if hint else f"remove it (see `{fx.tool} --help`)",
    )


@rule("unknown-flag", "every flag in extra_args is one the targeted parser knows", GENERATOR)
def unknown_flags(topo: Topology) -> Iterator[Finding]:
    for path, words, fx, _ in _scanned(topo):
        args, positionals = _scan(topo, words, fx)
        for arg in args:
            if arg.flag is None:
                message, fix = _unknown_message(arg, fx)
                yield error("unknown-flag", (*path, arg.index), message, fix, fx.label)
        for j in positionals:
            yield error(
                "unknown-flag",
                (*path, j),
                f"{words[j]!r} is not the value of any flag: {fx.tool} exits with "
                "'unrecognized arguments'",
                "give it as the value of a flag (`--flag=value`), or remove it",
                fx.label,
            )


_UNKNOWN_KEY = {
    "refused": "the parser exits with a validation error",
    "dropped": "the parser drops it silently",
    "later": "the engine refuses it when it builds the config",
}


def _config_keys(arg: facts.Arg) -> list[str]:
    """The config-class keys an occurrence names: `--x.key v`, or `--x '{"key": ...}'`."""
    if arg.json_keys:
        return [arg.json_keys[0].rstrip("+")]
    try:
        value = json.loads(arg.values[0]) if arg.values else None
    except ValueError:
        return []
    return list(value) if isinstance(value, dict) else []


@rule(
    "config-key",
    "every key given to a config flag is a field of the release's config class",
    GENERATOR,
)
def config_keys(topo: Topology) -> Iterator[Finding]:
    for path, words, fx, is_vllm in _scanned(topo):
        if not is_vllm:
            continue
        for arg in _scan(topo, words, fx)[0]:
            cfg = fx.json_config(arg.dest) if arg.flag and arg.flag.json else None
            if cfg is None:
                continue
            for key in _config_keys(arg):
                if key in cfg["fields"]:
                    continue
                close = difflib.get_close_matches(key, cfg["fields"], n=1, cutoff=0.75)
                yield error(
                    "config-key",
                    (*path, arg.index),
                    f"{arg.spelling}: {key!r} is not a field of {fx.label}'s {cfg['class']} "
                    f"({_UNKNOWN_KEY.get(cfg['unknown_keys'], 'it does nothing')})",
                    f"did you mean {close[0]}?"
                    if close
                    else f"remove it (fields: {', '.join(cfg['fields'][:12])}, ...)",
                    cfg["source"] or GENERATOR,
                )


@rule("flag-value", "flags that need a value get one from their choices", GENERATOR)
def flag_values(topo: Topology) -> Iterator[Finding]:
    for path, words, fx, _ in _scanned(topo):
        for arg in _scan(topo, words, fx)[0]:
            flag = arg.flag
            if flag is None:
                continue
            if arg.missing_value:
                yield error(
                    "flag-value",
                    (*path, arg.index),
                    f"{arg.spelling} needs a value",
                    f"write {arg.spelling}=VALUE",
                    fx.label,
                )
            elif flag.choices and flag.choices_exact and not arg.json_keys:
                bad = [v for v in arg.values if v not in flag.choices]
                if bad:
                    yield error(
                        "flag-value",
                        (*path, arg.index),
                        f"{arg.spelling} {bad[0]!r} is not one of {fx.label}'s choices",
                        f"use one of: {', '.join(flag.choices)}",
                        fx.label,
                    )


@rule(
    "flag-override",
    "no extra_args flag silently replaces another",
    "vllm/utils/argparse_utils.py:455",
)
def flag_override(topo: Topology) -> Iterator[Finding]:
    seen: set[tuple[FieldPath, FieldPath]] = set()
    for _, words, vf in _user_argvs(topo):
        if vf is None:
            continue
        args, _ = _scan(topo, [w for _, w in words], vf)
        for lost, winner in facts.overrides(args):
            lost_path, win_path = words[lost.index][0], words[winner.index][0]
            if (lost_path, win_path) in seen:
                continue
            seen.add((lost_path, win_path))
            how = (
                "vLLM merges the dotted flags into one JSON appended after every other "
                "argument, which replaces this one"
                if winner.json_keys and not lost.json_keys
                else "the later one wins"
            )
            yield warning(
                "flag-override",
                lost_path,
                f"{lost.spelling} is overridden by {winner.spelling} "
                f"(at {'.'.join(str(p) for p in win_path)}): {how}",
                f"give {lost.flag.options[0] if lost.flag else lost.spelling} once"
                + (
                    f" (e.g. {lost.flag.options[0]}.KEY=VALUE for each key)"
                    if lost.flag and lost.flag.json
                    else ""
                ),
                "vllm/utils/argparse_utils.py:455-462",
            )


@rule("pipeline-parallel", "NIXL decode cannot run pipeline parallel", f"{NIXL}:775")
def pipeline_parallel(topo: Topology) -> Iterator[Finding]:
    reported: set[tuple[FieldPath, int]] = set()
    for path, words, vf, is_vllm in _scanned(topo):
        if not is_vllm:
            continue
        for arg in _scan(topo, words, vf)[0]:
            if (path, arg.index) in reported:
                continue
            reported.add((path, arg.index))
            if arg.dest == "pipeline_parallel_size" and arg.values and arg.values[0].strip() != "1":
                yield error(
                    "pipeline-parallel",
                    (*path, arg.index),
                    f"pipeline parallel {arg.values[0]} is refused by vLLM's NIXL connector",
                    "use tensor or data parallelism instead",
                    f"{NIXL}:775-779",
                )


def _strings(value: Any, path: FieldPath) -> Iterator[tuple[FieldPath, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*path, k))
    elif isinstance(value, list):
        for j, v in enumerate(value):
            yield from _strings(v, (*path, j))


def _is_env_value(path: FieldPath) -> bool:
    return len(path) >= 2 and path[-2] == "env"


@rule("secret-placement", "secret references only as whole, well-formed env values", "pdlaunch")
def secret_placement(topo: Topology) -> Iterator[Finding]:
    for path, text in _strings(topo.model_dump(exclude_defaults=True), ()):
        if not SECRET_MARK.search(text):
            continue
        if _is_env_value(path):
            if SECRET_REF.fullmatch(text):
                continue
            yield error(
                "secret-placement",
                path,
                f"{text!r} is not a secret reference pdlaunch can resolve (it must be the "
                "whole value, `${env:NAME}` with NAME made of letters, digits and '_'); "
                "it would be exported as literal text",
                f"write {path[-1]}: ${{env:{path[-1]}}} (the variable read on the control host)",
                "pdlaunch secrets handling",
            )
        else:
            yield error(
                "secret-placement",
                path,
                "a ${env:...} secret may only be a whole env value: here it would be "
                "written into the script in plain text (or not resolved at all)",
                "put it in `env:` (e.g. VLLM_API_KEY: ${env:VLLM_API_KEY}) and let the "
                "program read it from the environment",
                "pdlaunch secrets handling",
            )


def _env_scopes(topo: Topology) -> Iterator[tuple[FieldPath, dict[str, str], list]]:
    """(path, env map, nodes it reaches) for every `env:` of the topology."""
    nodes = all_nodes(topo)
    yield ("defaults", "env"), topo.defaults.env, nodes
    # Grouped once: a scan of every node per host and per instance was quadratic (1,000
    # instances: ~0.5 s of validate).
    by_host: dict[str, list] = {}
    by_instance: dict[tuple[str, int], list] = {}
    for n in nodes:
        by_host.setdefault(address_key(n.host), []).append(n)  # as plan._host_settings
        by_instance.setdefault((n.role, n.index), []).append(n)
    for host, settings in topo.hosts.items():
        yield ("hosts", host, "env"), settings.env, by_host.get(address_key(host), [])
    for role, i, inst in topo.instances():
        yield (role, i, "env"), inst.env, by_instance.get((role, i), [])


@rule("managed-env", "env must not set variables pdlaunch derives", "pdlaunch plan (nodeenv.py)")
def managed_env_rule(topo: Topology) -> Iterator[Finding]:
    for path, env, nodes in _env_scopes(topo):
        if not env:
            continue
        reported: set[str] = set()
        for node in nodes:
            managed = managed_env(topo, node)
            for var in env:
                if var in managed and var not in reported:
                    reported.add(var)
                    yield error(
                        "managed-env",
                        (*path, var),
                        f"{var} is derived by pdlaunch for {node.name} (and differs per "
                        "instance and rank); a value here would replace it behind the plan",
                        f"remove it from env and set `{managed[var]}` instead",
                        "pdlaunch plan (nodeenv.py)",
                    )


def _env_known(var: str, vf: facts.Facts, devices: set[str]) -> bool:
    return var in vf.env or any(var in profile(d).plugin_env for d in devices)


@rule("unknown-env", "every VLLM_* variable set is one the targeted vLLM reads", GENERATOR)
def unknown_env(topo: Topology) -> Iterator[Finding]:
    for path, env, nodes in _env_scopes(topo):
        devices = {n.instance.device for n in nodes}
        # What each node's plugin release reads (its profile, from the source at its ref).
        profs = [plugins.of(n.instance.device, n.instance.plugin) for n in nodes]
        release_env = {v for p in profs if p is not None for v in p.env}
        for var in env:
            if var in release_env:
                continue
            for vf in _all_facts(topo, [n.instance for n in nodes]):
                finding = _unknown_env(var, path, vf, devices)
                if finding is not None:
                    yield finding
                    break


def _unknown_env(var: str, path: FieldPath, vf: facts.Facts, devices: set[str]) -> Finding | None:
    if not var.startswith("VLLM_") or _env_known(var, vf, devices):
        return None
    removed = vf.removed_env.get(var)
    if removed:
        return error(
            "unknown-env",
            (*path, var),
            f"{var} is not read by {vf.label}: {removed['why']}",
            f"use {removed['replacement']}" if removed["replacement"] else "remove it",
            removed["source"],
        )
    hint = vf.suggest_env(var)
    plugin = sorted(d for d in devices if d in ("hpu", "npu"))
    return (warning if plugin else error)(
        "unknown-env",
        (*path, var),
        f"{var} is read neither by {vf.label} nor by a plugin pdlaunch knows"
        + (f" ({', '.join(plugin)})" if plugin else "")
        + ": it does nothing",
        f"did you mean {hint}?" if hint else "remove it",
        GENERATOR,
    )


@rule("removed-setting", "topology keys whose vLLM setting no longer exists", GENERATOR)
def removed_setting(topo: Topology) -> Iterator[Finding]:
    if topo.kv_connector.abort_request_timeout is not None:
        yield error(
            "removed-setting",
            ("kv_connector", "abort_request_timeout"),
            "abort_request_timeout was VLLM_NIXL_ABORT_REQUEST_TIMEOUT, which vLLM 0.32 no "
            "longer reads: prefill now holds KV for the lease, renewed by decode",
            "use kv_connector.kv_lease_duration (seconds) instead (for a release before 0.23 "
            "pdlaunch renders it as VLLM_NIXL_ABORT_REQUEST_TIMEOUT)",
            "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py "
            "(kv_lease_duration); vllm/envs.py",
        )


@rule(
    "connector-module",
    "the KV connector class loads on each node's plugin build the way vLLM's factory looks it up",
    "vllm/distributed/kv_transfer/kv_connector/factory.py:103-126; pdlaunch/spec/facts/plugins/",
)
def connector_module(topo: Topology) -> Iterator[Finding]:
    if topo.kv_connector.kind != "mooncake":
        return
    mc = topo.kv_connector.mooncake
    source = "vllm/distributed/kv_transfer/kv_connector/factory.py:103-126"
    for role, i, inst in topo.instances():
        prof = plugins.of(inst.device, inst.plugin)
        if prof is None:
            continue
        known = prof.connector(mc.connector)
        name = instance_name(role, i, inst)
        if mc.module_path and mc.module_path not in prof.modules:
            moved = facts.REMOVED_MODULES.get(mc.module_path)
            yield error(
                "connector-module",
                ("kv_connector", "mooncake", "module_path"),
                f"{mc.module_path} does not exist in {prof.id}, which {name} runs"
                + (f" ({moved})" if moved else "")
                + ": vLLM imports it before its registry and the engine fails to start",
                f"remove module_path (pdlaunch renders {known.module} where {prof.id} needs it)"
                if known and known.module
                else f"name a module of {prof.id}",
                f"{source}; {prof.id} (modules under vllm_ascend/distributed)",
            )
            return
        if known is None:
            yield error(
                "connector-module",
                ("kv_connector", "mooncake", "connector"),
                f"{prof.id}, which {name} runs, registers no connector {mc.connector}",
                "use connector: " + " or ".join(c.name for c in prof.connectors),
                f"{source}; {prof.id} " + "; ".join(c.source for c in prof.connectors),
            )
            return
        # Only where the plugin registers the name in every process (vllm-ascend 0.23): vLLM
        # 0.32 imports a given module before its registry and looks the name up there. The
        # 2025-09 build needs the module path with the registered name (vLLM 0.10.2's factory
        # tries its registry first, factory.py:68-77), as both guides write it.
        if (
            mc.module_path
            and not known.module_path
            and mc.module_path == known.module
            and mc.connector != known.cls
        ):
            yield error(
                "connector-module",
                ("kv_connector", "mooncake", "connector"),
                f"{mc.module_path} defines {known.cls}, not {mc.connector}: with a "
                "module path vLLM looks the class up there, not in the registry",
                f"remove module_path, or use connector: {known.cls}",
                f"{source}; {prof.id} {known.source}",
            )
            return
