"""Rules on the vLLM release each instance runs (model.vllm_version, or the instance's own):
what the plan renders for a node must be what that release reads, and a prefill and a decode
on different releases must be able to complete the NIXL handshake.

Every fact comes from the release's facts (pdlaunch/spec/facts, generated from its wheel by
scripts/gen_vllm_facts.py), each with the wheel's file:line, so a finding cites the source
lines that show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pdlaunch import kv as kv_extension
from pdlaunch.plan import kv_readers as kvreaders
from pdlaunch.plan.env import derived_env
from pdlaunch.plan.ports import Node, all_nodes
from pdlaunch.rules.base import Finding, error, rule, warning
from pdlaunch.spec import facts, plugins
from pdlaunch.spec.devices import profile
from pdlaunch.spec.load import FieldPath
from pdlaunch.spec.topology import Topology, instance_name

GENERATOR = "pdlaunch/spec/facts (scripts/gen_vllm_facts.py)"
# The vLLM modules pdlaunch/kv/connector.py imports (its lines 39-60).
_NIXL_PKG = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/"
EXTENSION_IMPORTS = tuple(
    _NIXL_PKG + m
    for m in ("connector.py", "metadata.py", "base_scheduler.py", "base_worker.py",
              "pull_scheduler.py")
)  # fmt: skip


def _facts(topo: Topology, node: Node) -> facts.Facts | None:
    try:
        return facts.vllm(topo.vllm_version_of(node.instance))
    except KeyError:
        return None  # the vllm-version rule reports it


def _label(topo: Topology, node: Node) -> str:
    return f"vLLM {topo.vllm_version_of(node.instance)}"


def _version_path(topo: Topology, node: Node) -> FieldPath:
    if node.instance.vllm_version is not None:
        return (*node.path, "vllm_version")
    return ("model", "vllm_version")


def _planned(topo: Topology, node: Node) -> tuple[list[str], dict[str, Any]] | None:
    """The node's derived argv (without the user's extra_args, judged by unknown-flag) and its
    --kv-transfer-config, as the plan renders them."""
    from pdlaunch.plan import build as plan  # it imports the modules the rules use, not the rules

    try:
        argv = plan.serve_argv(topo, node)
        cfg = plan.kv_transfer_config(topo, node)
    except (KeyError, ValueError, ZeroDivisionError):
        return None  # a topology other rules refuse (e.g. no agreed block size)
    user = len(topo.defaults.extra_args) + len(node.instance.extra_args)
    return argv[: len(argv) - user] if user else argv, cfg


@rule(
    "version-render",
    "every flag, config key and VLLM_* variable the plan renders is read by the node's vLLM",
    GENERATOR,
)
def version_render(topo: Topology) -> Iterator[Finding]:
    reported: set[tuple[FieldPath, str]] = set()
    agreed_read, judged_all = False, True
    for node in all_nodes(topo):
        vf = _facts(topo, node)
        planned = _planned(topo, node) if vf is not None else None
        if vf is None or planned is None:
            judged_all = False
            continue
        argv, cfg = planned
        extra = cfg.get("kv_connector_extra_config")
        agreed_read |= isinstance(extra, dict) and kv_extension.KEY_AGREED_BLOCK_SIZE in extra
        for problem, fix, source in _render_problems(topo, node, vf, argv, cfg):
            key = ((node.role, node.index), problem)
            if key in reported:
                continue
            reported.add(key)
            yield error("version-render", _version_path(topo, node), problem, fix, source)
    explicit = topo.kv_connector.agreed_block_size != "auto"
    if explicit and judged_all and not agreed_read and topo.kv_connector.kind == "nixl":
        # The plan renders the key only where a connector reads it (kvreaders.py).
        yield error(
            "version-render",
            ("kv_connector", "agreed_block_size"),
            "kv_connector.agreed_block_size is read by no process of this deployment: only "
            "a prefill that re-blocks (pdlaunch's KV extension, or a plugin's native "
            "post-processing) reads it, and here stock NIXL moves the prefill's own blocks",
            "remove agreed_block_size (or `auto`); set it only where a prefill re-blocks",
            "pdlaunch/plan/kv_readers.py; each release's runtime.nixl.extra_config_keys",
        )


def _render_problems(
    topo: Topology, node: Node, vf: facts.Facts, argv: list[str], cfg: dict[str, Any]
) -> Iterator[tuple[str, str, str]]:
    label, name = _label(topo, node), node.instance_name
    for arg in facts.scan(argv, vf, start=2)[0]:
        if arg.flag is None:
            yield (
                f"{name}: pdlaunch would render {arg.spelling}, which {label}'s parser does not "
                "have (it exits with 'unrecognized arguments')",
                "run a release that has it, or leave the setting that needs it at its default",
                f"{label} parser ({GENERATOR})",
            )
    fields, src = vf.kv_config_fields, vf.kv_config_source
    for key in cfg:
        if fields and key not in fields:
            what = "refuses it" if vf.kv_unknown_keys == "refused" else "drops it silently"
            yield (
                f"{name}: --kv-transfer-config key {key!r} is not a field of {label}'s "
                f"KVTransferConfig ({what})",
                _kv_fix(key),
                f"{src} (fields: {', '.join(sorted(fields))})",
            )
    extra = cfg.get("kv_connector_extra_config", {})
    reads = kvreaders.keys_read(topo, node.role, node.instance, cfg)
    if isinstance(extra, dict) and reads is not None:
        who = (
            "pdlaunch's KV extension"
            if cfg.get("kv_connector_module_path") == kv_extension.CONNECTOR_MODULE_PATH
            else f"{label}'s {cfg.get('kv_connector')}"
        )
        for key in extra:
            if key not in reads:
                yield (
                    f"{name}: {who} never reads kv_connector_extra_config {key!r}: the "
                    "setting would be ignored silently",
                    _kv_fix(key),
                    f"{vf.nixl.get('files', ['nixl'])[0]} (reads: "
                    f"{', '.join(sorted(reads)) or 'none'}); pdlaunch/plan/kv_readers.py",
                )
    module = cfg.get("kv_connector_module_path")
    if module == kv_extension.CONNECTOR_MODULE_PATH and not any(
        v.startswith(vf.series + ".") for v in kv_extension.TESTED_VLLM_VERSIONS
    ):
        files = vf.nixl.get("files", [])
        missing = [m for m in EXTENSION_IMPORTS if m not in files]
        why = (
            f"it imports {', '.join(missing)}, which {label} does not have"
            if missing
            else "it refuses to start on any other release (assert_supported_vllm)"
        )
        yield (
            f"{name}: pdlaunch's KV extension ({module}) is built on vLLM "
            f"{', '.join(kv_extension.TESTED_VLLM_VERSIONS)}'s NIXL internals: {why}",
            "run this prefill on vLLM 0.32, or give P and D block sizes/layouts stock NIXL "
            "handles (decode block = k x prefill block)",
            f"pdlaunch/kv/connector.py:38-60,173 (TESTED_VLLM_VERSIONS); {_nixl_module(vf)}",
        )
    for var in derived_env(topo, node):
        known = var in vf.env or var in profile(node.instance.device).plugin_env
        if var.startswith("VLLM_") and not known:
            yield (
                f"{name}: pdlaunch would export {var}, which {label} does not read",
                "run a release that reads it",
                f"{label} vllm/envs.py ({GENERATOR})",
            )


def _kv_fix(key: str) -> str:
    settings = {
        "kv_load_failure_policy": "kv_connector.load_failure_policy",
        "enable_permute_local_kv": "decode kv_layout (set it equal to the prefill's layout)",
        "kv_lease_duration": "kv_connector.kv_lease_duration",
        "enforce_handshake_compat": "kv_connector.enforce_handshake_compat",
    }
    where = settings.get(key)
    return (
        f"unset {where} for this release, or run a release that reads it"
        if where
        else "run a release that reads it"
    )


def _nixl_module(vf: facts.Facts) -> str:
    c = vf.connectors.get("NixlConnector")
    return f"{c['module']} ({c['source']})" if c else "no NixlConnector"


@rule("nixl-device", "the node's vLLM NIXL connector accepts its device", GENERATOR)
def nixl_device(topo: Topology) -> Iterator[Finding]:
    if topo.kv_connector.kind != "nixl":
        return
    seen: set[tuple[str, str]] = set()
    for node in all_nodes(topo):
        vf = _facts(topo, node)
        table = vf.nixl.get("supported_devices") if vf else None
        dev = node.instance.device
        # hpu / npu: the plugin's platform supplies its own entry (not in vLLM's table).
        if vf is None or not table or dev not in ("cuda", "cpu") or (vf.version, dev) in seen:
            continue
        seen.add((vf.version, dev))
        if dev not in table["map"]:
            yield error(
                "nixl-device",
                _version_path(topo, node),
                f"{node.instance_name}: {_label(topo, node)}'s NixlConnector accepts only "
                f"{', '.join(sorted(table['map']))} devices, not {dev}: the engine refuses "
                "to start",
                "run a release whose NIXL accepts this device (CPU: 0.11 or later)",
                table["source"],
            )


def _handshake(vf: facts.Facts) -> dict[str, Any]:
    n = vf.nixl
    meta, payload = n.get("agent_metadata") or {}, n.get("handshake_payload") or {}
    version = n.get("connector_version") or {}
    return {
        "side-channel port formula": (n.get("side_channel", {}).get("formula"), _sc_src(vf)),
        "NIXL_CONNECTOR_VERSION": (version.get("value"), version.get("source", "none")),
        "NixlAgentMetadata fields": (meta.get("fields"), meta.get("source", "none")),
        "handshake payload (compatibility hash)": (
            payload.get("fields"),
            payload.get("source", "none"),
        ),
    }


def _sc_src(vf: facts.Facts) -> str:
    return "; ".join(e["source"] for e in vf.side_channel.get("expressions", ())) or "none"


@rule(
    "pd-handshake",
    "a prefill and a decode on different vLLM releases can complete the NIXL handshake",
    GENERATOR,
)
def pd_handshake(topo: Topology) -> Iterator[Finding]:
    if topo.kv_connector.kind != "nixl":
        return
    # Each release pair at its first (prefill, decode) pair, found in P + D steps: a walk of
    # every pair was P x D (1,000 instances: 250,000 steps).
    first_p = _first_by_release(topo, topo.prefill)
    first_d = _first_by_release(topo, topo.decode)
    for pv, (pi, p) in first_p.items():
        for dv, (di, d) in first_d.items():
            if pv == dv:
                continue
            try:
                pf, df = facts.vllm(pv), facts.vllm(dv)
            except KeyError:
                continue
            path: FieldPath = ("model", "vllm_version")
            if d.vllm_version is not None:
                path = ("decode", di, "vllm_version")
            elif p.vllm_version is not None:
                path = ("prefill", pi, "vllm_version")
            yield from _pair(topo, pv, dv, pf, df, path)


def _first_by_release(topo: Topology, insts: list) -> dict[str, tuple[int, Any]]:
    first: dict[str, tuple[int, Any]] = {}
    for i, inst in enumerate(insts):
        first.setdefault(topo.vllm_version_of(inst), (i, inst))
    return first


def _pair(
    topo: Topology, pv: str, dv: str, pf: facts.Facts, df: facts.Facts, path: FieldPath
) -> Iterator[Finding]:
    ph, dh = _handshake(pf), _handshake(df)
    for what in ph:
        (a, asrc), (b, bsrc) = ph[what], dh[what]
        if a != b:
            yield error(
                "pd-handshake",
                path,
                f"prefill on vLLM {pv} and decode on vLLM {dv} cannot complete the NIXL "
                f"handshake: their {what} differ ({_short(a)} vs {_short(b)})",
                "run prefill and decode on releases of one series",
                f"vLLM {pv} {asrc}; vLLM {dv} {bsrc}",
            )
            return
    factors = (pf.nixl.get("compat_hash_factors") or {}).get("keys", [])
    compat = topo.kv_connector.enforce_handshake_compat
    if "vllm_version" in factors and compat:
        yield error(
            "pd-handshake",
            ("kv_connector", "enforce_handshake_compat"),
            f"the NIXL compatibility hash covers vLLM's version, so prefill {pv} and decode "
            f"{dv} refuse each other while enforce_handshake_compat is on",
            "remove enforce_handshake_compat (pdlaunch turns it off for mixed releases)",
            pf.nixl["compat_hash_factors"]["source"],
        )


def _series(series: str) -> tuple[int, ...]:
    return tuple(int(x) for x in series.split(".") if x.isdigit())


def _short(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)} fields" if len(value) > 4 else ", ".join(value)
    return "none" if value is None else str(value)


@rule(
    "plugin-vllm",
    "each instance's plugin profile is the release built for the instance's vLLM series",
    "pdlaunch/spec/facts/plugins/ (each profile's `vllm`, read from the plugin's source)",
)
def plugin_vllm(topo: Topology) -> Iterator[Finding]:
    for role, i, inst in topo.instances():
        try:
            prof = plugins.of(inst.device, inst.plugin)
        except KeyError:
            continue  # the plugin rule refuses an unknown profile
        version = topo.vllm_version_of(inst)
        series = facts.series_of(version)
        if prof is None or prof.vllm == series:
            continue
        same = [p for p in plugins.profiles().values() if p.plugin == prof.plugin]
        matching = [p.id for p in same if p.vllm == series]
        named = f"named by {instance_name(role, i, inst)}" if inst.plugin else "its default"
        pin = f"run vLLM {prof.vllm} on this instance (vllm_version: {prof.vllm})"
        fix = (
            f"name {' or '.join(matching)} (built for vLLM {series}), or {pin}"
            if matching
            else f"{pin}; pdlaunch has {prof.plugin} profiles for vLLM "
            + ", ".join(sorted({p.vllm for p in same}, key=_series))
        )
        yield warning(
            "plugin-vllm",
            (role, i, "plugin") if inst.plugin else (role, i, "device"),
            f"{instance_name(role, i, inst)} runs {prof.id} ({named}), built for vLLM "
            f"{prof.vllm}, on vLLM {version}: a plugin patches and imports its own release's "
            "vLLM internals, so on another series its connector, env and KV layout facts may "
            "not hold (or it fails to import)",
            fix,
            f"pdlaunch/spec/facts/plugins/{prof.id}.json: {prof.vllm_note} "
            f"({prof.origin} {prof.ref})",
        )
