"""The environment pdlaunch derives for each engine process, and the devices it pins.

One function says which variables the plan sets and from which topology key, so the plan
exports them and the `managed-env` rule refuses a user `env:` entry that would replace one
behind the plan's back (the GB200 guide's `export VLLM_NIXL_SIDE_CHANNEL_PORT=5600` on every
node would make two instances on one host bind the same side channel). Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdlaunch.kv import progress
from pdlaunch.plan import kv_geometry as kv
from pdlaunch.plan.cpu import assign_cores
from pdlaunch.plan.nixl_progress import progress_delay_us
from pdlaunch.plan.node_addr import PLACEHOLDER, SIDE_CHANNEL_HOST, resolves_on_node
from pdlaunch.plan.ports import Node, side_channel_bases
from pdlaunch.spec import facts
from pdlaunch.spec.devices import PROFILES, profile
from pdlaunch.spec.topology import Topology, is_loopback


@dataclass(frozen=True)
class EnvValue:
    value: str
    # The topology key that decides this value (what a user should edit instead).
    key: str
    # False: a default the user's `env:` may replace (UCX_MEMTYPE_CACHE, the CPU KV space).
    managed: bool = True


# Pinning variables of every vendor are managed on every node: `devices:` decides them.
VISIBLE_DEVICE_VARS = frozenset(
    p.visible_devices_var for p in PROFILES.values() if p.visible_devices_var
)


def devices_of(topo: Topology, node: Node) -> list[int]:
    """Device indices (CPU cores on cpu) this node is pinned to."""
    if node.instance.devices is not None:
        return list(node.instance.devices)
    if node.instance.device == "cpu":
        # The host's CPU budget decides (cpubudget.py): never a core the host lacks.
        return topo.derived("cpu_cores", assign_cores)[node.name]
    return list(range(node.device_count))


def _cpu_bind(cores: list[int], ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: one core list per rank, ranks separated by '|'."""
    per = max(1, len(cores) // ranks)
    groups = [cores[r * per : (r + 1) * per] for r in range(ranks)]
    return "|".join(",".join(str(c) for c in g) for g in groups if g)


def ucx_tls(topo: Topology, node: Node) -> str | None:
    return node.instance.ucx_tls or topo.defaults.ucx_tls or profile(node.instance.device).ucx_tls


ABORT_TIMEOUT = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"


def _abort_timeout_release(topo: Topology, node: Node) -> bool:
    """The node's vLLM reads no kv_lease_duration but the older abort timeout."""
    try:
        vf = facts.vllm(topo.vllm_version_of(node.instance))
    except KeyError:
        return False
    return "kv_lease_duration" not in vf.nixl.get(
        "extra_config_keys", {"kv_lease_duration": 1}
    ) and (ABORT_TIMEOUT in vf.env)


def derived_env(topo: Topology, node: Node) -> dict[str, EnvValue]:
    """Every variable the plan sets on the node, with the key that decides it. Worked out
    once per node (the plan, version-render and managed-env all ask); a fresh dict each call."""
    cache = topo.derived("node_env", lambda _: {})
    key = (node.role, node.index, node.node_index)
    if key not in cache:
        cache[key] = _derived_env(topo, node)
    return dict(cache[key])


def _derived_env(topo: Topology, node: Node) -> dict[str, EnvValue]:
    inst = node.instance
    dev = profile(inst.device)
    env: dict[str, EnvValue] = {}
    for name, value in dev.env.items():
        env[name] = EnvValue(value, f"device {inst.device} (devices.py)", managed=False)
    if topo.kv_connector.kind == "nixl":
        if dev.layout_env:
            # Read by vLLM's NIXL path to pick the cache layout (vllm/envs.py VLLM_KV_CACHE_LAYOUT).
            env["VLLM_KV_CACHE_LAYOUT"] = EnvValue(kv.kv_layout(inst), "kv_layout")
        tls = ucx_tls(topo, node)
        if tls:
            env["UCX_TLS"] = EnvValue(tls, "ucx_tls")
            if is_loopback(node.host):
                # Else UCX also tries the machine's NICs for a loopback peer: the first NIXL
                # handshake took 30 s instead of 0.05 s (docs/cpu-pd-recipe.md).
                env["UCX_NET_DEVICES"] = EnvValue("lo", "host (loopback)")
        # nixl/base_scheduler.py:76 (side-channel port + DP rank); the host decode dials.
        # A name without hosts.<h>.address is resolved on the node at start (node_addr.py).
        env[SIDE_CHANNEL_HOST] = (
            EnvValue(PLACEHOLDER, "host (a name: resolved on the node) or hosts.<host>.address")
            if resolves_on_node(topo, node.host)
            else EnvValue(topo.kv_address(node.host), "host / hosts (or hosts.<host>.address)")
        )
        base = side_channel_bases(topo)[(node.role, node.index)]
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = EnvValue(
            str(base), "side_channel_port / kv_connector.side_channel_port"
        )
        path = kv.prefill_kv(topo, inst) if node.role == "prefill" else None
        if path is not None and path.post is not None:
            # What turns the plugin's own post-processing on (vllm-gaudi:
            # VLLM_HPU_HETERO_KV_LAYOUT=true imports hetero_hpu_nixl_connector).
            for name, value in path.post.env.items():
                env[name] = EnvValue(value, f"plugin ({path.plugin_id}, native KV conversion)")
        delay = progress_delay_us(topo, inst)
        if delay:
            # Read by the start-up shim the plan puts on PYTHONPATH (pdlaunch/kv/nixl_progress).
            env[progress.ENV_VAR] = EnvValue(str(delay), "kv_connector.progress_delay_us")
        lease = topo.kv_connector.kv_lease_duration
        if lease and _abort_timeout_release(topo, node):
            # Before 0.23 NIXL had no lease: prefill freed unfetched KV after this timeout
            # (0.10 vllm/envs.py:1154, 0.12 :1367; read in nixl_connector.py).
            env[ABORT_TIMEOUT] = EnvValue(str(lease), "kv_connector.kv_lease_duration")
    devices = devices_of(topo, node)
    if dev.visible_devices_var:
        env[dev.visible_devices_var] = EnvValue(",".join(str(d) for d in devices), "devices")
    if inst.device == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = EnvValue(
            _cpu_bind(devices, node.device_count), "devices"
        )
        env["VLLM_CPU_KVCACHE_SPACE"] = EnvValue("2", "env (a default)", managed=False)
    return env


def managed_env(topo: Topology, node: Node) -> dict[str, str]:
    """Variable -> topology key for every variable the user's `env:` must not set here."""
    out = {v: "devices" for v in VISIBLE_DEVICE_VARS}
    out.update({k: v.key for k, v in derived_env(topo, node).items() if v.managed})
    out["LD_LIBRARY_PATH"] = "ld_library_path"
    return out
