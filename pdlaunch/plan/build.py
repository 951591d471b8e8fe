"""Turn a valid topology into the exact processes to start.

Every derived value (agreed block size, --kv-transfer-config, UCX_TLS, visible devices,
side-channel host/port, DP flags, router URLs) is computed here and nowhere else:
templates only print what the plan says.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from pdlaunch import kv as kv_extension
from pdlaunch.kv import progress
from pdlaunch.plan import kv_geometry as kv
from pdlaunch.plan import kv_readers as kvreaders
from pdlaunch.plan.containers import ContainerSpec
from pdlaunch.plan.containers import spec as container_spec
from pdlaunch.plan.env import derived_env, devices_of
from pdlaunch.plan.nixl_progress import progress_delay_us
from pdlaunch.plan.node_addr import NodeAddress, node_address
from pdlaunch.plan.ports import (
    Node,
    PortKind,
    all_nodes,
    dp_master_address,
    mooncake_settings,
    node_ports,
    router_ports,
    side_channel_bases,
)

# The KV extension's root imports no torch/vLLM: its config builder runs here.
from pdlaunch.spec import facts
from pdlaunch.spec.addresses import is_local_control_host
from pdlaunch.spec.devices import profile
from pdlaunch.spec.plugins import default_for as plugin_default
from pdlaunch.spec.topology import SECRET_REF, DeviceKind, HostSettings, Instance, Ssh, Topology

ProcessRole = Literal["prefill", "decode", "router"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlannedPort(Frozen):
    port: int
    purpose: str  # for people (script headers, tables)
    kind: PortKind = "http"  # for programs (check, launch): never match on `purpose`


class Process(Frozen):
    name: str
    role: ProcessRole
    instance: str
    index: int
    node_index: int
    host: str
    local: bool
    ssh: Ssh
    argv: list[str]
    # Plain values, exported in this order.
    env: dict[str, str]
    # Variables prepended to an inherited path-like variable (LD_LIBRARY_PATH).
    path_prepend: dict[str, list[str]]
    # Secrets: target variable -> variable read on the control host at `up`; never resolved
    # into a rendered file.
    secret_env: dict[str, str]
    ports: list[PlannedPort]
    health_url: str | None
    devices: list[int]
    # The data-parallel ranks whose requests this process's API server takes, in the order
    # vLLM's X-data-parallel-rank header counts them (vllm/v1/engine/core_client.py: the
    # header is an index into the ranks the server manages); empty: it fronts one engine.
    dp_ranks: list[int] = []
    # Typed facts for consumers (check, launch), so none re-parses argv or env names.
    device: DeviceKind | None = None  # None: the router
    plugin: str | None = None  # the plugin profile the node runs (plugins.py)
    model_path: str | None = None
    kv_transfer_config: dict[str, Any] | None = None
    gpu_memory_utilization: float | None = None
    vllm_bin: str | None = None  # None: the router
    # The vLLM release this process runs (instance's vllm_version, else the model's): its
    # argv, env and ports were rendered for it, and `check` compares the node's vLLM with it.
    vllm_version: str | None = None  # None: the router
    # UCX_TLS / UCX_NET_DEVICES as planned (derived or the user's env), for check.
    ucx_tls: str | None = None
    ucx_net_devices: str | None = None
    # The address decode dials for this node's NIXL side channel (hosts.<h>.address or host).
    kv_host: str | None = None
    # Set where kv_host is a name the script resolves on the node at start (node_addr.py):
    # env values equal to node_addr.PLACEHOLDER get the address it resolved.
    node_addr: NodeAddress | None = None
    work_dir: str
    script_path: str
    log_path: str
    pid_path: str
    secrets_path: str
    # Run in a container (topology `container:`): the script wraps argv in `<runtime> run`.
    container: ContainerSpec | None = None

    @property
    def dirs(self) -> tuple[str, ...]:
        """The directories this process writes into (its work dir, its log's and its pid
        file's), each once: what a launcher must create and check before starting it."""
        parents = (posixpath.dirname(self.log_path), posixpath.dirname(self.pid_path))
        return tuple(dict.fromkeys((self.work_dir, *(d or "." for d in parents))))


class KvPair(Frozen):
    """Who post-processes the KV pages of one prefill -> decode geometry (kvpath.py)."""

    prefill: str
    decode: str
    path: Literal["none", "plugin", "vllm", "extension", "refused"]
    why: str
    source: str


class Plan(Frozen):
    deployment: str
    model: str
    served_model_name: str
    agreed_block_size: int
    kv_connector: str
    # The default vLLM release (model.vllm_version); an instance may run another
    # (Process.vllm_version).
    vllm_version: str = "0.32"
    processes: list[Process]
    kv_paths: list[KvPair] = []

    def by_role(self, role: ProcessRole) -> list[Process]:
        return [p for p in self.processes if p.role == role]

    @property
    def router(self) -> Process:
        return self.by_role("router")[0]

    def endpoint(self) -> str:
        r = self.router
        return f"http://{_url_host(r.host)}:{r.ports[0].port}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _host_settings(topo: Topology, host: str) -> HostSettings:
    return topo.settings_of(host)


def _work_dir(topo: Topology, host: str, override: str | None) -> str:
    base = override or _host_settings(topo, host).work_dir or topo.defaults.work_dir
    return posixpath.join(base, topo.deployment)


def _ssh(topo: Topology, host: str, override: Ssh | None) -> Ssh:
    return override or _host_settings(topo, host).ssh or topo.defaults.ssh


def _is_local(topo: Topology, host: str) -> bool:
    explicit = _host_settings(topo, host).local
    return explicit if explicit is not None else is_local_control_host(host)


def _split_env(*maps: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    plain: dict[str, str] = {}
    secret: dict[str, str] = {}
    for env in maps:
        for key, value in env.items():
            ref = SECRET_REF.fullmatch(value)
            if ref:
                secret[key] = ref.group(1)
                plain.pop(key, None)
            else:
                plain[key] = value
                secret.pop(key, None)
    return plain, secret


def served_name(topo: Topology) -> str:
    return topo.model.served_name or topo.model.name


def _nixl_role(setting: str, role: str) -> str:
    # vllm nixl/connector.py:97-103 deprecates kv_both for NixlConnector.
    if setting == "both":
        return "kv_both"
    return "kv_producer" if role == "prefill" else "kv_consumer"


def _nixl_reads(topo: Topology, node: Node, key: str) -> bool:
    """Whether the node's release's NixlConnector reads kv_connector_extra_config[key]."""
    try:
        vf = facts.vllm(topo.vllm_version_of(node.instance))
    except KeyError:
        return True  # the vllm-version rule refuses the topology
    return key in vf.nixl.get("extra_config_keys", {})


def mixed_releases(topo: Topology) -> bool:
    """P and D instances declare different vLLM releases (the NIXL compatibility hash covers
    vLLM's version: vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py:185)."""
    return topo.derived(
        "mixed_releases",
        lambda t: len({t.vllm_version_of(inst) for _, _, inst in t.instances()}) > 1,
    )


def kv_transfer_config(topo: Topology, node: Node) -> dict[str, Any]:
    inst, kvc = node.instance, topo.kv_connector
    dev = profile(inst.device)
    buffer = dev.kv_buffer_device if kvc.kv_buffer_device == "auto" else kvc.kv_buffer_device
    if kvc.kind == "mooncake":
        mc = mooncake_settings(topo)[(node.role, node.index)]
        cfg: dict[str, Any] = {
            "kv_connector": kvc.mooncake.connector,
            "kv_buffer_device": buffer,
            "kv_role": "kv_producer" if node.role == "prefill" else "kv_consumer",
            "kv_port": str(mc[0]),
            "engine_id": mc[1],
            "kv_connector_extra_config": {
                role: {"dp_size": insts[0].dp.size, "tp_size": insts[0].tp}
                for role, insts in (("prefill", topo.prefill), ("decode", topo.decode))
            },
        }
        module = mooncake_module_path(topo, inst)
        if module:
            cfg["kv_connector_module_path"] = module
        return cfg
    role = _nixl_role(kvc.kv_role, node.role)
    extra: dict[str, Any] = {}
    compat = kvc.enforce_handshake_compat
    if compat is None and (kv.heterogeneous_devices(topo) or mixed_releases(topo)):
        compat = False
    # Releases before the compatibility hash (0.10, 0.12) have nothing to switch off; the key
    # would only be dropped (the version-render rule refuses an explicit setting there).
    if compat is not None and (
        kvc.enforce_handshake_compat is not None
        or _nixl_reads(topo, node, "enforce_handshake_compat")
    ):
        extra["enforce_handshake_compat"] = compat
    adv = kv.prefill_kv(topo, inst)
    # Releases without the lease get VLLM_NIXL_ABORT_REQUEST_TIMEOUT instead (nodeenv.py).
    lease = kvc.kv_lease_duration and _nixl_reads(topo, node, "kv_lease_duration")
    if node.role == "prefill" and adv.kind == "extension":
        if lease:
            extra["kv_lease_duration"] = kvc.kv_lease_duration
        return kv_extension.prefill_kv_transfer_config(
            agreed_block_size=kv.agreed_block_size(topo),
            decode_block_sizes=sorted({kv.block_size(d) for d in topo.decode}),
            decode_kv_layout=adv.layout,
            kv_role=role,
            kv_buffer_device=buffer,
            load_failure_policy=kvc.load_failure_policy,
            enable_permute_local_kv=True,
            extra=extra,
        )
    cfg = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": buffer}
    native = adv.post if node.role == "prefill" and adv.kind == "plugin" else None
    if native is not None:
        # The plugin's own post-processing (kvpath.py): its connector and the settings it
        # reads (vllm-gaudi: enable_permute_local_kv, agreed_block_size).
        conn = kv.plugin_of(inst)
        plugin_conn = conn.connector(native.connector) if conn else None
        cfg["kv_connector"] = native.connector
        if plugin_conn and plugin_conn.module_path and plugin_conn.module:
            cfg["kv_connector_module_path"] = plugin_conn.module
        cfg.update(native.kv_transfer_config)
    if kvc.load_failure_policy:
        cfg["kv_load_failure_policy"] = kvc.load_failure_policy
    if kv.needs_permute(topo, node.role, inst):
        cfg["enable_permute_local_kv"] = True
    # The agreed block size only where the connector this process loads reads it (the
    # plugin's post-processing on prefill; no released NixlConnector does): elsewhere it
    # would parse and do nothing (kvreaders.py).
    agreed = kv_extension.KEY_AGREED_BLOCK_SIZE
    if (
        kv.heterogeneous_blocks(topo)
        or kvc.agreed_block_size != "auto"
        or (native and agreed in native.extra_config)
    ) and kvreaders.reads(topo, node.role, inst, cfg, agreed):
        extra[agreed] = kv.agreed_block_size(topo)
    if lease:
        extra["kv_lease_duration"] = kvc.kv_lease_duration
    if extra:
        cfg["kv_connector_extra_config"] = extra
    return cfg


def mooncake_module_path(topo: Topology, inst: Instance) -> str | None:
    """kv_connector_module_path for a Mooncake instance: the topology's, else the module of
    the connector its plugin build registers when nothing registers the name in every vLLM
    process (vllm-ascend 2025-09: vllm_ascend.distributed.mooncake_connector)."""
    mc = topo.kv_connector.mooncake
    if mc.module_path:
        return mc.module_path
    prof = kv.plugin_of(inst)
    conn = prof.connector(mc.connector) if prof else None
    return conn.module if conn and conn.module_path else None


def _gpu_memory_utilization(topo: Topology, inst: Instance) -> float | None:
    # vLLM's CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE instead.
    if inst.device == "cpu":
        return None
    return inst.gpu_memory_utilization or topo.defaults.gpu_memory_utilization


def _prefix_caching_off(topo: Topology, inst: Instance) -> str:
    """The release's spelling: --no-enable-prefix-caching up to 0.32, --disable-prefix-caching
    in 0.33 (its own action, vllm/engine/arg_utils.py:1402)."""
    try:
        flag = facts.vllm(topo.vllm_version_of(inst)).flag("enable_prefix_caching")
    except KeyError:
        flag = None
    options = flag.options if flag else ()
    return next((o for o in options if o.startswith(("--no-", "--disable-"))), NO_PREFIX_CACHING)


NO_PREFIX_CACHING = "--no-enable-prefix-caching"


def serve_argv(topo: Topology, node: Node) -> list[str]:
    inst, model = node.instance, topo.model
    binary = inst.vllm_bin or topo.defaults.vllm_bin
    argv = [binary, "serve", inst.model_path or model.name]
    headless = not node.serves_http
    if headless:
        argv.append("--headless")
    else:
        argv += ["--host", inst.bind, "--port", str(inst.port)]
    if model.served_name:
        argv += ["--served-model-name", model.served_name]
    if model.tokenizer:
        argv += ["--tokenizer", model.tokenizer]
    argv += ["--tensor-parallel-size", str(inst.tp)]
    dtype = inst.dtype or model.dtype
    if dtype != "auto":
        argv += ["--dtype", dtype]
    kv_dtype = inst.kv_cache_dtype or model.kv_cache_dtype
    if kv_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_dtype]
    if model.max_model_len:
        argv += ["--max-model-len", str(model.max_model_len)]
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    util = _gpu_memory_utilization(topo, inst)
    if util is not None:
        argv += ["--gpu-memory-utilization", f"{util:g}"]
    if kv.block_size_pinned(topo, inst):
        argv += ["--block-size", str(kv.block_size(inst))]
    if not kv.prefix_caching(topo, node.role, inst):
        argv.append(_prefix_caching_off(topo, inst))
    if inst.enforce_eager:
        argv.append("--enforce-eager")
    if inst.dp.size > 1:
        master = dp_master_address(inst)
        argv += [
            "--data-parallel-size", str(inst.dp.size),
            "--data-parallel-size-local", str(node.local_size),
            "--data-parallel-address", master,
            "--data-parallel-rpc-port", str(inst.dp.rpc_port),
        ]  # fmt: skip
        if node.start_rank:
            argv += ["--data-parallel-start-rank", str(node.start_rank)]
        if inst.dp.hybrid_lb:
            argv.append("--data-parallel-hybrid-lb")
    argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(topo, node))]
    argv += topo.defaults.extra_args + inst.extra_args
    return argv


