"""Generate pdlaunch's plugin profiles (pdlaunch/spec/facts/plugins/*.json) from the
plugins' source.

A profile says what one release of a vLLM device plugin does to a PD deployment: the KV
connectors it registers or patches (module path, class), the environment variables it reads,
the KV cache shape its attention backend allocates, and the KV post-processing it offers
natively. Every fact is found in the plugin's source at that tag or commit by an anchor (a
regular expression that must match exactly one place of the named file), and recorded with
the file:line it matched, so a fact whose source moved or vanished stops the generator
instead of shipping a stale citation.

Sources (read-only; nothing is installed or imported):

* vllm-gaudi: a git clone (e.g. the `fetch` mirror of github:vllm-project/vllm-gaudi), read at
  each ref with `git show` / `git ls-tree`;
* vllm-ascend: a git clone for the 2025-09 build the Ascend guide installs (upstream commit
  af62af3c of 2025-09-02: the guide's openFuyao build 9b418ede4 of that day is not public on
  GitHub), and the unpacked 0.23.0.post1 sdist for the release (`SOC_VERSION=ascend910b1 pip
  download --no-deps --no-build-isolation --no-clean vllm-ascend==0.23.0.post1` leaves the
  unpacked tree under /tmp/pip-download-*; the sdist has no git history).

    python scripts/gen_plugin_profiles.py --gaudi-repo DIR --ascend-repo DIR \
        --ascend-sdist DIR [--check]

To add a profile: add a spec to PROFILES (id, plugin, ref, device, vllm series, anchors), run
the script, commit the new JSON and add a row to the README's plugin table.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "pdlaunch" / "spec" / "facts" / "plugins"


class Tree:
    """One source tree at one ref: a git commit or a plain directory."""

    def __init__(self, root: Path, ref: str | None) -> None:
        self.root, self.ref = root, ref

    def read(self, path: str) -> str:
        if self.ref is None:
            return (self.root / path).read_text()
        return subprocess.run(
            ["git", "-C", str(self.root), "show", f"{self.ref}:{path}"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip

    def files(self, under: str) -> list[str]:
        if self.ref is None:
            base = self.root / under
            return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())
        out = subprocess.run(
            ["git", "-C", str(self.root), "ls-tree", "-r", "--name-only", self.ref, under],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        return out.split()

    def exists(self, path: str) -> bool:
        try:
            self.read(path)
        except (subprocess.CalledProcessError, FileNotFoundError):
            return False
        return True


def cite(tree: Tree, path: str, pattern: str, first: bool = False) -> str:
    """`path:line` of the one line matching `pattern` (a fact whose anchor matches nothing, or
    several places, is an error: the source moved and the fact must be re-read)."""
    hits = [i for i, line in enumerate(tree.read(path).splitlines(), 1) if re.search(pattern, line)]
    if first:
        hits = hits[:1]  # a guide that repeats its example: cite the first
    if len(hits) != 1:
        raise SystemExit(f"{tree.ref or tree.root}: {path}: anchor {pattern!r} matched {hits}")
    return f"{path}:{hits[0]}"


def cites(tree: Tree, path: str, *patterns: str) -> str:
    """`path:l1,l2,...` for several anchors in one file."""
    lines = [cite(tree, path, p).rsplit(":", 1)[1] for p in patterns]
    return f"{path}:{','.join(lines)}"


ENV_READ = re.compile(
    r"""(?:os\.getenv|os\.environ\.get|os\.environ\[|environ\.get)\(?\s*['"]([A-Z][A-Z0-9_]+)['"]"""
)
ENV_KEY = re.compile(r"""^\s*['"]([A-Z][A-Z0-9_]+)['"]\s*:""")


def env_reads(tree: Tree, package: str, envs_file: str) -> dict[str, str]:
    """Variable -> where the plugin first reads it: the keys of its envs.py table, then every
    direct os.environ/os.getenv read in the package (features computed from a name at run
    time are not seen: the profile lists what the source spells out)."""
    out: dict[str, str] = {}
    for i, line in enumerate(tree.read(envs_file).splitlines(), 1):
        m = ENV_KEY.match(line)
        if m:
            out.setdefault(m.group(1), f"{envs_file}:{i}")
    for path in tree.files(package):
        if not path.endswith(".py") or "/tests/" in path:
            continue
        for i, line in enumerate(tree.read(path).splitlines(), 1):
            for name in ENV_READ.findall(line):
                out.setdefault(name, f"{path}:{i}")
    return dict(sorted(out.items()))


def connector_modules(tree: Tree, under: str) -> list[str]:
    """Python modules under the plugin's distributed/ package: what a
    kv_connector_module_path may name on a node running this build."""
    mods = []
    for path in tree.files(under):
        if path.endswith(".py"):
            mod = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            mods.append(mod)
    return sorted(mods)


@dataclass(frozen=True)
class Spec:
    id: str
    plugin: str
    device: str
    ref: str  # tag, commit or "sdist <version>"
    vllm: str  # the vLLM series the release targets
    vllm_note: str
    tree: str  # which --*-repo / --*-sdist argument holds it
    build: Callable[[Tree], dict[str, Any]]


GAUDI_V1 = "vllm_gaudi/distributed/kv_transfer/kv_connector/v1"
HPU_ATTN = "vllm_gaudi/attention/ops/hpu_paged_attn.py"
HETERO = f"{GAUDI_V1}/hetero_hpu_nixl_connector.py"


def _gaudi(t: Tree, *, hetero: bool, pr30448: bool) -> dict[str, Any]:
    if hetero != t.exists(HETERO):
        raise SystemExit(f"{t.ref}: {HETERO} {'missing' if hetero else 'present'}")
    setup_anchor = r"01\.hpu_custom_(ops|utils)"
    patch = cite(t, "vllm_gaudi/__init__.py", r"import .*kv_connector\.v1\.hpu_nixl_connector")
    connectors = [
        {
            "name": "NixlConnector",
            "module": None,
            "class": "NixlConnector",
            "how": "vLLM's own NixlConnector, patched in place for HPU memory by "
            "vllm_gaudi.distributed.kv_transfer.kv_connector.v1.hpu_nixl_connector, which the "
            "plugin's vllm.general_plugins entry point imports: no kv_connector_module_path",
            "module_path": False,
            "source": f"{cite(t, 'setup.py', setup_anchor)}; {patch}",
        }
    ]
    post: list[dict[str, Any]] = []
    if hetero:
        post.append(
            {
                "side": "prefill",
                "what": "after the last prefill chunk, re-block to the agreed (smaller) block "
                "size and permute NHD -> HND in place, then advertise that geometry "
                "(hetero_hpu_nixl_connector)",
                "connector": "NixlConnector",
                "layout_on_save": "HND",
                "smaller_blocks_only": True,
                "env": {"VLLM_HPU_HETERO_KV_LAYOUT": "true"},
                "kv_transfer_config": {"enable_permute_local_kv": True},
                "extra_config": ["agreed_block_size"],
                "prefix_caching": False,
                "requires": "",
                "source": "; ".join(
                    [
                        cite(t, "vllm_gaudi/__init__.py", r"VLLM_HPU_HETERO_KV_LAYOUT"),
                        cites(
                            t,
                            HETERO,
                            r"assert vllm_config\.kv_transfer_config\.enable_permute_local_kv",
                            r"if vllm_config\.cache_config\.enable_prefix_caching",
                            r'kv_cache_layout_on_save = "HND"',
                            r'get_from_extra_config\("agreed_block_size"',
                            r"agreed_block_size if agreed_block_size <= current_block_size",
                            r"^NixlConnector\.wait_for_save = wait_for_save",
                        ),
                    ]
                ),
            }
        )
    elif pr30448:
        post.append(
            {
                "side": "prefill",
                "what": "prefill-side re-block to the agreed block size and NHD -> HND, done by "
                "vLLM's NixlConnector from PR 30448's branch (dev/prefill_KV_process), which "
                "the seed guide's Case 2 installs on both nodes next to this commit",
                "connector": "NixlConnector",
                "layout_on_save": "HND",
                "smaller_blocks_only": True,
                "env": {},
                "kv_transfer_config": {"enable_permute_local_kv": True},
                "extra_config": ["agreed_block_size"],
                "prefix_caching": False,
                "requires": "vLLM built from PR 30448's branch dev/prefill_KV_process on both "
                "nodes (the guide's Case 2); this vllm-gaudi commit has no post-processing of "
                "its own",
                "source": "seeds/hetero-pd-cuda-gaudi-nixl-rev2.md (Installation table; Case 2 "
                "'This case is enabled with #30448' and its launch scripts); "
                f"{patch} (the only KV module this commit imports)",
            }
        )
    return {
        "connectors": connectors,
        "modules": connector_modules(t, "vllm_gaudi/distributed"),
        "env": env_reads(t, "vllm_gaudi", "vllm_gaudi/envs.py"),
        "flags": [],
        "flags_note": "vllm-gaudi adds no `vllm serve` flags (it registers a platform and "
        "general plugins only)",
        "kv_cache": {
            "shape": "(num_blocks * block_size, num_kv_heads, head_size)",
            "k_and_v": "separate tensors",
            "pdlaunch_extension": False,
            "why": "pdlaunch's KV extension re-blocks 4-D [blocks, heads, block, C] caches; "
            "HPU paged attention keeps a flat token-major cache per K and per V",
            "source": cite(t, HPU_ATTN, r"return \(num_blocks \* block_size, num_kv_heads"),
        },
        "nixl_devices": {
            "hpu": ["cpu", "hpu"],
            "source": cite(t, "vllm_gaudi/platform.py", r'return \{"hpu": \("cpu", "hpu"\)\}'),
        },
        "post_processing": post,
    }


ASCEND_SHAPE = r"^        return \(2, num_blocks, block_size, num_kv_heads, head_size\)"


def _ascend_2509(t: Tree) -> dict[str, Any]:
    reg = "vllm_ascend/distributed/__init__.py"
    mc = "vllm_ascend/distributed/mooncake_connector.py"
    return {
        "connectors": [
            {
                "name": "MooncakeConnectorV1",
                "module": "vllm_ascend.distributed.mooncake_connector",
                "class": "MooncakeConnector",
                "how": "registered with KVConnectorFactory only when vllm_ascend.distributed "
                "is imported (no entry point does it), so the plugin's own deployment guide "
                "and the seed guide add kv_connector_module_path with the registered name "
                "(vLLM 0.10.2's factory tries its registry first, factory.py:68-77)",
                "module_path": True,
                "source": "; ".join(
                    [
                        cite(
                            t,
                            reg,
                            r'^    "MooncakeConnectorV1", "vllm_ascend\.distributed\.'
                            r'mooncake_connector"',
                        ),
                        cite(t, mc, r"^class MooncakeConnector\(KVConnectorBase_V1"),
                        cite(
                            t,
                            "examples/disaggregated_prefill_v1/"
                            "mooncake_connector_deployment_guide.md",
                            r'"kv_connector_module_path": "vllm_ascend\.distributed\.'
                            r'mooncake_connector"',
                            first=True,
                        ),
                    ]
                ),
            },
            {
                "name": "LLMDataDistCMgrConnector",
                "module": "vllm_ascend.distributed.llmdatadist_c_mgr_connector",
                "class": "LLMDataDistCMgrConnector",
                "how": "registered with KVConnectorFactory",
                "module_path": True,
                "source": cite(t, reg, r'^    "LLMDataDistCMgrConnector",'),
            },
        ],
        "mooncake_extra_config": {
            "keys": ["prefill", "decode"],
            "source": "; ".join(
                [cite(t, mc, r'^ +"prefill", \{\}\)'), cite(t, mc, r'^ +"decode", \{\}\)')]
            ),
        },
        "modules": connector_modules(t, "vllm_ascend/distributed"),
        "env": env_reads(t, "vllm_ascend", "vllm_ascend/envs.py"),
        "flags": [],
        "flags_note": "vllm-ascend adds no `vllm serve` flags (settings go through vLLM's "
        "--additional-config)",
        "kv_cache": {
            "shape": "(2, num_blocks, block_size, num_kv_heads, head_size)",
            "k_and_v": "one tensor, K and V on the leading axis",
            "pdlaunch_extension": False,
            "why": "Ascend moves KV with Mooncake, not NIXL: pdlaunch's extension is a "
            "NixlConnector subclass",
            "source": cite(t, "vllm_ascend/attention/attention_v1.py", ASCEND_SHAPE),
        },
        "nixl_devices": None,
        "post_processing": [],
    }


def _ascend_023(t: Tree) -> dict[str, Any]:
    reg = "vllm_ascend/distributed/kv_transfer/__init__.py"
    mc = "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py"
    return {
        "connectors": [
            {
                "name": "MooncakeConnectorV1",
                "module": "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector",
                "class": "MooncakeConnector",
                "how": "registered with KVConnectorFactory by the plugin's "
                "vllm.general_plugins entry point ascend_kv_connector (every vLLM process)",
                "module_path": False,
                "source": "; ".join(
                    [
                        cite(t, "setup.py", r"ascend_kv_connector = vllm_ascend"),
                        cite(t, reg, r"MooncakeConnectorV1.*kv_p2p\.mooncake_connector"),
                        cite(t, mc, r"^class MooncakeConnector\(KVConnectorBase_V1"),
                    ]
                ),
            },
            {
                "name": "MooncakeLayerwiseConnector",
                "module": "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_layerwise_connector",
                "class": "MooncakeLayerwiseConnector",
                "how": "registered with KVConnectorFactory (entry point ascend_kv_connector)",
                "module_path": False,
                "source": cite(
                    t,
                    reg,
                    r"^ +.vllm_ascend\.distributed\.kv_transfer\.kv_p2p\."
                    r"mooncake_layerwise_connector.,$",
                ),
            },
        ],
        "mooncake_extra_config": {
            "keys": ["prefill", "decode"],
            "source": "; ".join(
                [
                    cite(t, mc, r'get_from_extra_config\("prefill"'),
                    cite(t, mc, r'get_from_extra_config\("decode"'),
                ]
            ),
        },
        "modules": connector_modules(t, "vllm_ascend/distributed"),
        "env": env_reads(t, "vllm_ascend", "vllm_ascend/envs.py"),
        "flags": [],
        "flags_note": "vllm-ascend adds no `vllm serve` flags (settings go through vLLM's "
        "--additional-config)",
        "kv_cache": {
            "shape": "(2, num_blocks, block_size, num_kv_heads, head_size)",
            "k_and_v": "one tensor, K and V on the leading axis",
            "pdlaunch_extension": False,
            "why": "Ascend moves KV with Mooncake, not NIXL: pdlaunch's extension is a "
            "NixlConnector subclass",
            "source": cite(t, "vllm_ascend/attention/attention_v1.py", ASCEND_SHAPE),
        },
        "nixl_devices": None,
        "post_processing": [],
    }


E269485 = "e26948506df2ec861fd5280f0c1eefdb97a5d956"
PROFILES = [
    Spec(
        "vllm-gaudi@e269485",
        "vllm-gaudi",
        "hpu",
        E269485,
        "0.13",
        "the CUDA-Gaudi seed guides pin vLLM commit f21f5ea with this commit (first in "
        "vllm-gaudi tag v0.13.0)",
        "gaudi",
        lambda t: _gaudi(t, hetero=False, pr30448=True),
    ),
    *(
        Spec(
            f"vllm-gaudi@{tag}",
            "vllm-gaudi",
            "hpu",
            tag,
            tag[1:].rsplit(".", 1)[0],
            f"release tag for vLLM {tag[1:]}",
            "gaudi",
            # hetero_hpu_nixl_connector exists from v0.15.1 (PR 867, d54f4c25)
            lambda t, hetero=hetero: _gaudi(t, hetero=hetero, pr30448=False),
        )
        for tag, hetero in (
            ("v0.11.2", False),
            ("v0.13.0", False),
            ("v0.14.1", False),
            ("v0.15.1", True),
            ("v0.16.0", True),
            ("v0.17.1", True),
            ("v0.19.1", True),
            ("v0.21.0", True),
            ("v0.24.0", True),
        )
    ),
    Spec(
        "vllm-gaudi@v0.26.0",
        "vllm-gaudi",
        "hpu",
        "v0.26.0",
        "0.26",
        "newest vllm-gaudi release",
        "gaudi",
        lambda t: _gaudi(t, hetero=True, pr30448=False),
    ),
    Spec(
        "vllm-ascend@2025-09",
        "vllm-ascend",
        "npu",
        "af62af3cc5f084c719d2ecadb5749b44f01c56c4",
        "0.10",
        "the Ascend guide's build (vllm_ascend 0.1.dev789+g9b418ede4.d20250902 with "
        "vLLM 0.10.2rc2); read at upstream af62af3c, the last commit of 2025-09-02",
        "ascend",
        _ascend_2509,
    ),
    Spec(
        "vllm-ascend@0.23.0.post1",
        "vllm-ascend",
        "npu",
        "sdist 0.23.0.post1",
        "0.23",
        "newest vllm-ascend release (docs/source/conf.py pins vLLM 0.23.0)",
        "ascend_sdist",
        _ascend_023,
    ),
]
DEFAULTS = {"hpu": "vllm-gaudi@v0.26.0", "npu": "vllm-ascend@0.23.0.post1"}


def build(spec: Spec, roots: dict[str, Path]) -> dict[str, Any]:
    root = roots[spec.tree]
    tree = Tree(root, None if spec.tree == "ascend_sdist" else spec.ref)
    repo = {
        "gaudi": "github.com/vllm-project/vllm-gaudi",
        "ascend": "github.com/vllm-project/vllm-ascend",
        "ascend_sdist": "pypi.org/project/vllm-ascend (sdist)",
    }[spec.tree]
    return {
        "id": spec.id,
        "plugin": spec.plugin,
        "device": spec.device,
        "ref": spec.ref,
        "source": repo,
        "vllm": spec.vllm,
        "vllm_note": spec.vllm_note,
        **spec.build(tree),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaudi-repo", type=Path, required=True)
    ap.add_argument("--ascend-repo", type=Path, required=True)
    ap.add_argument("--ascend-sdist", type=Path, required=True)
    ap.add_argument("--check", action="store_true", help="exit 1 if a shipped file differs")
    args = ap.parse_args()
    roots = {
        "gaudi": args.gaudi_repo,
        "ascend": args.ascend_repo,
        "ascend_sdist": args.ascend_sdist,
    }
    files = {f"{s.id}.json": build(s, roots) for s in PROFILES}
    files["index.json"] = {"defaults": DEFAULTS, "profiles": [s.id for s in PROFILES]}
    stale = []
    for name, data in files.items():
        text = json.dumps(data, indent=1) + "\n"
        path = OUT / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale plugin profiles: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
