"""Holes `validate` must close, as properties over every spelling: each managed flag of the
real vLLM parser and each derived variable of each device kind is refused in every scope, and
the flag verdicts agree with vLLM's own parsers. Cases as in test_validate_holes.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdlaunch.plan.build import build_plan
from pdlaunch.plan.env import VISIBLE_DEVICE_VARS, managed_env
from pdlaunch.plan.ports import all_nodes
from pdlaunch.rules.args import MANAGED_VLLM
from pdlaunch.spec import facts
from pdlaunch.spec.load import LoadError, load_text
from tests.rules.validate_cases import (
    MANAGED_SPELLINGS,
    MARK,
    NODE1_ADDRESS,
    ROUTER_MANAGED,
    args_block,
    doc,
    env_block,
    finding,
    no_errors,
    run_rules,
)

# ---------------------------------------------------------------------------------------------
# 8. Property: every spelling argparse/vLLM reads as a managed flag is refused, and every
#    derived variable of every device kind is refused in every env scope.

VLLM = facts.vllm()
ALL_OPTIONS = sorted(VLLM.by_option)
# A value each managed flag accepts and that differs from its default.
VALUES = {
    "model": "x",
    "tokenizer": "x",
    "served_model_name": "x",
    "dtype": "half",
    "kv_cache_dtype": "fp8",
    "max_model_len": "128",
    "host": "1.2.3.4",
    "port": "9000",
    "block_size": "32",
    "kv_transfer_config": '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
    "tensor_parallel_size": "2",
    "data_parallel_size": "2",
    "data_parallel_size_local": "2",
    "data_parallel_address": "1.2.3.4",
    "data_parallel_start_rank": "1",
    "data_parallel_rpc_port": "1234",
    "gpu_memory_utilization": "0.5",
}
MANAGED_OPTIONS = [
    (dest, opt)
    for dest in MANAGED_VLLM
    # --config makes the real parser read a YAML file: tested on its own below.
    if dest != "config" and (flag := VLLM.flag(dest)) is not None
    for opt in flag.options
]


def single_dash_abbreviations() -> list[tuple[str, str, str]]:
    """(dest, option, prefix): argparse also abbreviates a multi-character single-dash option
    (`-t` for `-tp`) when the prefix matches no other single-dash option."""
    out = []
    for dest, opt in MANAGED_OPTIONS:
        if opt.startswith("--"):
            continue
        for n in range(2, len(opt)):
            hits = [o for o in ALL_OPTIONS if o.startswith(opt[:n]) and not o.startswith("--")]
            if hits == [opt]:
                out.append((dest, opt, opt[:n]))
    return out


@pytest.mark.parametrize("dest, option, prefix", single_dash_abbreviations(), ids=lambda v: str(v))
def test_single_dash_abbreviation_is_a_managed_flag(real_vllm, dest, option, prefix):
    # Found while writing this file: vLLM reads `-t 2` as `-tp 2`; pdlaunch calls `-t` an
    # unknown flag ("exits with 'unrecognized arguments'"), so the rule and message are wrong.
    words = [prefix, VALUES[dest]] if VLLM.flag(dest).takes_value else [prefix]
    if real_vllm is not None:
        assert dest in real_vllm(["m", *words])[1]
    f = finding(doc(prefill=args_block(words, 0)), "managed-flag", ("prefill", 0, "extra_args", 0))
    assert MANAGED_VLLM[dest] in f.fix


def test_every_managed_destination_has_options_and_values():
    dests = {d for d, _ in MANAGED_OPTIONS}
    assert dests == set(MANAGED_VLLM) - {"model_tag", "config"}
    for dest in dests:
        flag = VLLM.flag(dest)
        assert not flag.takes_value or dest in VALUES, dest


def unique_prefix_lengths(option: str) -> list[int]:
    """Lengths L < len(option) whose prefix selects only this option (argparse abbrev)."""
    out = []
    for n in range(3, len(option)):
        hits = [o for o in ALL_OPTIONS if o.startswith(option[:n])]
        if hits == [option]:
            out.append(n)
    return out


@st.composite
def spelled(draw, dest: str, option: str) -> list[str]:
    flag = VLLM.flag(dest)
    name = option
    if option.startswith("--"):
        lengths = unique_prefix_lengths(option)
        if lengths and draw(st.booleans()):
            name = option[: draw(st.sampled_from(lengths))]
        dashes = [i for i, c in enumerate(name) if c == "-" and i >= 2]
        swap = draw(st.sets(st.sampled_from(dashes))) if dashes else set()
        name = "".join("_" if i in swap else c for i, c in enumerate(name))
    if not flag.takes_value:
        return [name]
    value = VALUES[dest]
    return [f"{name}={value}"] if draw(st.booleans()) else [name, value]


@pytest.fixture(scope="module")
def real_vllm():
    """vLLM 0.32's own `vllm serve` parser, built once, recording every dest it stores
    (None where vLLM is not installed: the pdlaunch half of the property still runs)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return None
    from tests.fidelity.judge import _recording, _vllm_parser

    top, sub = _vllm_parser()
    stored: list[str] = []
    _recording(sub, stored)
    default = top.parse_args(["serve", "m"])

    def parse(argv: list[str]):
        stored.clear()
        ns = top.parse_args(["serve", *argv])
        return ns, list(stored), default

    return parse