def _serve_env(
    topo: Topology, node: Node
) -> tuple[dict[str, str], dict[str, list[str]], dict[str, str]]:
    inst = node.instance
    derived = {k: v.value for k, v in derived_env(topo, node).items()}
    # The user's env comes last; the managed-env rule has refused any that would replace a
    # managed variable, so only the defaults (UCX_MEMTYPE_CACHE, CPU KV space) give way.
    plain, secret = _split_env(
        derived, topo.defaults.env, _host_settings(topo, node.host).env, inst.env
    )
    prepend = [*topo.defaults.ld_library_path, *profile(inst.device).ld_library_path]
    paths = {"LD_LIBRARY_PATH": prepend} if prepend else {}
    if progress_delay_us(topo, inst):
        # First on PYTHONPATH: Python runs the shim at start-up in every engine process.
        paths["PYTHONPATH"] = [str(progress.SHIM_DIR)]
    return plain, paths, secret


def _paths(work_dir: str, name: str) -> dict[str, str]:
    return {
        "script_path": posixpath.join(work_dir, f"{name}.sh"),
        "log_path": posixpath.join(work_dir, "logs", f"{name}.log"),
        "pid_path": posixpath.join(work_dir, "run", f"{name}.pid"),
        "secrets_path": posixpath.join(work_dir, "run", f"{name}.secrets.env"),
    }


