"""Per-vendor facts as data: adding an accelerator is one entry here.

Rules read these to judge a topology; the plan reads them to derive env and flags.
Each fact names where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    # registered by NIXL; device-to-device keeps transfers off host bounce buffers.
    "UCX_MEMTYPE_CACHE": "0",
    "VLLM_NIXL_DEVICE_TO_DEVICE": "1",
}

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
        env=NIXL_NODE_ENV,
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
        # CPU attention packs K/V in its own tiles: the KV extension cannot re-block them.
        can_reblock=False,
        layout_env=False,
        source="vllm/v1/attention/backends/cpu_attn.py; shared/notes/kv-extension.md",
    ),
}


def profile(kind: str) -> DeviceProfile:
    return PROFILES[kind]