@pytest.mark.parametrize("dest, option", MANAGED_OPTIONS, ids=[o for _, o in MANAGED_OPTIONS])
@settings(max_examples=12, deadline=None, database=None)
@given(data=st.data())
def test_property_managed_flag_spellings(real_vllm, dest, option, data):
    words = data.draw(spelled(dest, option), label="spelling")
    scope = data.draw(st.sampled_from(["defaults", "prefill", "decode"]), label="scope")
    argv = ["--seed=1", *words]
    if scope == "defaults":
        text, field = doc(defaults=args_block(argv, 1, indent=2)), ("defaults", "extra_args", 1)
    else:
        text, field = doc(**{scope: args_block(argv, 1)}), (scope, 0, "extra_args", 1)
    f = finding(text, "managed-flag", field)
    assert MANAGED_VLLM[dest] in f.fix

    # Cross-check: vLLM's real parser reads this spelling as the same destination.
    if real_vllm is None:
        return
    if dest == "model":
        # FlexibleArgumentParser moves `--model X` to the positional model tag.
        ns, stored, _ = real_vllm(words)
        assert ns.model_tag == VALUES["model"]
        return
    ns, stored, default = real_vllm(["m", *words])
    assert dest in stored, (words, stored)
    if VLLM.flag(dest).takes_value:
        assert getattr(ns, dest) != getattr(default, dest), (words, getattr(ns, dest))


def test_flag_verdicts_match_the_real_parsers(real_vllm):
    """What pdlaunch accepts or refuses above, vLLM 0.32 and vllm-router 0.1.17 do too."""
    if real_vllm is None:
        pytest.skip("vLLM is not installed")
    import argparse
    import contextlib
    import io

    def exits(parse, argv) -> bool:
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                parse(argv)
            except SystemExit:
                return True
        return False

    ns, stored, _ = real_vllm(["m", "--max-num-seq", "8"])
    assert ns.max_num_seqs == 8 and "max_num_seqs" in stored
    assert exits(real_vllm, ["m", "--max-numseqs", "8"])
    assert exits(real_vllm, ["m", "--swap-space", "16"])
    for words, dest in MANAGED_SPELLINGS:
        if dest != "model":
            assert dest in real_vllm(["m", *words])[1], words

    from vllm_router.router_args import RouterArgs

    router = argparse.ArgumentParser()
    RouterArgs.add_cli_args(router, use_router_prefix=False)
    assert exits(router.parse_args, ["--max_concurrent_requests", "5"])
    for words, dest in ROUTER_MANAGED:
        ns, default = router.parse_args(words), router.parse_args([])
        assert getattr(ns, dest) != getattr(default, dest), words


def managed_topology(kind: str) -> str:
    if kind == "npu":
        return doc(p_dev="npu", d_dev="npu", kind="mooncake")
    if kind == "cpu":
        return (
            doc(
                p_host="127.0.0.1", d_host="127.0.0.1", r_host="127.0.0.1", p_dev="cpu", d_dev="cpu"
            )
            .replace("    port: 8100\n", "    port: 8100\n    bind: 127.0.0.1\n")
            .replace("    port: 8200\n", "    port: 8200\n    bind: 127.0.0.1\n")
        )
    if kind == "mixed":
        return doc(d_dev="hpu")
    return doc(p_dev=kind, d_dev=kind)


