"""Plugin profiles: what one release of a vLLM device plugin (vllm-gaudi, vllm-ascend) brings
to a PD deployment, as data (pdlaunch/spec/facts/plugins/*.json).

Each profile is generated from the plugin's source at a tag or commit by
`scripts/gen_plugin_profiles.py`, every fact with the file:line it was read from: the KV
connectors it registers or patches, the environment variables it reads, the KV cache shape of
its attention backend, and the KV post-processing it does natively. An instance names its
profile (`plugin: vllm-gaudi@e269485`) or gets its device kind's default. Pure reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "facts" / "plugins"


@dataclass(frozen=True)
class Connector:
    name: str  # the `kv_connector` value
    module: str | None  # where the class lives; None: vLLM's own class, patched in place
    cls: str
    # Whether a node must be given kv_connector_module_path (nothing registers the name in
    # every vLLM process of that build).
    module_path: bool
    how: str
    source: str


@dataclass(frozen=True)
class PostProcessing:
    """KV post-processing the plugin (or the vLLM build it is paired with) does itself."""

    side: str  # "prefill": converts its own pages before decode pulls them
    what: str
    connector: str
    layout_on_save: str
    smaller_blocks_only: bool
    env: dict[str, str]  # what turns it on
    kv_transfer_config: dict[str, Any]  # top-level keys it needs
    extra_config: tuple[str, ...]  # kv_connector_extra_config keys it reads
    prefix_caching: bool  # whether it runs with prefix caching on
    requires: str  # a condition outside the plugin ("" when none)
    source: str


@dataclass(frozen=True)
class PluginProfile:
    id: str
    plugin: str
    device: str
    ref: str
    vllm: str  # the vLLM series the release targets
    vllm_note: str
    connectors: tuple[Connector, ...]
    modules: frozenset[str]  # Python modules under the plugin's distributed/ package
    env: dict[str, str]  # variable -> file:line where the plugin reads it
    kv_cache_shape: str
    kv_cache_source: str
    # Whether pdlaunch's KV extension can re-block this cache (a 4-D [blocks, heads, block,
    # C] NIXL cache); the reason when not.
    extension_ok: bool
    extension_why: str
    post_processing: tuple[PostProcessing, ...]
    # kv_connector_extra_config keys its Mooncake connector reads, and where (vllm-ascend).
    mooncake_extra_config: tuple[str, ...] = ()
    mooncake_extra_config_source: str = ""
    origin: str = ""  # where the profile was read (repository or package index)

    def connector(self, name: str) -> Connector | None:
        return next((c for c in self.connectors if c.name == name), None)

    def prefill_postprocess(self) -> PostProcessing | None:
        return next((p for p in self.post_processing if p.side == "prefill"), None)


def _load(path: Path) -> PluginProfile:
    raw = json.loads(path.read_text())
    cache = raw["kv_cache"]
    return PluginProfile(
        id=raw["id"],
        plugin=raw["plugin"],
        device=raw["device"],
        ref=raw["ref"],
        vllm=raw["vllm"],
        vllm_note=raw["vllm_note"],
        connectors=tuple(
            Connector(
                name=c["name"],
                module=c["module"],
                cls=c["class"],
                module_path=c["module_path"],
                how=c["how"],
                source=c["source"],
            )
            for c in raw["connectors"]
        ),
        modules=frozenset(raw["modules"]),
        env=dict(raw["env"]),
        kv_cache_shape=cache["shape"],
        kv_cache_source=cache["source"],
        extension_ok=cache["pdlaunch_extension"],
        extension_why=cache["why"],
        post_processing=tuple(
            PostProcessing(
                side=p["side"],
                what=p["what"],
                connector=p["connector"],
                layout_on_save=p["layout_on_save"],
                smaller_blocks_only=p["smaller_blocks_only"],
                env=dict(p["env"]),
                kv_transfer_config=dict(p["kv_transfer_config"]),
                extra_config=tuple(p["extra_config"]),
                prefix_caching=p["prefix_caching"],
                requires=p["requires"],
                source=p["source"],
            )
            for p in raw["post_processing"]
        ),
        mooncake_extra_config=tuple(raw.get("mooncake_extra_config", {}).get("keys", ())),
        mooncake_extra_config_source=raw.get("mooncake_extra_config", {}).get("source", ""),
        origin=raw.get("source", ""),
    )


@lru_cache(maxsize=1)
def _index() -> dict[str, Any]:
    return json.loads((HERE / "index.json").read_text())


@lru_cache(maxsize=1)
def profiles() -> dict[str, PluginProfile]:
    """Every known profile by id, in the index's order."""
    return {pid: _load(HERE / f"{pid}.json") for pid in _index()["profiles"]}


def profile_ids() -> tuple[str, ...]:
    return tuple(profiles())


def default_for(device: str) -> str | None:
    """The profile an instance on `device` gets when it names none (None: no plugin)."""
    return _index()["defaults"].get(device)


def get(pid: str) -> PluginProfile:
    return profiles()[pid]


def unknown_message(pid: str) -> str:
    """The refusal for a profile id pdlaunch has no data for, naming the ones it has."""
    return f"unknown plugin profile {pid!r}: pdlaunch knows {', '.join(profile_ids())}"


def of(device: str, named: str | None) -> PluginProfile | None:
    """The profile an instance runs: the one it names, else its device kind's default."""
    pid = named or default_for(device)
    return get(pid) if pid else None
