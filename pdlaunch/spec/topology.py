"""The topology schema: what a user writes in topology.yaml, as pydantic models.

Only shape and per-field ranges live here; cross-field constraints (ports, block
sizes, layouts, TP) are rules in `rules.py`, so every one of them can name its
source and a fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    PrivateAttr,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)

# Address predicates live in pdlaunch.spec.addresses (one definition for rules, plan and hosts);
# is_loopback stays importable from here for nodeenv.py.
from pdlaunch.kv.progress import MAX_DELAY_US
from pdlaunch.spec import facts
from pdlaunch.spec.addresses import address_key, canonical_host, is_ip_literal
from pdlaunch.spec.addresses import is_loopback as is_loopback
from pdlaunch.spec.backend_settings import SlurmSettings
from pdlaunch.spec.devices import device_kinds
from pdlaunch.spec.plugins import default_for, profile_ids, profiles, unknown_message


def _known_device(kind: Any) -> Any:
    # Checked against devices.py when a topology is read, not frozen into a Literal at
    # import, so an accelerator is one entry there; pydantic's own Literal wording.
    kinds = device_kinds()
    if not isinstance(kind, str) or kind not in kinds:
        listed = " or ".join(filter(None, [", ".join(map(repr, kinds[:-1])), repr(kinds[-1])]))
        raise ValueError(f"must be {listed}")
    return kind


class _DeviceKindJsonSchema:
    """The JSON Schema lists the kinds devices.py knows when the schema is made."""

    @staticmethod
    def __get_pydantic_json_schema__(schema: Any, handler: GetJsonSchemaHandler) -> Any:
        out = handler(schema)
        out["enum"] = list(device_kinds())
        return out


DeviceKind = Annotated[str, BeforeValidator(_known_device), _DeviceKindJsonSchema()]
KvLayout = Literal["NHD", "HND"]
Role = Literal["prefill", "decode"]

Port = Annotated[int, Field(ge=1, le=65535)]
PositiveInt = Annotated[int, Field(ge=1)]
# Strict: YAML `true` or `1.5` is refused, not read as 1. Ceiling: pdlaunch/kv/progress.py.
ProgressDelay = Annotated[StrictInt, Field(ge=0, le=MAX_DELAY_US)]

SECRET_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
# Anything that looks like the start of a reference: a malformed one (`${env:HF_TOKEN`,
# `${env:HF-TOKEN}`) must be refused, not exported as its literal text.
SECRET_MARK = re.compile(r"\$\{\s*env\s*:", re.IGNORECASE)
# Matched with fullmatch: `$` also matches before a trailing newline, and "pre\n" must not
# become a file name, an env key or a Kubernetes name.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HOSTNAME = re.compile(r"[A-Za-z0-9_.:%-]{1,253}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
RULE_ID = re.compile(r"[a-z][a-z0-9-]{0,63}")


class Strict(BaseModel):
    # Unknown keys are errors: a typo such as `blocksize:` must not pass silently.
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_release(v: str | None) -> str | None:
    # The facts are found by series: only a release's shape may name one (issue 32: a
    # `router-0.1.17` read the router's facts, 5,000 digits broke int()). A release of this
    # shape without facts is the vllm-version rule's finding, which cites the generator.
    if v is not None and not facts.is_release(v):
        shown = repr(v) if len(v) <= 40 else repr(v[:40]) + f"... ({len(v)} characters)"
        raise ValueError(
            f"{shown} is not a vLLM release (X.Y, X.Y.Z, optionally rcN, .postN, .devN, "
            f"+local, e.g. 0.32, 0.10.2, 0.10.2rc2.dev1+gf21f5ea); pdlaunch has facts for "
            f"{', '.join(facts.supported_vllm())}"
        )
    return v


def _check_env(env: dict[str, str]) -> dict[str, str]:
    # Where `${env:...}` may stand is a rule (secret-placement), so it can name its line.
    for key in env:
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
    return env


EnvMap = dict[str, str]


def _check_host(host: str) -> str:
    if not HOSTNAME.fullmatch(host):
        raise ValueError(f"{host!r} is not a host name or IP address")
    return canonical_host(host)


class Ssh(Strict):
    user: str | None = None
    port: Port | None = Field(None, description="Default: ~/.ssh/config, else 22")
    key: str | None = Field(None, description="Private key file on the control host")
    jump: str | None = Field(None, description="ProxyJump host, [user@]host[:port]")
    connect_timeout: float = Field(10.0, gt=0, le=600)


class HostSettings(Strict):
    ssh: Ssh | None = None
    env: EnvMap = Field(default_factory=dict)
    work_dir: str | None = None
    local: bool | None = Field(
        None, description="Run without SSH (default: true for 127.0.0.1/localhost/::1)"
    )
    address: str | None = Field(
        None,
        description="The node's IP address peers dial for KV (VLLM_NIXL_SIDE_CHANNEL_HOST; "
        "the GB200 guide's $(hostname -i)); default: the host itself, and a host written as "
        "a name is resolved on the node when its script starts",
    )
    cpus: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Cores CPU engines may use here (cores 0..cpus-1; `pdlaunch check` "
        "compares it with the host's nproc/affinity). Default: unknown, one core per "
        "CPU engine rank in topology order",
    )

    _env = field_validator("env")(_check_env)

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None and not is_ip_literal(v):
            raise ValueError(f"{v!r} is not an IP address (a name may resolve elsewhere)")
        return v


ContainerRuntime = Literal["docker", "podman", "pyxis"]
# "SRC:DST[:OPTS]" with absolute paths; OPTS is the runtime's (ro, rw, z, ...).
MOUNT = re.compile(r"(/[^:\s]*):(/[^:\s]*)(:[A-Za-z0-9,=]+)?")
# --device HOST[:CONTAINER[:PERMS]]
DEVICE = re.compile(r"/[^:\s]+(:/[^:\s]+)?(:[rwm]{1,3})?")
SHM_SIZE = re.compile(r"[0-9]{1,15}[bkmgBKMG]?")
# An image reference: [registry/]path[:tag][@digest]; no spaces or shell-looking characters
# (it also names a Kubernetes image and a pyxis --container-image).
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+#-]{0,511}")


class Container(Strict):
    """Run an engine (or the router) in a container. Under `defaults:` it applies to every
    instance; an instance's (or the router's) own fields override it: a scalar replaces the
    default's, a list adds to it. Every field is optional where it may be inherited."""

    enabled: bool | None = Field(
        None, description="false: this instance runs on the host although defaults name an image"
    )
    image: str | None = Field(None, description="Image with vLLM (or the router) in it")
    runtime: ContainerRuntime | None = Field(
        None,
        description="docker or podman (over SSH: `<runtime> run`), pyxis (Slurm: srun "
        "--container-image); default docker",
    )
    mounts: list[str] | None = Field(
        None, description="Bind mounts, SRC:DST[:OPTS] with absolute paths (-v)"
    )
    devices: list[str] | None = Field(None, description="Device nodes, HOST[:CTR][:rwm] (--device)")
    shm_size: str | None = Field(None, description="--shm-size, e.g. 500g (default: the device's)")
    extra_args: list[str] = Field(
        default_factory=list, description="More `run` flags, before the image"
    )
    pass_env: list[str] = Field(
        default_factory=list,
        description="Variables of the node's own environment passed in by name (--env NAME)",
    )
    device_flags: bool | None = Field(
        None,
        description="Add what the device kind needs (devices.py: --privileged, --ipc=host, "
        "Ascend's device nodes and driver mounts); default true",
    )

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not IMAGE.fullmatch(v):
            raise ValueError(f"{v!r} is not an image reference")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str] | None) -> list[str] | None:
        for m in v or []:
            if not MOUNT.fullmatch(m):
                raise ValueError(f"{m!r} is not SRC:DST[:OPTS] with absolute paths")
        return v

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[str] | None) -> list[str] | None:
        for d in v or []:
            if not DEVICE.fullmatch(d):
                raise ValueError(f"{d!r} is not HOST_PATH[:CONTAINER_PATH][:rwm]")
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str | None) -> str | None:
        if v is not None and not SHM_SIZE.fullmatch(v):
            raise ValueError(f"{v!r} is not a size such as 500g, 16m or 1073741824")
        return v

    @field_validator("pass_env")
    @classmethod
    def _pass_env(cls, v: list[str]) -> list[str]:
        for name in v:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return v