def _run_dir(work_dir: str) -> str:
    return posixpath.join(work_dir, "run")


def _node_process(topo: Topology, node: Node, bases: dict, mooncake: dict) -> Process:
    inst = node.instance
    devices = devices_of(topo, node)
    env, prepend, secret = _serve_env(topo, node)
    work_dir = _work_dir(topo, node.host, inst.work_dir)
    ports = [
        PlannedPort(port=u.port, purpose=u.purpose, kind=u.kind)
        for u in node_ports(topo, node, bases, mooncake)
    ]
    health = f"http://{_url_host(node.host)}:{inst.port}/health" if node.serves_http else None
    return Process(
        name=node.name,
        role=node.role,
        instance=node.instance_name,
        index=node.index,
        node_index=node.node_index,
        host=node.host,
        local=_is_local(topo, node.host),
        ssh=_ssh(topo, node.host, inst.ssh),
        argv=serve_argv(topo, node),
        env=env,
        device=inst.device,
        plugin=inst.plugin or plugin_default(inst.device),
        model_path=inst.model_path or topo.model.name,
        kv_transfer_config=kv_transfer_config(topo, node),
        gpu_memory_utilization=_gpu_memory_utilization(topo, inst),
        vllm_bin=inst.vllm_bin or topo.defaults.vllm_bin,
        vllm_version=topo.vllm_version_of(inst),
        ucx_tls=env.get("UCX_TLS"),
        ucx_net_devices=env.get("UCX_NET_DEVICES"),
        kv_host=topo.kv_address(node.host) if topo.kv_connector.kind == "nixl" else None,
        node_addr=node_address(topo, node),
        path_prepend=prepend,
        secret_env=secret,
        ports=ports,
        health_url=health,
        devices=devices,
        dp_ranks=_dp_ranks(node),
        work_dir=work_dir,
        container=_with_shim(
            container_spec(
                topo, inst.container, inst.device, node.name, node.role, _run_dir(work_dir)
            ),
            prepend,
        ),
        **_paths(work_dir, node.name),
    )


