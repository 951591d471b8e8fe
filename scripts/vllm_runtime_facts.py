"""What one installed vLLM does at run time that its CLI parser cannot tell, read from its own
code: the NIXL side-channel port formula, the handshake metadata and compatibility-hash inputs,
the kv_transfer_config fields (and what happens to unknown ones), the kv_connector_extra_config
keys NIXL reads, the connectors the factory registers, the devices NIXL accepts.

Imported by scripts/gen_vllm_facts.py inside the venv of the vLLM being described (any release
from 0.10 on). Classes are imported where that works without compiled ops (config classes,
envs); connector code is read as source (`ast`), because on a CPU-only venv the connectors'
imports (torch ops, nixl) may not load. Every fact carries `file:line` inside the wheel.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any

NIXL_NAMES = ("NixlConnector",)


def torch_shims() -> None:
    """Old releases' CPU platform probes torch APIs that the venv's (newer) torch dropped while
    importing kernels (0.17 vllm/platforms/cpu.py:490 `torch._C._cpu._is_avx512_supported`);
    the kernels do not load here anyway, so answer "no" and let the Python side import."""
    import torch

    cpu = torch._C._cpu
    for name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        if not hasattr(cpu, name):
            setattr(cpu, name, lambda: False)


def _root() -> Path:
    import vllm

    return Path(vllm.__file__).parent


def _rel(path: Path) -> str:
    return "vllm/" + path.relative_to(_root()).as_posix()


def registered_connectors() -> dict[str, dict[str, str]]:
    """KVConnectorFactory.register_connector(name, module, class) calls in factory.py."""
    path = _root() / "distributed/kv_transfer/kv_connector/factory.py"
    text = path.read_text()
    out = {}
    call = re.compile(r'register_connector\(\s*"(\w+)",\s*"([\w.]+)",\s*"(\w+)"', re.S)
    for m in call.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out[m.group(1)] = {
            "module": m.group(2),
            "class": m.group(3),
            "source": f"{_rel(path)}:{line}",
        }
    return out


def _module_files(module: str) -> list[Path]:
    rel = Path(*module.split(".")[1:])
    pkg = _root() / rel
    files = sorted(pkg.glob("*.py")) if pkg.is_dir() else [pkg.with_suffix(".py")]
    return [f for f in files if f.is_file()]


def _nixl_files(connectors: dict[str, dict[str, str]]) -> list[Path]:
    files: list[Path] = []
    for name in NIXL_NAMES:
        if name in connectors:
            files += _module_files(connectors[name]["module"])
    utils = _root() / "distributed/kv_transfer/kv_connector/utils.py"
    return list(dict.fromkeys(files + ([utils] if utils.is_file() else [])))


def _walk(files: list[Path]):
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            yield path, node


def extra_config_keys(files: list[Path]) -> dict[str, str]:
    """Keys read with get_from_extra_config("k", ...) or kv_connector_extra_config.get("k")."""
    keys: dict[str, str] = {}
    for path, node in _walk(files):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        fn = node.func
        reads = fn.attr == "get_from_extra_config" or (
            fn.attr == "get" and "extra_config" in ast.unparse(fn.value)
        )
        if reads and node.args and isinstance(node.args[0], ast.Constant):
            key = node.args[0].value
            if isinstance(key, str):
                keys.setdefault(key, f"{_rel(path)}:{node.lineno}")
    return dict(sorted(keys.items()))


def side_channel(files: list[Path]) -> dict[str, Any]:
    """Each expression that adds to VLLM_NIXL_SIDE_CHANNEL_PORT (or to the port derived from
    it), and the formula they make: `dp_index` (one listener per DP rank, 0.12 on) or
    `dp_rank_tp` (base + dp_rank * tp_size, one listener per TP rank at base + tp_rank)."""
    exprs = []
    for path, node in _walk(files):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            text = ast.unparse(node)
            # The base (PORT + ...) and, in 0.10, each TP rank's listener (base_port + tp_rank).
            if "SIDE_CHANNEL_PORT" in text.upper() or re.search(r"port \+ tp_rank\b", text):
                exprs.append({"expr": text, "source": f"{_rel(path)}:{node.lineno}"})
    seen, unique = set(), []
    for e in exprs:
        if e["expr"] not in seen:
            seen.add(e["expr"])
            unique.append(e)
    joined = " ".join(e["expr"] for e in unique)
    per_tp = "tp_rank" in joined and ("tp_size" in joined or "tensor_parallel_size" in joined)
    formula = "dp_rank_tp" if per_tp else "dp_index" if "data_parallel" in joined else "unknown"
    import vllm.envs as envs

    saved = os.environ.pop("VLLM_NIXL_SIDE_CHANNEL_PORT", None)
    try:
        default = envs.environment_variables["VLLM_NIXL_SIDE_CHANNEL_PORT"]()
    finally:
        if saved is not None:
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = saved
    return {"formula": formula, "default_port": default, "expressions": unique}


def _assigned(files: list[Path], name: str) -> tuple[Any, str] | None:
    for path, node in _walk(files):
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign):
            target = node.target
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            try:
                return ast.literal_eval(node.value), f"{_rel(path)}:{node.lineno}"
            except ValueError:
                return None
    return None


def _class_fields(files: list[Path], name: str) -> tuple[list[str], str] | None:
    for path, node in _walk(files):
        if isinstance(node, ast.ClassDef) and node.name == name:
            fields = [
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
            return fields, f"{_rel(path)}:{node.lineno}"
    return None


def _hash_factors(files: list[Path]) -> tuple[list[str], str] | None:
    for path, node in _walk(files):
        if isinstance(node, ast.FunctionDef) and node.name == "compute_nixl_compatibility_hash":
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Assign)
                    and isinstance(sub.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == "factors" for t in sub.targets)
                ):
                    keys = [k.value for k in sub.value.keys if isinstance(k, ast.Constant)]
                    return keys, f"{_rel(path)}:{sub.lineno}"
    return None


def nixl_facts(connectors: dict[str, dict[str, str]]) -> dict[str, Any]:
    files = _nixl_files(connectors)
    out: dict[str, Any] = {
        "files": [_rel(f) for f in files],
        "side_channel": side_channel(files),
        "extra_config_keys": extra_config_keys(files),
    }
    version = _assigned(files, "NIXL_CONNECTOR_VERSION")
    out["connector_version"] = {"value": version[0], "source": version[1]} if version else None
    meta = _class_fields(files, "NixlAgentMetadata")
    out["agent_metadata"] = {"fields": meta[0], "source": meta[1]} if meta else None
    payload = _class_fields(files, "NixlHandshakePayload")
    out["handshake_payload"] = {"fields": payload[0], "source": payload[1]} if payload else None
    factors = _hash_factors(files)
    out["compat_hash_factors"] = {"keys": factors[0], "source": factors[1]} if factors else None
    # 0.10 names the table _NIXL_SUPPORTED_XPUS (nixl_connector.py:61).
    devices = _assigned(files, "_NIXL_SUPPORTED_DEVICE") or _assigned(files, "_NIXL_SUPPORTED_XPUS")
    out["supported_devices"] = (
        {"map": {k: sorted(v) for k, v in devices[0].items()}, "source": devices[1]}
        if devices
        else None
    )
    return out


def _kv_transfer_class():
    try:
        from vllm.config.kv_transfer import KVTransferConfig
    except ImportError:
        from vllm.config import KVTransferConfig
    return KVTransferConfig


def kv_transfer_config(serve_parser) -> dict[str, Any]:
    """Fields of KVTransferConfig, and what `--kv-transfer-config` does with an unknown key:
    the parser's own type function is given one (`refused` or `dropped`)."""
    import dataclasses
    import inspect

    cls = _kv_transfer_class()
    fields = sorted(f.name for f in dataclasses.fields(cls))
    source = inspect.getsourcefile(cls) or ""
    line = inspect.getsourcelines(cls)[1]
    action = next(a for a in serve_parser._actions if a.dest == "kv_transfer_config")
    probe = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "pdl_x": 1})
    try:
        parsed = action.type(probe)
        if isinstance(parsed, dict):
            parsed = cls(**parsed)
        unknown = "kept" if hasattr(parsed, "pdl_x") else "dropped"
    except Exception:
        unknown = "refused"
    return {
        "fields": fields,
        "unknown_keys": unknown,
        "source": f"{_rel(Path(source))}:{line}" if source else "",
    }