class Model(Strict):
    name: str = Field(min_length=1, description="HF model id or a path on every node")
    served_name: str | None = None
    dtype: str = "auto"
    max_model_len: PositiveInt | None = None
    kv_cache_dtype: str = Field("auto", description="--kv-cache-dtype; must match on P and D")
    trust_remote_code: bool = False
    tokenizer: str | None = Field(None, description="--tokenizer (default: the model's own)")
    vllm_version: str = Field(
        "0.32",
        description="vLLM release series the nodes run: flags and env variables are checked "
        "against pdlaunch's facts for it",
    )

    _vllm_version = field_validator("vllm_version")(_check_release)


class Defaults(Strict):
    ssh: Ssh = Field(default_factory=Ssh)
    env: EnvMap = Field(default_factory=dict)
    work_dir: str = Field("/tmp/pdlaunch", description="Where scripts and logs go on each host")
    vllm_bin: str = Field("vllm", description="vLLM launcher on the nodes (or a stand-in)")
    extra_args: list[str] = Field(default_factory=list)
    ld_library_path: list[str] = Field(default_factory=list)
    gpu_memory_utilization: float = Field(0.8, gt=0, le=1)
    ucx_tls: str | None = Field(None, description="UCX_TLS (default: per device kind)")
    container: Container | None = Field(
        None, description="Run every engine and the router in this container (docs: README)"
    )

    _env = field_validator("env")(_check_env)