def _with_shim(c: ContainerSpec | None, prepend: dict[str, list[str]]) -> ContainerSpec | None:
    """A container sees the NIXL progress shim at the host's path (read-only), as the
    PYTHONPATH entry prepended inside it names it."""
    shim = str(progress.SHIM_DIR)
    if c is None or shim not in prepend.get("PYTHONPATH", []):
        return c
    mount = f"{shim}:{shim}:ro"
    return c if mount in c.mounts else c.model_copy(update={"mounts": [*c.mounts, mount]})


def _dp_ranks(node: Node) -> list[int]:
    """The ranks ``node``'s API server manages: all of them (internal load balancing, only
    the master serves HTTP), or its own (--data-parallel-hybrid-lb)."""
    dp = node.instance.dp
    if dp.size <= 1 or not node.serves_http:
        return []
    if dp.hybrid_lb:
        return list(range(node.start_rank, node.start_rank + node.local_size))
    return list(range(dp.size))


def router_urls(topo: Topology, role: str) -> list[str]:
    return [
        f"http://{_url_host(n.host)}:{n.instance.port}"
        for n in all_nodes(topo)
        if n.role == role and n.serves_http
    ]


def _router_argv(topo: Topology) -> list[str]:
    r = topo.router
    prefill, decode = router_urls(topo, "prefill"), router_urls(topo, "decode")
    if r.kind == "toy-proxy":
        launcher = ["python", r.binary] if r.binary.endswith(".py") else [r.binary]

        def hosts(urls: list[str]) -> list[str]:
            return [u.split("//", 1)[1].rsplit(":", 1)[0].strip("[]") for u in urls]

        def ports(urls: list[str]) -> list[str]:
            return [u.rsplit(":", 1)[1] for u in urls]

        return [
            *launcher, "--host", r.bind, "--port", str(r.port),
            "--prefiller-hosts", *hosts(prefill), "--prefiller-ports", *ports(prefill),
            "--decoder-hosts", *hosts(decode), "--decoder-ports", *ports(decode),
            *r.extra_args,
        ]  # fmt: skip
    argv = [r.binary, "--policy", r.policy, "--vllm-pd-disaggregation"]
    if r.max_concurrent_requests:
        argv += ["--max-concurrent-requests", str(r.max_concurrent_requests)]
    for url in prefill:
        argv += ["--prefill", url]
    for url in decode:
        argv += ["--decode", url]
    argv += ["--host", r.bind, "--port", str(r.port)]
    argv += ["--prometheus-port", str(r.prometheus_port)]
    if r.intra_node_data_parallel_size:
        argv += ["--intra-node-data-parallel-size", str(r.intra_node_data_parallel_size)]
    return argv + r.extra_args


