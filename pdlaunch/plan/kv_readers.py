"""Which kv_connector_extra_config keys the connector a process loads reads, and where.

A key no connector of that process reads parses and does nothing, so the plan renders a key
only where this says it is read and the `version-render` rule refuses the rest. The readers:

- vLLM's NixlConnector of the instance's release (facts `runtime.nixl.extra_config_keys`, each
  with the wheel's file:line); a plugin's connector that replaces or subclasses it reads
  those too;
- pdlaunch's KV extension (pdlaunch/kv/connector.py, a NixlConnector subclass) adds its own;
- a prefill whose plugin post-processes natively (plugin profile `post_processing`, e.g. the
  agreed block size of vllm-gaudi's hetero connector or of PR 30448's NixlConnector): the
  keys that post-processing reads, on the prefill side only — decode learns the agreed size
  from the handshake (seeds/vllm-pr30448-prefill-kv-postprocess.md: block_size_after_save);
- Mooncake: the keys the plugin's Mooncake connector reads (profile `mooncake_extra_config`).

Pure reads of facts and profiles.
"""

from __future__ import annotations

from typing import Any

from pdlaunch import kv as kv_extension
from pdlaunch.plan import kv_geometry as kv
from pdlaunch.spec import facts
from pdlaunch.spec.topology import Instance, Topology

#: The extension's own keys, with where pdlaunch/kv/connector.py reads them.
EXTENSION_KEYS: dict[str, str] = {
    kv_extension.KEY_AGREED_BLOCK_SIZE: "pdlaunch/kv/connector.py:282",
    kv_extension.KEY_DECODE_BLOCK_SIZES: "pdlaunch/kv/connector.py:283",
    kv_extension.KEY_DECODE_KV_LAYOUT: "pdlaunch/kv/connector.py:332",
}


def keys_read(
    topo: Topology, role: str, inst: Instance, cfg: dict[str, Any]
) -> dict[str, str] | None:
    """key -> source for every kv_connector_extra_config key the connector that `cfg` loads
    on this instance reads; None when pdlaunch cannot tell (no facts for the release, or a
    Mooncake node without a plugin profile) — the vllm-version rule refuses the former."""
    prof = kv.plugin_of(inst)
    if topo.kv_connector.kind == "mooncake":
        if prof is None or not prof.mooncake_extra_config:
            return None
        return {k: prof.mooncake_extra_config_source for k in prof.mooncake_extra_config}
    try:
        vf = facts.vllm(topo.vllm_version_of(inst))
    except KeyError:
        return None
    reads = dict(vf.nixl.get("extra_config_keys", {}))
    if cfg.get("kv_connector_module_path") == kv_extension.CONNECTOR_MODULE_PATH:
        reads.update(EXTENSION_KEYS)
        return reads
    if role == "prefill":
        adv = kv.prefill_kv(topo, inst)
        if adv.kind == "plugin" and adv.post and adv.post.connector == cfg.get("kv_connector"):
            reads.update({k: adv.post.source for k in adv.post.extra_config})
    return reads


def reads(topo: Topology, role: str, inst: Instance, cfg: dict[str, Any], key: str) -> bool:
    """Whether the process's connector reads `key` (True when pdlaunch cannot tell: the
    topology is refused for its release by another rule)."""
    known = keys_read(topo, role, inst, cfg)
    return known is None or key in known