# Upper bounds keep derived lists (devices, ports per rank) small: no real deployment has
# more, and an unbounded `tp: 1000000000` must be an error, not an out-of-memory.
MAX_TP = 512
MAX_DP = 4096


class DataParallel(Strict):
    size: int = Field(1, ge=1, le=MAX_DP)
    local_size: int | None = Field(
        None, ge=1, le=MAX_DP, description="DP ranks per node (default: size / number of hosts)"
    )
    master_address: str | None = Field(None, description="Default: the instance's first host")
    rpc_port: Port = 13345
    hybrid_lb: bool = Field(
        False, description="--data-parallel-hybrid-lb: every node serves its own HTTP port"
    )

    @field_validator("master_address")
    @classmethod
    def _master(cls, v: str | None) -> str | None:
        return _check_host(v) if v is not None else v


class Instance(Strict):
    name: str | None = Field(None, description="Default: <role>-<index>")
    host: str | None = Field(None, description="Shorthand for hosts: [host]")
    hosts: list[str] | None = Field(None, description="Nodes of a multi-node DP instance")
    device: DeviceKind
    model_path: str | None = Field(
        None, description="This instance's path to the same weights (default: model.name)"
    )
    dtype: str | None = Field(None, description="Overrides model.dtype (must agree)")
    kv_cache_dtype: str | None = Field(None, description="Overrides model.kv_cache_dtype")
    port: Port = 8000
    bind: str = Field("0.0.0.0", description="--host for vllm serve")
    tp: int = Field(1, ge=1, le=MAX_TP)
    dp: DataParallel = Field(default_factory=DataParallel)
    devices: list[Annotated[int, Field(ge=0, le=65535)]] | None = Field(
        None,
        max_length=MAX_DP,
        description="Device indices on each host (default: 0..TP*local DP-1); CPU cores on cpu",
    )
    kv_layout: KvLayout | None = Field(None, description="Default: the device's preferred layout")
    block_size: PositiveInt | None = Field(None, description="Default: the device's default")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    prefix_caching: bool | None = Field(
        None, description="Default: off on prefill when KV post-processing needs it, else on"
    )
    enforce_eager: bool = False
    side_channel_port: Port | None = Field(
        None,
        description="NIXL side-channel base port (default: allocated per host from "
        "kv_connector.side_channel_port)",
    )
    ucx_tls: str | None = Field(None, description="UCX_TLS (default: defaults.ucx_tls)")
    kv_port: Port | None = Field(None, description="Mooncake kv_port (default: allocated)")
    engine_id: str | None = Field(None, description="Mooncake engine_id (default: allocated)")
    plugin: str | None = Field(
        None,
        description="Plugin profile the node runs, e.g. vllm-gaudi@e269485 (default: the "
        "device kind's newest; pdlaunch/spec/facts/plugins/)",
        json_schema_extra={"enum": [*profile_ids(), None]},
    )
    env: EnvMap = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)
    ssh: Ssh | None = None
    work_dir: str | None = None
    vllm_bin: str | None = None
    container: Container | None = Field(None, description="Overrides defaults.container")
    vllm_version: str | None = Field(
        None,
        description="vLLM release this instance's nodes run (e.g. 0.10.2, or a source build "
        "0.10.2rc2.dev1+gf21f5ea); default: model.vllm_version. Flags, env, ports and "
        "connector paths are rendered for it",
    )

    _env = field_validator("env")(_check_env)
    _vllm_version = field_validator("vllm_version")(_check_release)

    @field_validator("plugin")
    @classmethod
    def _plugin(cls, v: str | None) -> str | None:
        if v is not None and v not in profiles():
            raise ValueError(unknown_message(v))
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not NAME.fullmatch(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 63 characters)")
        return v

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if any(d < 0 for d in v):
                raise ValueError("device indices are >= 0")
            if len(set(v)) != len(v):
                raise ValueError("a device is listed twice")
        return v

    @field_validator("host", "bind")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        return _check_host(v) if v is not None else v

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str] | None) -> list[str] | None:
        return [_check_host(h) for h in v] if v is not None else v

    @model_validator(mode="after")
    def _one_host_form(self) -> Instance:
        if (self.host is None) == (self.hosts is None):
            raise ValueError("give exactly one of 'host' or 'hosts'")
        if self.hosts is not None and not self.hosts:
            raise ValueError("'hosts' needs at least one host")
        if self.plugin is not None and profiles()[self.plugin].device != self.device:
            own = [p for p, x in profiles().items() if x.device == self.device]
            raise ValueError(
                f"plugin {self.plugin} runs on {profiles()[self.plugin].device}, not "
                f"{self.device}; {self.device} profiles: {', '.join(own) or 'none'} "
                f"(default {default_for(self.device) or 'none'})"
            )
        return self

    @property
    def node_hosts(self) -> list[str]:
        return [self.host] if self.host is not None else list(self.hosts or [])