KINDS = ["cuda", "hpu", "npu", "cpu", "mixed"]


def managed_vars(kind: str) -> list[str]:
    topo, _ = load_text(managed_topology(kind))
    out: set[str] = set()
    for node in all_nodes(topo):
        out |= set(managed_env(topo, node))
    return sorted(out)


MANAGED_VARS = [(k, v) for k in KINDS for v in managed_vars(k)]


@pytest.mark.parametrize("kind", KINDS)
def test_managed_env_topologies_are_valid_and_cover_the_pinning_vars(kind):
    no_errors(managed_topology(kind))
    names = set(managed_vars(kind))
    assert names >= VISIBLE_DEVICE_VARS and "LD_LIBRARY_PATH" in names
    if kind != "npu":
        assert {"VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST"} <= names
    if kind == "cpu":
        assert {"VLLM_CPU_OMP_THREADS_BIND", "UCX_NET_DEVICES"} <= names


@pytest.mark.parametrize("kind, var", MANAGED_VARS, ids=[f"{k}-{v}" for k, v in MANAGED_VARS])
@settings(max_examples=6, deadline=None, database=None)
@given(
    scope=st.sampled_from(["defaults", "hosts", "prefill", "decode"]),
    value=st.text("abcXYZ019,:/._-", min_size=0, max_size=10),
)
def test_property_managed_env(kind, var, scope, value):
    base = managed_topology(kind)
    topo, _ = load_text(base)
    # A harmless variable first, so the managed one is not the first key.
    env = {"HF_HOME": "/data", var: value}
    if scope == "defaults":
        text, path = (
            base.replace("  work_dir: /tmp/pd\n", "  work_dir: /tmp/pd\n" + env_block(env, var, 2)),
            ("defaults", "env", var),
        )
    elif scope == "hosts":
        host = topo.decode[0].host
        text = base.replace(
            "prefill:\n", f"hosts:\n  {host}:\n" + env_block(env, var) + "prefill:\n", 1
        )
        path = ("hosts", host, "env", var)
    else:
        marker = "    port: 8100\n" if scope == "prefill" else "    port: 8200\n"
        text = base.replace(marker, marker + env_block(env, var), 1)
        path = (scope, 0, "env", var)
    f = finding(text, "managed-env", path)
    assert f.fix.startswith("remove it from env")


def test_config_file_flag_is_managed():
    """`--config FILE` loads flags from a YAML vLLM reads at start; it could set what the plan
    leaves to vLLM's default (an unpinned --block-size) behind every rule."""
    _, found = run_rules(
        "deployment: t\nmodel: {name: m}\n"
        "prefill: [{host: 10.0.0.1, device: cuda, port: 8100, extra_args: [--config=x.yaml]}]\n"
        "decode: [{host: 10.0.0.2, device: cuda, port: 8200}]\nrouter: {host: 10.0.0.3}\n"
    )
    (f,) = [f for f in found if f.rule == "managed-flag"]
    assert f.field == ("prefill", 0, "extra_args", 0) and "extra_args" in f.fix


def test_a_named_host_is_resolved_on_the_node_and_an_address_wins():
    # The GB200 guide exports VLLM_NIXL_SIDE_CHANNEL_HOST=$(hostname -i) on each node: a name
    # without `address:` is resolved by the node's script at start (plan/node_addr.py).
    named = doc(p_host="gaudi-node-1", d_host="gaudi-node-2", r_host="gaudi-node-1")
    no_errors(named)
    topo, _ = load_text(named, "t.yaml")
    plan = build_plan(topo)
    for p in [*plan.by_role("prefill"), *plan.by_role("decode")]:
        assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "{pdlaunch:PDLAUNCH_NODE_ADDR}"
        assert p.node_addr is not None and p.node_addr.name == p.host == p.kv_host
        assert p.node_addr.peers_elsewhere  # a loopback answer is refused at start
    assert plan.router.node_addr is None
    with_address = doc(p_host="gaudi-node-1", hosts=NODE1_ADDRESS % "gaudi-node-1")
    no_errors(with_address)
    topo, _ = load_text(with_address, "t.yaml")
    p = build_plan(topo).by_role("prefill")[0]
    assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == p.kv_host == "10.0.0.9"
    assert p.node_addr is None
    assert p.host == "gaudi-node-1"  # SSH and HTTP keep the name
    # Every engine on one machine: a loopback answer reaches them all.
    one = doc(p_host="box", d_host="Box.", r_host="box", decode="    devices: [1]\n")
    no_errors(one)
    topo, _ = load_text(one, "t.yaml")
    assert not any(p.node_addr.peers_elsewhere for p in build_plan(topo).processes if p.node_addr)
    # Mooncake has no NIXL side channel.
    no_errors(
        doc(p_host="npu-node-1", d_host="npu-node-2", p_dev="npu", d_dev="npu", kind="mooncake")
    )


