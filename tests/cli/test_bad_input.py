"""Bad input gets a clear message with file:line and field, the right exit code, and never
a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdlaunch.cli import app
from pdlaunch.cli.spec import PORT_LABELS, compact_ranges
from tests.support.example_text import local_cpu_warning_text

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "topologies" / "local-cpu.yaml"
runner = CliRunner()

GOOD = LOCAL.read_text()


def run(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def write(tmp_path: Path, text: str | bytes) -> Path:
    p = tmp_path / "t.yaml"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_valid_exit_0_and_json():
    r = run("validate", str(LOCAL), "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["valid"] is True


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "no such file"),
        ("", "empty"),
        ("deployment: [\n", "invalid YAML"),
        (b"\x00\x01\x02binary", "binary"),
        (b"\xff\xfe bad utf8", "UTF-8"),
        ("- just\n- a list\n", "mapping"),
    ],
)
def test_unreadable_input_exit_2(tmp_path, content, expected):
    path = tmp_path / "missing.yaml" if content is None else write(tmp_path, content)
    r = run("validate", str(path))
    assert r.exit_code == 2
    assert expected in r.output


def test_directory_exit_2(tmp_path):
    r = run("validate", str(tmp_path))
    assert r.exit_code == 2 and "directory" in r.output


@pytest.mark.parametrize(
    "old, new, line, field, words",
    [
        (
            "    port: 8200",
            "    port: 8200\n    blocksize: 32",
            2,
            "decode[0].blocksize",
            "unknown key",
        ),
        ("    port: 8200", "    port: 70000", 1, "decode[0].port", "65535"),
        ("    port: 8100", "    port: -1", 1, "prefill[0].port", "greater than"),
        ("    port: 8100", "    port: 8100\n    tp: 0", 2, "prefill[0].tp", "greater than"),
        ("    port: 8100", "    port: eighty", 1, "prefill[0].port", "integer"),
        (
            "    device: cpu\n    port: 8200",
            "    device: gpu\n    port: 8200",
            1,
            "decode[0].device",
            "'cuda'",
        ),
    ],
)
def test_schema_errors_name_line_and_field(tmp_path, old, new, line, field, words):
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    # `line` counts from the first line of the replacement text.
    line += text[: text.index(new)].count("\n")
    path = write(tmp_path, text)
    r = run("validate", str(path))
    assert r.exit_code == 2
    assert f"{path}:{line} {field}" in r.output, r.output
    assert words in r.output


def test_duplicate_key_is_an_error(tmp_path):
    text = GOOD.replace("    port: 8100", "    port: 8100\n    port: 8101", 1)
    line = text[: text.index("    port: 8101")].count("\n") + 1
    path = write(tmp_path, text)
    r = run("validate", str(path))
    assert (
        r.exit_code == 2
        and "given twice" in r.output
        and f"{path}:{line} prefill[0].port" in r.output
    )


def test_rule_findings_exit_1_with_table(tmp_path):
    path = write(tmp_path, GOOD.replace("port: 8200", "port: 8100"))
    r = run("validate", str(path))
    assert r.exit_code == 1
    assert "port-conflict" in r.output and "nothing was started" in r.output
    r = run("validate", str(path), "--json")
    found = json.loads(r.stdout)["findings"]
    line = GOOD[: GOOD.index("port: 8200")].count("\n") + 1
    assert found[0]["rule"] == "port-conflict" and found[0]["line"] == line


def test_duplicate_instance_names(tmp_path):
    text = GOOD.replace("    port: 8200", "    port: 8200\n    name: prefill-0", 1)
    r = run("validate", str(write(tmp_path, text)))
    assert r.exit_code == 1 and "unique-names" in r.output


def test_render_writes_scripts_and_is_byte_stable(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("render", str(LOCAL), "-o", str(a)).exit_code == 0
    assert run("render", str(LOCAL), "-o", str(b)).exit_code == 0
    names = sorted(p.name for p in a.iterdir())
    assert names == ["decode-0.sh", "index.md", "plan.json", "prefill-0.sh", "router.sh"]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "prefill-0.sh").stat().st_mode & 0o111


def test_render_refuses_file_as_output(tmp_path):
    target = write(tmp_path, "x")
    r = run("render", str(LOCAL), "-o", str(target))
    assert r.exit_code == 2


def test_render_invalid_topology_writes_nothing(tmp_path):
    path = write(tmp_path, GOOD.replace("port: 8200", "port: 8100"))
    out = tmp_path / "out"
    assert run("render", str(path), "-o", str(out)).exit_code == 1
    assert not out.exists()


def test_plan_json_lists_every_process():
    r = run("plan", str(LOCAL), "--json")
    data = json.loads(r.stdout)
    assert [p["name"] for p in data["processes"]] == ["prefill-0", "decode-0", "router"]


def test_schema_is_json_schema_forbidding_unknown_keys():
    r = run("schema")
    schema = json.loads(r.stdout)
    assert schema["additionalProperties"] is False
    assert "prefill" in schema["required"]


def test_committed_schema_is_current():
    # topologies/*.yaml point yaml-language-server at it; regenerate with
    # `pdlaunch schema > pdlaunch.schema.json`.
    committed = json.loads((ROOT / "pdlaunch.schema.json").read_text())
    assert committed == json.loads(run("schema").stdout)


# -- `plan` in an 80-column terminal ----------------------------------------------------------
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))


@pytest.mark.parametrize(
    "ports, expected",
    [
        ([5600, 5601, 5602, 5603], "5600-5603"),
        ([5603, 5600, 5602, 5601], "5600-5603"),
        ([5600, 5601, 5603, 8100, 8101], "5600-5601,5603,8100-8101"),
        ([8100], "8100"),
        ([8100, 8100], "8100"),
        ([], ""),
    ],
)
def test_compact_ranges(ports, expected):
    assert compact_ranges(ports) == expected


def _expand(ranges: str) -> set[int]:
    ports: set[int] = set()
    for part in ranges.split(","):
        a, _, b = part.partition("-")
        ports.update(range(int(a), int(b or a) + 1))
    return ports


def _plan_in_80_columns(path: Path) -> str:
    # A real process with COLUMNS=80: the consoles read the width when they are created.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [sys.executable, "-m", "pdlaunch", "plan", str(path)],
        env={**env, "COLUMNS": "80", "TERM": "xterm-256color", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def _ports_shown(text: str) -> dict[tuple[str, str], set[int]]:
    """{(process, port label): ports} read back from `plan`'s port lines."""
    shown: dict[tuple[str, str], set[int]] = {}
    process = ""
    for line in text.splitlines():
        if line and not line.startswith(" "):
            process = line.split()[0]
        words = line.split()
        if words[:1] == ["ports"]:
            words = words[1:]
        if line.startswith("  ") and len(words) == 2 and words[0][0].isdigit():
            shown[(process, words[1])] = _expand(words[0])
    return shown


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.name)
def test_plan_fits_80_columns_with_every_port(path):
    text = _plan_in_80_columns(path)
    too_long = [line for line in text.splitlines() if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    # Every planned port is shown once, under its kind: nothing was lost by compacting.
    plan = json.loads(run("plan", str(path), "--json").stdout)
    expected: dict[tuple[str, str], set[int]] = {}
    for p in plan["processes"]:
        for port in p["ports"]:
            key = (p["name"], PORT_LABELS[port["kind"]])
            expected.setdefault(key, set()).add(port["port"])
    assert _ports_shown(text) == expected


def test_plan_multi_rank_side_channel_is_one_line():
    text = _plan_in_80_columns(ROOT / "topologies" / "gb200-xpyd.yaml")
    lines = [line.strip() for line in text.splitlines()]
    # GB200 guide: DP 8 over two nodes, 4 local ranks each, side channel 5600 + DP rank.
    assert "ports  8087 http" in lines
    assert "5600-5603 nixl" in lines and "5604-5607 nixl" in lines
    assert "13345 dp_rpc" in lines
    assert len(text.splitlines()) < 60


def test_plan_json_keeps_argv_and_env():
    data = json.loads(run("plan", str(ROOT / "topologies" / "gb200-xpyd.yaml"), "--json").stdout)
    prefill = data["processes"][0]
    assert prefill["argv"][:2] == ["vllm", "serve"]
    assert prefill["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert [p["kind"] for p in prefill["ports"]].count("nixl_side_channel") == 4


def test_export_k8s_writes_manifests_and_refuses_a_bad_topology(tmp_path):
    out_dir = tmp_path / "k8s"
    res = runner.invoke(
        app, ["export", "k8s", str(ROOT / "topologies" / "gb200-xpyd.yaml"), "-o", str(out_dir)]
    )
    assert res.exit_code == 0, res.output
    written = sorted(p.name for p in out_dir.iterdir())
    assert "03-disaggregatedset-gb200-xpyd.yaml" in written and "index.md" in written
    bad = tmp_path / "bad.yaml"
    text = (ROOT / "topologies" / "gb200-xpyd.yaml").read_text()
    bad.write_text(text.replace("deployment:", "deployment: x\nbogus_key: 1\n#", 1))
    res = runner.invoke(app, ["export", "k8s", str(bad), "-o", str(tmp_path / "none")])
    assert res.exit_code != 0
    assert not (tmp_path / "none").exists()


def test_up_canary_scope_other_than_all_or_router_is_exit_2_before_anything_runs(tmp_path):
    # Without its accepted_warnings the example warns (cpu-budget) when it is validated.
    path = write(tmp_path, local_cpu_warning_text())
    res = run("up", str(path), "--canary-scope", "pairs")
    assert res.exit_code == 2, res.output
    assert "--canary-scope 'pairs': expected all or router" in res.output
    assert "[cpu-budget]" not in res.output  # refused before the topology is validated
