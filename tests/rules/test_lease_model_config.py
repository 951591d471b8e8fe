"""The lease rule reads the model's config.json on this host: bounded (issue 32). A FIFO there
must not hang `validate`, /dev/zero or a 1 GiB file must not be read whole, deep nesting,
Infinity or 1e999 must not give a traceback, and dimensions no model has must not overflow
the rule's float math: each is one warning naming the file and the bound, or silence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app
from tests.support import hostile_files

LLAMA_70B = {  # the geometry of a 70B GQA model's config.json (as tests/kv/test_kv_lease.py)
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}


def _topology(tmp_path: Path) -> tuple[Path, Path]:
    """A topology whose lease rule reads model/config.json (NIXL, max_model_len set)."""
    model = tmp_path / "model"
    model.mkdir()
    data = {
        "deployment": "t",
        "model": {"name": str(model), "max_model_len": 131072},
        "prefill": [{"host": "10.0.0.1", "device": "cuda", "port": 8100}],
        "decode": [{"host": "10.0.0.2", "device": "cuda", "port": 8200}],
        "router": {"host": "10.0.0.3"},
        "kv_connector": {"kind": "nixl"},
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, model


def _lease_findings(path: Path) -> tuple[int, list[dict]]:
    res = CliRunner().invoke(app, ["validate", str(path), "--json"])
    assert "Traceback" not in res.output and not isinstance(res.exception, RecursionError)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    findings = json.loads(res.stdout)["findings"]
    return res.exit_code, [f for f in findings if f["rule"] == "kv-lease-budget"]


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("fifo", "is not a regular file (a FIFO)"),
        ("dev-zero", "is not a regular file (a character device)"),
        ("sparse-1gib", "at most 4,194,304 are read"),
        ("deep", "nests deeper than 64 levels"),
        ("infinity", "Infinity is not a JSON number"),
        ("1e999", "beyond a float's range"),
    ],
)
def test_a_hostile_model_config_is_one_warning_naming_it(
    tmp_path: Path, kind: str, says: str
) -> None:
    path, model = _topology(tmp_path)
    config = hostile_files.make(model, "config.json", kind)
    (code, [finding]), peak = hostile_files.bounded_call(lambda: _lease_findings(path))
    assert code == 0  # a warning: the engines read their own copy
    assert finding["severity"] == "warning" and finding["field"] == "model.name"
    message = finding["message"]
    assert says in message and str(config) in message and "\n" not in message, message
    assert "model config" in message and "not checked" in message
    assert peak < 64 << 20, f"{peak:,} bytes allocated reading {kind}"


def test_dimensions_no_model_has_are_not_estimated(tmp_path: Path) -> None:
    # 10**400 layers: the bytes per token overflowed float math (OverflowError traceback).
    path, model = _topology(tmp_path)
    (model / "config.json").write_text(json.dumps({**LLAMA_70B, "num_hidden_layers": 10**400}))
    assert _lease_findings(path) == (0, [])
    (model / "config.json").write_text(json.dumps({**LLAMA_70B, "num_key_value_heads": -8}))
    assert _lease_findings(path) == (0, [])


def test_a_real_config_still_gives_the_budget_warning(tmp_path: Path) -> None:
    path, model = _topology(tmp_path)
    (model / "config.json").write_text(json.dumps(LLAMA_70B))
    _, [finding] = _lease_findings(path)
    assert (
        finding["field"] == "kv_connector.kv_lease_duration"
        and "327680 bytes" in finding["message"]
    )


def test_no_config_here_is_silence(tmp_path: Path) -> None:
    path, _ = _topology(tmp_path)  # a model directory without config.json (only the nodes')
    assert _lease_findings(path) == (0, [])