class Mooncake(Strict):
    kv_port: Port = 20001
    engine_id_base: int = Field(0, ge=0)
    # vllm-ascend registers MooncakeConnectorV1 itself (vllm_ascend/distributed/kv_transfer/
    # __init__.py:29-31); vLLM 0.32 imports a given module path before its registry
    # (factory.py:106-114), so a module path is only for a connector the registry lacks.
    module_path: str | None = Field(
        None, description="kv_connector_module_path (default: none; the plugin registers it)"
    )
    connector: str = "MooncakeConnectorV1"


class KvConnector(Strict):
    kind: Literal["nixl", "mooncake"] = "nixl"
    side_channel_port: Port = Field(5600, description="VLLM_NIXL_SIDE_CHANNEL_PORT base")
    agreed_block_size: Literal["auto"] | PositiveInt = "auto"
    kv_buffer_device: Literal["auto", "cuda", "hpu", "npu", "cpu", "xpu"] = "auto"
    kv_role: Literal["split", "both"] = Field(
        "split",
        description="NIXL kv_role: 'split' = kv_producer on prefill, kv_consumer on decode "
        "(what vLLM 0.32 asks for); 'both' = kv_both everywhere, as the older seed guides "
        "write it (vLLM 0.32 logs it as deprecated)",
    )
    load_failure_policy: Literal["recompute", "fail"] | None = None
    enforce_handshake_compat: bool | None = Field(
        None, description="Default: false when prefill and decode device kinds differ"
    )
    abort_request_timeout: PositiveInt | None = Field(
        None, description="VLLM_NIXL_ABORT_REQUEST_TIMEOUT seconds"
    )
    kv_lease_duration: PositiveInt | None = Field(
        None,
        description="Seconds prefill holds KV blocks for decode to pull (vLLM default 30); "
        "raise it on slow or loaded hosts",
    )
    progress_delay_us: Literal["auto"] | ProgressDelay = Field(
        "auto",
        description="Microseconds NIXL's UCX progress thread waits in poll() between "
        "wake-ups instead of spinning a core (nixl 1.5.1 hard-codes 0, nixl_cu12/_api.py:226): "
        "pdlaunch renders a start-up shim (pdlaunch/kv/nixl_progress) that sets it. 'auto' "
        "(default): 1000 on CPU instances, off elsewhere; 0: off",
    )
    mooncake: Mooncake = Field(default_factory=Mooncake)


