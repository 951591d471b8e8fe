"""The fixed-list proxies' recorded parsers (pdlaunch/spec/proxies.py,
pdlaunch/spec/facts/proxies.json): they take what the scripts' argparse takes and refuse what
it refuses, and the argv the plan gives every shipped example's proxy passes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pdlaunch.plan.build import build_plan
from pdlaunch.spec import proxies
from pdlaunch.spec.load import load
from tests.fidelity.judge import PROXY_FLAGS

ROOT = Path(__file__).resolve().parents[2]
PROXIED = ["ascend-mooncake-tp2", "cuda-prefill-gaudi-decode", "gaudi-prefill-cuda-decode"]


@pytest.mark.parametrize("name", PROXIED)
def test_the_planned_proxy_argv_passes_its_scripts_parser(name: str):
    plan = build_plan(load(ROOT / "topologies" / f"{name}.yaml")[0])
    facts = proxies.facts_for(plan.router.argv)
    assert facts is not None
    _, args = proxies.split_launcher(plan.router.argv)
    values = proxies.parse(facts, args)
    assert values["port"] == plan.router.ports[0].port
    assert plan.router.health_url.endswith(facts.health)


def test_every_script_reads_the_flags_pdlaunch_renders_and_names_its_source():
    for name in proxies.known():
        facts = proxies.facts_for([f"/x/{name}"])
        flags = {f for o in facts.options for f in o["flags"]}
        assert flags >= PROXY_FLAGS, name
        # A commit and file:line ranges to read them at.
        assert re.search(r"[0-9a-f]{40}", facts.source) and re.search(r":\d+-\d+", facts.source)
        assert facts.path.endswith(name) and facts.plugin in {"vllm-gaudi", "vllm-ascend"}


def test_the_recorded_parsers_refuse_what_the_scripts_refuse():
    toy = proxies.facts_for(["python", "/x/toy_proxy_server.py"])
    ascend = proxies.facts_for(["/x/load_balance_proxy_server_example.py"])
    assert toy and ascend and proxies.facts_for(["python", "/x/other.py"]) is None
    ok = ["--port", "1", "--prefiller-hosts", "a", "b", "--prefiller-ports", "1", "2"]
    assert proxies.parse(toy, ok)["prefiller_ports"] == [1, 2]
    # The toy proxy's singular spellings; vllm-ascend's parser takes them as argparse takes
    # any unambiguous prefix, and refuses an ambiguous one as the script would.
    for facts in (toy, ascend):
        got = proxies.parse(facts, ["--decoder-host", "d", "--decoder-port", "3"])
        assert got == {"decoder_hosts": ["d"], "decoder_ports": [3]}
    with pytest.raises(proxies.ProxyArgError, match="ambiguous"):
        proxies.parse(ascend, ["--decoder", "d"])
    with pytest.raises(proxies.ProxyArgError, match="invalid int"):
        proxies.parse(toy, ["--port", "http"])
    with pytest.raises(proxies.ProxyArgError, match="as many prefiller_hosts as prefiller_ports"):
        proxies.parse(toy, ["--prefiller-hosts", "a", "b", "--prefiller-ports", "1"])
    with pytest.raises(proxies.ProxyArgError, match="unrecognized"):
        proxies.parse(toy, ["--max-retries", "3"])
    assert proxies.unparse(ascend, {"retry_delay": 0.5, "port": 9}) == [
        "--port", "9", "--retry-delay", "0.5"
    ]  # fmt: skip