def _router_health_path(kind: str) -> str:
    # vllm-router serves /health (vllm_router/mini_lb.py, src/server.rs); vLLM's toy proxy
    # (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) and vllm-ascend's
    # load-balance proxy serve /healthcheck only.
    return "/health" if kind == "vllm-router" else "/healthcheck"


def _router_process(topo: Topology) -> Process:
    r = topo.router
    plain, secret = _split_env(_host_settings(topo, r.host).env, r.env)
    work_dir = _work_dir(topo, r.host, None)
    return Process(
        name="router",
        role="router",
        instance="router",
        index=0,
        node_index=0,
        host=r.host,
        local=_is_local(topo, r.host),
        ssh=_ssh(topo, r.host, None),
        argv=_router_argv(topo),
        env=plain,
        path_prepend={},
        secret_env=secret,
        ports=[
            PlannedPort(port=u.port, purpose=u.purpose, kind=u.kind) for u in router_ports(topo)
        ],
        health_url=f"http://{_url_host(r.host)}:{r.port}{_router_health_path(r.kind)}",
        devices=[],
        work_dir=work_dir,
        container=container_spec(topo, r.container, None, "router", "router", _run_dir(work_dir)),
        **_paths(work_dir, "router"),
    )


def build_plan(topo: Topology) -> Plan:
    """The plan of a topology that passed the rules (callers check `rules.has_errors`)."""
    bases = side_channel_bases(topo)
    mooncake = mooncake_settings(topo)
    procs = [_node_process(topo, n, bases, mooncake) for n in all_nodes(topo)]
    procs.append(_router_process(topo))
    return Plan(
        deployment=topo.deployment,
        model=topo.model.name,
        served_model_name=served_name(topo),
        agreed_block_size=kv.agreed_block_size(topo),
        kv_connector=topo.kv_connector.kind,
        vllm_version=topo.model.vllm_version,
        processes=procs,
        kv_paths=[
            KvPair(prefill=p.prefill, decode=p.decode, path=p.kind, why=p.why, source=p.source)
            for p in kv.pair_paths(topo)
        ],
    )