class Router(Strict):
    _hosts = field_validator("host", "bind")(lambda v: _check_host(v))
    kind: Literal["vllm-router", "toy-proxy"] = "vllm-router"
    host: str = "127.0.0.1"
    bind: str = "0.0.0.0"
    port: Port = 8123
    policy: Literal["round_robin", "random", "cache_aware", "power_of_two", "consistent_hash"] = (
        "round_robin"
    )
    binary: str = Field("vllm-router", description="Router executable (or toy proxy script)")
    prometheus_port: Port = Field(
        29000, description="vllm-router's metrics port (it refuses to start if taken)"
    )
    max_concurrent_requests: PositiveInt | None = None
    intra_node_data_parallel_size: PositiveInt | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: EnvMap = Field(default_factory=dict)
    container: Container | None = Field(None, description="Overrides defaults.container")

    _env = field_validator("env")(_check_env)


class Topology(Strict):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={"title": "pdlaunch topology"},
    )

    deployment: str = Field(description="Deployment name: state and script directories use it")
    model: Model
    defaults: Defaults = Field(default_factory=Defaults)
    hosts: dict[str, HostSettings] = Field(default_factory=dict)
    prefill: list[Instance] = Field(min_length=1)
    decode: list[Instance] = Field(min_length=1)
    kv_connector: KvConnector = Field(default_factory=KvConnector)
    router: Router = Field(default_factory=Router)
    slurm: SlurmSettings | None = Field(
        None,
        description="Settings of --backend slurm, the same as its flags (which override "
        "them); ignored over SSH, where `validate` says so",
    )
    accepted_warnings: dict[
        Annotated[str, StringConstraints(pattern=f"^{RULE_ID.pattern}$")],
        Annotated[str, StringConstraints(min_length=1, max_length=500)],
    ] = Field(
        default_factory=dict,
        max_length=64,
        description="Warnings this topology knows it has, by rule id, each with the reason: "
        "`validate` lists them as accepted, not as warnings (an error is never accepted; an "
        "accepted warning that no longer fires is a warning itself)",
    )
    # Derived values computed once per topology (see kvgeometry.py, ports.py); not a field.
    _derived: dict = PrivateAttr(default_factory=dict)

    def derived(self, key: str, compute: Callable[[Topology], Any]) -> Any:
        # __pydantic_private__ (pydantic's documented store of private attributes) rather
        # than self._derived: pydantic's __getattr__ costs microseconds per private read, and
        # the rules and the plan ask tens of thousands of times on a large topology.
        cache = self.__pydantic_private__["_derived"]
        if key not in cache:
            cache[key] = compute(self)
        return cache[key]

    @field_validator("hosts")
    @classmethod
    def _host_keys(cls, v: dict[str, HostSettings]) -> dict[str, HostSettings]:
        out: dict[str, HostSettings] = {}
        for name, settings in v.items():
            key = _check_host(name)
            if key in out:
                raise ValueError(f"{name!r} names the same host as another entry")
            out[key] = settings
        return out

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, v: str) -> str:
        if not NAME.fullmatch(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 63 characters)")
        return v

    def settings_of(self, host: str) -> HostSettings:
        """`hosts:` settings of a node, keyed by the address as written (in any spelling of
        that one address), never by "same machine": SSH settings for 127.0.0.30 (a stand-in
        for another host) must not reach a router on 127.0.0.1, nor those of `localhost` one
        on 127.0.0.2."""
        key = self.settings_key(host)
        return self.hosts[key] if key is not None else HostSettings()

    def settings_key(self, host: str) -> str | None:
        """The `hosts:` key (as the user wrote it) whose settings apply to ``host``, if any:
        what a finding about a host setting points at."""
        if host in self.hosts:
            return host
        if not self.hosts:
            return None
        key = address_key(host)
        return next((h for h in self.hosts if address_key(h) == key), None)

    def kv_address(self, host: str) -> str:
        """The address peers dial for KV on this node (VLLM_NIXL_SIDE_CHANNEL_HOST)."""
        return self.settings_of(host).address or host

    def vllm_version_of(self, inst: Instance) -> str:
        """The vLLM release an instance runs: its own, else the model's."""
        return inst.vllm_version or self.model.vllm_version

    def instances(self) -> tuple[tuple[Role, int, Instance], ...]:
        """Every instance, prefill first. Built once (the rules walk it hundreds of times on
        a large topology); a tuple, so no caller can change what the next one sees."""
        return self.derived(
            "instances",
            lambda t: tuple(
                [("prefill", i, x) for i, x in enumerate(t.prefill)]
                + [("decode", i, x) for i, x in enumerate(t.decode)]
            ),
        )


def instance_name(role: Role, index: int, inst: Instance) -> str:
    return inst.name or f"{role}-{index}"
