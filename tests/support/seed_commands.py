"""Run a rendered script with stand-in `vllm`, `vllm-router`, `python` (and docker/podman)
first on PATH, each writing the argv and environment it received; parse a seed guide's shell
(its exports and command lines, placeholders filled in); compare the two the way
tests/plan/test_seed_guides.py documents (flags normalised, JSON values contained)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import render_plan, write_files
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load
from tests.support.fake_bins import container_runtime_standin

# What the scripts inherit: a known LD_LIBRARY_PATH checks the path-prepend logic against
# the seed's `...:$LD_LIBRARY_PATH`.
INHERITED_LD = "/inherited/lib"


FAKE = """#!{python}
import json, os, sys
with open(os.environ["PDLAUNCH_FAKE_OUT"], "w", encoding="utf-8") as f:
    json.dump({{"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
                "env": dict(os.environ)}}, f)
"""


# --------------------------------------------------------------------------- running


# The image env of the stand-in `docker`/`podman` (tests/support/fake_bins.py) for the shipped
# examples whose engines run in containers: the fake image's PATH and its own LD_LIBRARY_PATH,
# INHERITED_LD, as an image's.
IMAGE_ENV = (
    '{"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": %r, '
    '"PDLAUNCH_FAKE_OUT": os.environ["PDLAUNCH_FAKE_OUT"]}'
)

@dataclass
class Ran:
    argv: list[str]
    env: dict[str, str]


@pytest.fixture
def fakebin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("vllm", "vllm-router", "python"):
        exe = bin_dir / name
        exe.write_text(FAKE.format(python=sys.executable))
        exe.chmod(0o755)
    for name in ("docker", "podman"):
        exe = bin_dir / name
        exe.write_text(container_runtime_standin(IMAGE_ENV % INHERITED_LD))
        exe.chmod(0o755)
    return bin_dir


def render(topology: Path, out: Path) -> dict[str, Path]:
    topo, source = load(topology)
    findings = validate(topo, source)
    assert not has_errors(findings), [f.message for f in findings]
    written = write_files(render_plan(build_plan(topo)), out)
    return {p.stem: p for p in written if p.suffix == ".sh"}


def run_script(script: Path, fakebin: Path, **extra_env: str) -> Ran:
    out = script.with_suffix(".ran.json")
    env = {
        "PATH": f"{fakebin}:/usr/bin:/bin",
        "PDLAUNCH_FAKE_OUT": str(out),
        "LD_LIBRARY_PATH": INHERITED_LD,
        "HOME": str(script.parent),
        **extra_env,
    }
    proc = subprocess.run(
        [str(script)], env=env, cwd=script.parent, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"{script.name} failed: {proc.stderr}"
    data = json.loads(out.read_text(encoding="utf-8"))
    return Ran(data["argv"], data["env"])


# --------------------------------------------------------------------------- seed text


@dataclass
class SeedCommand:
    argv: list[str]
    env: dict[str, str]  # exported at the point of the command, plus `NAME=v cmd` prefixes


_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_ASSIGN = re.compile(r"[A-Za-z_]\w*=", re.S)


def _expand(word: str, variables: dict[str, str]) -> str:
    # A variable the test data does not define is a KeyError: the mapping must be complete.
    return _VAR.sub(lambda m: variables[m[1] or m[2]], word)


def parse_shell(text: str, variables: dict[str, str], literal: dict[str, str]) -> list[SeedCommand]:
    """A small interpreter for the guides' shell snippets: `NAME=v`, `export NAME[=v]`,
    `NAME=v cmd ...`, multi-line `NAME="..."` argument blocks expanded where they are used
    (`$PREFILL_ARGS`), backslash continuations and comments. `literal` maps placeholders
    that are not shell variables ({MODEL_PATH}, $(hostname -i)) to their values."""
    for placeholder, value in literal.items():
        text = text.replace(placeholder, value)
    blocks: dict[str, str] = {}

    def grab(m: re.Match[str]) -> str:
        # Inside double quotes \" is a quote; the guide means the JSON inside '...'.
        blocks[m[1]] = m[2].replace('\\"', '"')
        return ""

    text = re.sub(r'^(\w+)="\n(.*?)\n"$', grab, text, flags=re.M | re.S)
    text = text.replace("\\\n", " ")
    shell_vars = dict(variables)
    env: dict[str, str] = {}
    commands = []
    pending = ""
    for raw in text.splitlines():
        line = pending + raw
        while (new := re.sub(r"\$(\w+)", lambda m: blocks.get(m[1], m[0]), line)) != line:
            line = new
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # a quoted string goes on (the hetero guide's JSON)
            pending = line + "\n"
            continue
        pending = ""
        words = [_expand(w, shell_vars) for w in words]
        if not words:
            continue
        if words[0] == "export":
            for w in words[1:]:
                name, eq, value = w.partition("=")
                if eq:
                    shell_vars[name] = value
                env[name] = shell_vars[name]
            continue
        prefix = {}
        while words and _ASSIGN.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            prefix[name] = value
        if not words:
            shell_vars.update(prefix)
            continue
        commands.append(SeedCommand(words, {**env, **prefix}))
    assert not pending, f"unterminated quote in {pending!r}"
    return commands


def vllm_serve(commands: list[SeedCommand]) -> SeedCommand:
    found = [c for c in commands if c.argv[:2] == ["vllm", "serve"]]
    assert len(found) == 1, [c.argv[:3] for c in commands]
    return found[0]


# --------------------------------------------------------------------------- comparison


def _norm_flag(name: str) -> str:
    return name.replace("_", "-")


def parse_argv(argv: list[str]) -> tuple[list[str], list[tuple[str, str | None]]]:
    positionals: list[str] = []
    flags: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("-"):
            name, eq, value = word.partition("=")
            if not eq:
                if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    value, i = argv[i + 1], i + 1
                else:
                    value = None
            flags.append((_norm_flag(name), value))
        else:
            positionals.append(word)
        i += 1
    return positionals, flags


def _json(value: str | None) -> object:
    def fix(x: object) -> object:
        if isinstance(x, dict):
            return {k: fix(v) for k, v in x.items()}
        if isinstance(x, list):
            return [fix(v) for v in x]
        return {"True": True, "False": False}.get(x, x) if isinstance(x, str) else x

    if value is None or not value.lstrip().startswith("{"):
        return value
    return fix(json.loads(value))


def _contained(seed: object, rendered: object) -> bool:
    if isinstance(seed, dict) and isinstance(rendered, dict):
        return all(k in rendered and _contained(v, rendered[k]) for k, v in seed.items())
    return seed == rendered


def differences(seed: SeedCommand, ran: Ran) -> dict[str, str]:
    """Every seed item the running process does not have: {item id: what differs}.

    Item ids: `env:NAME`, `flag:--name`, `kv:key` (a key of --kv-transfer-config),
    `positional`."""
    out: dict[str, str] = {}
    s_pos, s_flags = parse_argv(seed.argv)
    r_pos, r_flags = parse_argv(ran.argv)
    # The GB200 guide passes the model twice (positional and `--model` in COMMON_ARGS);
    # `vllm serve MODEL` is the one form pdlaunch writes.
    models = [v for n, v in s_flags if n == "--model"]
    s_flags = [(n, v) for n, v in s_flags if n != "--model"]
    for m in models:
        if m not in s_pos:
            s_pos.append(m)
    if s_pos != r_pos:
        out["positional"] = f"seed {s_pos} != rendered {r_pos}"
    for name in dict.fromkeys(n for n, _ in s_flags):
        s_vals = [_json(v) for n, v in s_flags if n == name]
        r_vals = [_json(v) for n, v in r_flags if n == name]
        if name == "--kv-transfer-config" and len(s_vals) == len(r_vals) == 1:
            s_cfg, r_cfg = s_vals[0], r_vals[0]
            assert isinstance(s_cfg, dict) and isinstance(r_cfg, dict)
            for key, value in s_cfg.items():
                if key not in r_cfg or not _contained(value, r_cfg[key]):
                    out[f"kv:{key}"] = f"seed {value!r} != rendered {r_cfg.get(key, '<absent>')!r}"
            continue
        if len(s_vals) != len(r_vals) or not all(
            _contained(s, r) for s, r in zip(s_vals, r_vals, strict=True)
        ):
            out[f"flag:{name}"] = f"seed {s_vals} != rendered {r_vals}"
    for key, value in seed.env.items():
        if ran.env.get(key) != value:
            out[f"env:{key}"] = f"seed {value!r} != rendered {ran.env.get(key, '<unset>')!r}"
    return out


def assert_matches_seed(seed: SeedCommand, ran: Ran, allowed: dict[str, str]) -> None:
    seed_items = set(differences(seed, Ran([], {})))  # everything the seed sets
    seed_items |= {f"kv:{k}" for k in seed_kv(seed)}
    stale = set(allowed) - seed_items
    assert not stale, f"allowlist names items the seed does not have: {stale}"
    unexpected = {k: v for k, v in differences(seed, ran).items() if k not in allowed}
    assert not unexpected, "rendered process differs from the seed:\n" + "\n".join(
        f"  {k}: {v}" for k, v in sorted(unexpected.items())
    )


def seed_kv(seed: SeedCommand) -> dict:
    _, flags = parse_argv(seed.argv)
    cfg = [_json(v) for n, v in flags if n == "--kv-transfer-config"]
    return cfg[0] if cfg and isinstance(cfg[0], dict) else {}


def flag_values(ran: Ran, name: str) -> list[str | None]:
    return [v for n, v in parse_argv(ran.argv)[1] if n == name]