def test_a_loopback_side_channel_address_with_peers_elsewhere_is_refused():
    # An explicit address is used as written: loopback cannot be dialled from another machine.
    hosts = f"hosts:\n  gaudi-node-1:\n    address: 127.0.0.1  {MARK}\n"
    text = doc(p_host="gaudi-node-1", hosts=hosts)
    f = finding(text, "side-channel-host", ("hosts", "gaudi-node-1", "address"))
    assert "loopback" in f.message and "hosts.gaudi-node-1.address" in f.fix
    # A loopback name resolves to loopback on every node: refused where peers are elsewhere
    # (a decode on localhost, dialled by the prefill in 0.32's push mode), once per field.
    text = doc(p_host="10.0.0.1", d_host=f"localhost  {MARK}", r_host="localhost")
    f = finding(text, "side-channel-host", ("decode", 0, "host"))
    assert "loopback" in f.message and "network name" in f.fix
    _, found = run_rules(doc(p_host="localhost", d_host="10.0.0.2", r_host="10.0.0.3"))
    assert [f.rule for f in found if f.field == ("prefill", 0, "host")] == ["router-reach"] * 2
    # On one machine it reaches every peer.
    no_errors(doc(p_host="127.0.0.2", d_host="127.0.0.3", r_host="127.0.0.1",
                  decode="    devices: [1]\n",
                  hosts="hosts:\n  127.0.0.2:\n    address: 127.0.0.5\n"))  # fmt: skip


def test_host_address_must_be_an_ip():
    with pytest.raises(LoadError) as info:
        load_text(doc(hosts="hosts:\n  10.0.0.1:\n    address: gaudi-node-1\n"), "t.yaml")
    assert "not an IP address" in info.value.problems[0].message


@pytest.mark.parametrize("path", ["./Qwen3-8B", "../models/q", "~/models/q", "data/models/q"])
def test_relative_model_path_is_refused(path):
    # The shipped Ascend example's ./Qwen3-8B: engines start in <work_dir>/<deployment>.
    f = finding(doc(model=f"  tokenizer: {path}  {MARK}\n"), "model-path", ("model", "tokenizer"))
    assert "absolute" in f.fix
    text = doc(prefill=f"    model_path: {path}  {MARK}\n", model="  served_name: q\n")
    finding(text, "model-path", ("prefill", 0, "model_path"))


def test_hub_ids_and_absolute_paths_are_not_relative():
    no_errors(doc(model="  tokenizer: Qwen/Qwen3-8B\n"))
    no_errors(doc(prefill="    model_path: /data/m\n", model="  served_name: q\n"))


def test_plugin_release_env_is_known_per_profile():
    # VLLM_ASCEND_ENABLE_DBO is read by the Ascend guide's 2025-09 build (vllm_ascend/envs.py
    # at af62af3c) and no longer by 0.23.0.post1 (the npu default).
    var = "VLLM_ASCEND_ENABLE_DBO"
    base = {"p_dev": "npu", "d_dev": "npu", "kind": "mooncake"}
    text = doc(**base, prefill=env_block({var: "1"}, var))
    finding(text, "unknown-env", ("prefill", 0, "env", var), severity="warning")
    pinned = doc(**base, prefill="    plugin: vllm-ascend@2025-09\n" + env_block({var: "1"}, None))
    assert "unknown-env" not in {f.rule for f in no_errors(pinned)}
