"""Values from a topology reach the process byte for byte and never run as shell code;
secrets are never written into rendered files.

The rendered script is executed with a fake `vllm` first on PATH that records the argv and
environment it received.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import render_plan, write_files
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load

FAKE = """#!{python}
import json, os, sys
with open(os.environ["PDLAUNCH_FAKE_OUT"], "w", encoding="utf-8") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
"""

NASTY = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; echo '",
    '"; touch PWNED; echo "',
    "a;touch PWNED",
    "line1\ntouch PWNED\nline3",
    "${HOME}",
    "$HOME",
    "\\$(touch PWNED)\\",
    'it\'s "quoted" $(touch PWNED) `touch PWNED` ; ${HOME}\n#',
]
MODEL = "org/m$(touch PWNED)`touch PWNED`'\"; touch PWNED\n${HOME}"
ENV = {f"NASTY_{i}": v for i, v in enumerate(NASTY)}
# Real vLLM 0.32 string flags (validate refuses unknown ones); repeating one only warns.
EXTRA = [f"--chat-template={v}" for v in NASTY] + [w for v in NASTY for w in ("--download-dir", v)]


def topology(tmp_path: Path, **defaults_env: str) -> dict:
    return {
        "deployment": "inject",
        "model": {"name": MODEL, "served_name": "served " + NASTY[0]},
        "defaults": {
            "work_dir": str(tmp_path / "work"),
            "env": {**ENV, **defaults_env},
            "extra_args": EXTRA,
        },
        "prefill": [{"host": "127.0.0.1", "device": "cpu", "port": 8100, "bind": "127.0.0.1"}],
        "decode": [{"host": "127.0.0.1", "device": "cpu", "port": 8200, "bind": "127.0.0.1"}],
        "router": {"host": "127.0.0.1", "bind": "127.0.0.1"},
    }


def render(data: dict, tmp_path: Path) -> tuple[list[Path], object]:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    topo, source = load(path)
    findings = validate(topo, source)
    assert not has_errors(findings), [f.message for f in findings]
    plan = build_plan(topo)
    return write_files(render_plan(plan), tmp_path / "out"), plan


@pytest.fixture
def sandbox(tmp_path: Path) -> dict[str, Path]:
    dirs = {name: tmp_path / name for name in ("bin", "cwd", "home")}
    for d in dirs.values():
        d.mkdir()
    fake = dirs["bin"] / "vllm"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    return dirs


def run(script: Path, sandbox: dict[str, Path], **env: str) -> subprocess.CompletedProcess:
    out = sandbox["cwd"] / "ran.json"
    out.unlink(missing_ok=True)
    base = {
        "PATH": f"{sandbox['bin']}:/usr/bin:/bin",
        "HOME": str(sandbox["home"]),
        "PDLAUNCH_FAKE_OUT": str(out),
    }
    return subprocess.run(
        [str(script)],
        env={**base, **env},
        cwd=sandbox["cwd"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def ran(sandbox: dict[str, Path]) -> dict:
    return json.loads((sandbox["cwd"] / "ran.json").read_text(encoding="utf-8"))


def no_pwned(*dirs: Path) -> None:
    for d in dirs:
        assert not list(d.rglob("PWNED")), f"a value ran as shell code in {d}"


def test_values_arrive_byte_identical_and_never_execute(tmp_path, sandbox):
    files, _ = render(topology(tmp_path), tmp_path)
    scripts = [p for p in files if p.name in ("prefill-0.sh", "decode-0.sh")]
    assert len(scripts) == 2
    for script in scripts:
        proc = run(script, sandbox)
        assert proc.returncode == 0, proc.stderr
        got = ran(sandbox)
        argv, env = got["argv"], got["env"]
        assert argv[:2] == ["serve", MODEL]
        assert argv[argv.index("--served-model-name") + 1] == "served " + NASTY[0]
        # extra_args come last, in order, untouched.
        assert argv[-len(EXTRA) :] == EXTRA
        for key, value in ENV.items():
            assert env[key] == value, key
        no_pwned(sandbox["cwd"], sandbox["home"], tmp_path / "out", Path.cwd())


def test_secret_is_never_rendered(tmp_path, sandbox, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "supersecret")
    files, plan = render(topology(tmp_path, HF_TOKEN="${env:HF_TOKEN}"), tmp_path)
    for path in files:
        assert "supersecret" not in path.read_text(encoding="utf-8"), path.name
    assert "supersecret" not in json.dumps(plan.model_dump(mode="json"))
    script = tmp_path / "out" / "prefill-0.sh"

    # Missing: the script refuses to start and names the variable; vllm never runs.
    proc = run(script, sandbox)
    assert proc.returncode != 0
    assert "HF_TOKEN" in proc.stderr
    assert not (sandbox["cwd"] / "ran.json").exists()

    # Exported by the caller: passed through unchanged.
    proc = run(script, sandbox, HF_TOKEN="supersecret")
    assert proc.returncode == 0, proc.stderr
    assert ran(sandbox)["env"]["HF_TOKEN"] == "supersecret"

    # Or from the mode-0600 secrets file `pdlaunch up` writes beside the script.
    proc_plan = next(p for p in plan.processes if p.name == "prefill-0")
    secrets = Path(proc_plan.secrets_path)
    assert secrets.is_relative_to(tmp_path)
    secrets.parent.mkdir(parents=True, exist_ok=True)
    secrets.write_text("HF_TOKEN=from-file\n", encoding="utf-8")
    # A secrets file others could have written (group/world-writable, or readable) is refused
    # before it is sourced: it would run their shell code with the engine's rights.
    secrets.chmod(0o620)
    proc = run(script, sandbox)
    assert proc.returncode == 96 and "refusing" in proc.stderr, proc.stderr
    secrets.chmod(0o600)
    proc = run(script, sandbox)
    assert proc.returncode == 0, proc.stderr
    assert ran(sandbox)["env"]["HF_TOKEN"] == "from-file"
    no_pwned(sandbox["cwd"], sandbox["home"])