def json_config_fields(serve_parser) -> dict[str, dict[str, Any]]:
    """For each config-object flag (`--attention-config`, `--compilation-config`, ...): the
    config class's fields (the keys `--x.key v` may name), and what the flag's own type
    function does with a key the class lacks (`refused` or `dropped`)."""
    import dataclasses
    import inspect

    import vllm.config as config

    classes = {n.lower(): getattr(config, n) for n in dir(config)}
    out: dict[str, dict[str, Any]] = {}
    for action in serve_parser._actions:
        cls = classes.get(action.dest.replace("_", "").lower())
        if not action.option_strings or cls is None or not dataclasses.is_dataclass(cls):
            continue
        try:
            parsed = action.type(json.dumps({"pdl_x": 1}))
            # A dict is turned into the class later (EngineArgs): not judged at parse time.
            unknown = "later" if isinstance(parsed, dict) else "dropped"
        except Exception:
            unknown = "refused"
        try:
            source = (
                f"{_rel(Path(inspect.getsourcefile(cls) or ''))}:{inspect.getsourcelines(cls)[1]}"
            )
        except (OSError, TypeError, ValueError):
            source = ""
        out[action.dest] = {
            "class": cls.__name__,
            "fields": sorted(f.name for f in dataclasses.fields(cls)),
            "unknown_keys": unknown,
            "source": source,
        }
    return out


def runtime_facts(serve_parser) -> dict[str, Any]:
    connectors = registered_connectors()
    return {
        "json_configs": json_config_fields(serve_parser),
        "connectors": connectors,
        "kv_transfer_config": kv_transfer_config(serve_parser),
        "nixl": nixl_facts(connectors),
    }
