"""Engines in containers, without a container runtime: the `container:` setting (schema and
rules), the spec the plan carries, the script `render` writes (run by bash with a stand-in
runtime that records its argv and environment), and the Slurm (pyxis) and Kubernetes renders.

The device kinds' flags are compared with the guides' own commands, copied verbatim into
tests/fixtures/seeds/ (ascend-mooncake-pd-openfuyao.txt `docker-run`,
hetero-pd-cuda-gaudi-nixl-rev2.txt `prerequisites`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from pdlaunch.backends.k8s import manifests as k8s
from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm.job import SlurmOptions
from pdlaunch.kv import progress
from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import render_plan, render_secrets
from pdlaunch.rules import validate
from pdlaunch.spec.load import load, load_text
from tests.support.seed_excerpts import excerpts

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "topologies"

BASE = """
deployment: ctr
model: {name: /models/tiny, served_name: tiny, dtype: float32, max_model_len: 1024}
defaults:
  env: {HF_HUB_OFFLINE: "1", HF_TOKEN: "${env:HF_TOKEN}", ODD: "a b'c $HOME"}
  container: {image: "localhost/pdl-engine:1", runtime: podman, mounts: ["/models:/models:ro"]}
prefill: [{host: 127.0.0.1, bind: 127.0.0.1, device: cpu, port: 8100, block_size: 32}]
decode: [{host: 127.0.0.1, bind: 127.0.0.1, device: cpu, port: 8200, block_size: 32}]
router: {host: 127.0.0.1, port: 8123, prometheus_port: 29123}
"""


def _topo(text: str = BASE, **changes: object):
    data = yaml.safe_load(text)
    for dotted, value in changes.items():
        node = data
        keys = dotted.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        node[keys[-1]] = value
    return load_text(yaml.safe_dump(data), "t.yaml")


def _findings(text: str = BASE, **changes: object):
    topo, src = _topo(text, **changes)
    return [f for f in validate(topo, src) if f.rule.startswith("container-")]


# -- schema and rules --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value,words",
    [
        ("mounts", ["models:/models"], "SRC:DST"),
        ("mounts", ["/a:/b:ro;rm -rf /"], "SRC:DST"),
        ("devices", ["dev/x"], "HOST_PATH"),
        ("shm_size", "lots", "size"),
        ("image", "bad image; rm", "image reference"),
        ("pass_env", ["A-B"], "variable name"),
        ("runtime", "lxc", "docker"),
        ("colour", "red", "unknown key"),
    ],
)
def test_bad_container_values_are_load_errors(field, value, words):
    from pdlaunch.spec.load import LoadError

    with pytest.raises(LoadError) as err:
        _topo(**{f"defaults.container.{field}": value})
    assert words in str(err.value)
    assert "defaults.container" in str(err.value)


def test_missing_image_is_one_error_at_the_default():
    data = yaml.safe_load(BASE)
    del data["defaults"]["container"]["image"]
    found = _findings(yaml.safe_dump(data))
    assert [(f.rule, f.severity, f.field) for f in found] == [
        ("container-image", "error", ("defaults", "container", "image"))
    ]
    assert found[0].fix and found[0].source


def test_router_can_opt_out_and_instances_override():
    topo, _ = _topo(
        **{
            "router.container": {"enabled": False},
            "decode.0.container": {"image": "other:2", "mounts": ["/x:/x"]},
        }
    )
    plan = build_plan(topo)
    assert plan.router.container is None
    p, d = plan.by_role("prefill")[0].container, plan.by_role("decode")[0].container
    assert p is not None and d is not None
    assert (p.image, d.image) == ("localhost/pdl-engine:1", "other:2")
    # Lists add to the default's; scalars replace.
    # the NIXL progress shim (a CPU instance's default) is mounted where PYTHONPATH names it
    shim = f"{progress.SHIM_DIR}:{progress.SHIM_DIR}:ro"
    assert d.mounts == ["/models:/models:ro", "/x:/x", shim] and d.runtime == "podman"
    assert d.name == "pdl-ctr-decode-0" and d.labels["pdlaunch.process"] == "decode-0"
    assert d.cid_path == "/tmp/pdlaunch/ctr/run/decode-0.cid"


@pytest.mark.parametrize(
    "args,words",
    [
        (["--name=x"], "--name"),
        (["-d"], "foreground"),
        (["--network", "bridge"], "host network"),
        (["--net=slirp4netns"], "host network"),
        (["-p", "8100:8100"], "host port"),
        (["--entrypoint=/bin/sh"], "entrypoint"),
        (["--ipc=private"], "IPC"),
    ],
)
def test_flags_pdlaunch_manages_are_refused(args, words):
    found = _findings(**{"defaults.container.extra_args": args})
    assert [f.rule for f in found] == ["container-flags"], found
    assert words in found[0].message
    assert found[0].field == ("defaults", "container", "extra_args")


def test_host_network_and_other_flags_pass():
    assert (
        _findings(**{"defaults.container.extra_args": ["--net=host", "--ulimit", "nofile=1:1"]})
        == []
    )


def test_device_flags_off_must_still_give_what_ascend_needs():
    text = (TOPOLOGIES / "ascend-mooncake-tp2.yaml").read_text()
    assert [f for f in _findings(text) if f.severity == "error"] == []
    found = _findings(text, **{"prefill.0.container": {"device_flags": False}})
    assert [(f.rule, f.field) for f in found] == [
        ("container-device", ("prefill", 0, "container", "device_flags"))
    ]
    for node in ("/dev/davinci_manager", "/dev/hisi_hdc", "/dev/devmm_svm"):
        assert node in found[0].message
    # Giving them by hand satisfies it.
    nodes = ["/dev/davinci_manager", "/dev/hisi_hdc", "/dev/devmm_svm"]
    own = {"device_flags": False, "devices": nodes}
    assert _findings(text, **{"prefill.0.container": own}) == []


def test_device_flags_off_on_rdma_needs_infiniband_or_privileged():
    text = (TOPOLOGIES / "cuda-prefill-gaudi-decode.yaml").read_text()
    cuda = {"image": "c:1", "device_flags": False}
    found = _findings(text, **{"prefill.0.container": cuda})
    assert found and "/dev/infiniband" in found[0].message and "--ipc=host" in found[0].message
    ok = {**cuda, "devices": ["/dev/infiniband"], "extra_args": ["--ipc=host"]}
    assert _findings(text, **{"prefill.0.container": ok}) == []


def test_model_outside_every_mount_is_a_warning():
    found = _findings(**{"defaults.container.mounts": ["/data:/data"]})
    assert {(f.rule, f.severity) for f in found} == {("container-model-mount", "warning")}
    assert _findings() == []


# -- the guides' flags -------------------------------------------------------------------------
def _words_after(command: str, flag: str) -> list[str]:
    words = shlex.split(command.replace("\\ ", " "))
    return [
        w.split("=", 1)[1] if "=" in w else words[i + 1]
        for i, w in enumerate(words)
        if w == flag or w.startswith(flag + "=")
    ]


def test_ascend_container_carries_the_guides_devices_mounts_and_shm():
    guide = excerpts("ascend-mooncake-pd-openfuyao.md")["docker-run"].removeprefix("bash")
    plan = build_plan(load(TOPOLOGIES / "ascend-mooncake-tp2.yaml")[0])
    c = plan.by_role("prefill")[0].container
    assert c is not None and c.runtime == "docker"
    assert set(c.devices) == set(_words_after(guide, "--device"))
    guide_mounts = set(_words_after(guide, "-v")) - {"XXX"}
    assert guide_mounts == set(c.mounts)
    assert [c.shm_size] == _words_after(guide, "--shm-size")
    assert c.privileged and "--privileged=true" in guide and "--net=host" in guide


def test_hetero_containers_carry_the_guides_images_and_flags():
    guide = excerpts("hetero-pd-cuda-gaudi-nixl-rev2.md")["prerequisites"]
    assert "--privileged --net=host --ipc=host" in guide
    for name in ("cuda-prefill-gaudi-decode", "gaudi-prefill-cuda-decode"):
        plan = build_plan(load(TOPOLOGIES / f"{name}.yaml")[0])
        for p in plan.processes:
            if p.role == "router":
                assert p.container is None
                continue
            c = p.container
            assert c is not None and c.privileged and c.ipc_host and c.network_host
            assert f"{'CUDA' if p.device == 'cuda' else 'Gaudi'} node: {c.image}" in guide
        script = {f.name: f.content for f in render_plan(plan)}["prefill-0.sh"]
        assert "--privileged" in script and "--ipc=host" in script and "--net=host" in script


# -- the script, run by bash with a stand-in runtime --------------------------------------------
FAKE_RUNTIME = """#!/bin/sh
# Records how the script called the runtime: argv (NUL-separated) and the variables it was given.
printf '%s\\0' "$@" > "$PDL_FAKE_OUT/argv"
env > "$PDL_FAKE_OUT/env"
"""


def test_script_runs_the_plans_argv_in_the_container_with_env_by_name(tmp_path: Path):
    topo, _ = _topo(
        **{
            "defaults.work_dir": str(tmp_path / "work"),
            "prefill.0.env": {"SPACED": "x y"},
            # no PYTHONPATH prepended inside (tests/plan/test_nixl_progress.py covers it)
            "kv_connector.progress_delay_us": 0,
        }
    )
    plan = build_plan(topo)
    p = plan.by_role("prefill")[0]
    files = {f.name: f.content for f in render_plan(plan)}
    script = files["prefill-0.sh"]
    assert "hf_" not in script
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "podman").write_text(FAKE_RUNTIME)
    (bindir / "podman").chmod(0o755)
    (tmp_path / "s.sh").write_text(script)
    Path(p.secrets_path).parent.mkdir(parents=True)
    Path(p.secrets_path).write_text(render_secrets({"HF_TOKEN": "hf_SECRET value"}))
    os.chmod(p.secrets_path, 0o600)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PDL_FAKE_OUT": str(tmp_path)}
    res = subprocess.run(
        ["bash", str(tmp_path / "s.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    image = argv.index("localhost/pdl-engine:1")
    run = argv[:image]
    # The engine's argv is the plan's, unchanged: its first word replaces the image's
    # ENTRYPOINT (vllm/vllm-openai's `vllm serve` would run before it), the rest follow.
    assert [run[run.index("--entrypoint") + 1], *argv[image + 1 :]] == p.argv
    assert run[:3] == ["run", "--rm", "--pull=never"]
    assert run[run.index("--name") + 1] == "pdl-ctr-prefill-0"
    assert run[run.index("--cidfile") + 1] == p.container.cid_path
    assert "--net=host" in run and "--ipc=host" in run  # cpu: UCX shared memory
    # Every variable goes in by name (no value on the runtime's command line) ...
    passed = [run[i + 1] for i, w in enumerate(run) if w == "--env"]
    assert set(passed) == {*p.env, "HF_TOKEN"}
    assert all("=" not in v for v in passed)
    assert "hf_SECRET" not in "\0".join(argv)
    # ... with the value the plan computed, secrets from the 0600 file.
    got = dict(
        line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line
    )
    assert got["HF_TOKEN"] == "hf_SECRET value" and got["SPACED"] == "x y"
    assert got["ODD"] == "a b'c $HOME"


def test_a_container_of_an_earlier_start_still_there_is_refused(tmp_path: Path):
    topo, _ = _topo(**{"defaults.work_dir": str(tmp_path / "work"), "defaults.env": {}})
    plan = build_plan(topo)
    p = plan.by_role("decode")[0]
    script = {f.name: f.content for f in render_plan(plan)}["decode-0.sh"]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # `podman container inspect ID` succeeds: the earlier container exists.
    (bindir / "podman").write_text(
        '#!/bin/sh\n[ "$1" = container ] && exit 0\necho ran > "$PDL_FAKE_OUT/ran"\n'
    )
    (bindir / "podman").chmod(0o755)
    cid = Path(p.container.cid_path)
    cid.parent.mkdir(parents=True)
    cid.write_text("abc123")  # as podman writes it: no newline
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PDL_FAKE_OUT": str(tmp_path)}
    res = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 95 and "abc123" in res.stderr and "pdlaunch down" in res.stderr
    assert not (tmp_path / "ran").exists() and cid.read_text() == "abc123"
    # Gone: the stale file is removed and the engine starts.
    (bindir / "podman").write_text(
        '#!/bin/sh\n[ "$1" = container ] && exit 1\necho ran > "$PDL_FAKE_OUT/ran"\n'
    )
    res = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and (tmp_path / "ran").exists() and not cid.exists()


def test_ld_library_path_is_prepended_inside_to_the_images_own():
    plan = build_plan(load(TOPOLOGIES / "ascend-mooncake-tp2.yaml")[0])
    p = plan.by_role("prefill")[0]
    script = {f.name: f.content for f in render_plan(plan)}["prefill-0.sh"]
    assert "export PDLAUNCH_PREPEND_LD_LIBRARY_PATH=/usr/local/Ascend" in script
    assert "--env LD_LIBRARY_PATH" not in script
    # What the in-container sh does, with an image value of /img/lib.
    from pdlaunch.plan.render import container_argv

    argv = container_argv(p)
    image = argv.index(p.container.image)
    inner = [argv[argv.index("--entrypoint") + 1], *argv[image + 1 :]]
    assert inner[0] == "sh"
    res = subprocess.run(
        [
            *inner[:4],
            "sh",
            "-c",
            'echo "$LD_LIBRARY_PATH|${PDLAUNCH_PREPEND_LD_LIBRARY_PATH-unset}"',
        ],
        env={
            "PATH": "/usr/bin:/bin",
            "LD_LIBRARY_PATH": "/img/lib",
            "PDLAUNCH_PREPEND_LD_LIBRARY_PATH": "/usr/local/Ascend/x",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.stdout.strip() == "/usr/local/Ascend/x:/img/lib|unset"


# -- Slurm (pyxis) and Kubernetes ---------------------------------------------------------------
def test_slurm_pyxis_flags_and_the_step_script_execs_inside(tmp_path: Path):
    topo, _ = _topo(
        **{
            "defaults.container": {
                "image": "nvcr.io#nvidia/vllm:25.09",
                "runtime": "pyxis",
                "mounts": ["/models:/models:ro"],
                "pass_env": ["HF_HOME"],
            },
            "router.container": {"enabled": False},
        }
    )
    plan = build_plan(topo)
    files = {f.name: f.content for f in slurm.render_job(plan, SlurmOptions())}
    job = files[slurm.DRIVER_NAME]
    p = plan.by_role("prefill")[0]
    lines = job.splitlines()
    start = next(i for i, ln in enumerate(lines) if "--job-name=prefill-0" in ln)
    flags = shlex.split(lines[start + 2].rstrip("\\"))
    assert "--container-image=nvcr.io#nvidia/vllm:25.09" in flags
    assert "--container-name=pdl-ctr-prefill-0" in flags
    shim = f"{progress.SHIM_DIR}:{progress.SHIM_DIR}:ro"
    assert f"--container-mounts={p.work_dir}:{p.work_dir},/models:/models:ro,{shim}" in flags
    assert "--container-env=HF_HOME" in flags
    router = next(i for i, ln in enumerate(lines) if "--job-name=router" in ln)
    assert not any("--container-" in ln for ln in lines[router : router + 4])
    # The step runs in the image already: its script execs vLLM itself.
    assert "podman run" not in files["prefill-0.sh"] and "exec vllm serve" in files["prefill-0.sh"]
    subprocess.run(["bash", "-n"], input=job, text=True, check=True)


def test_ssh_script_of_a_pyxis_process_refuses_to_run(tmp_path: Path):
    topo, _ = _topo(**{"defaults.container.runtime": "pyxis"})
    script = {f.name: f.content for f in render_plan(build_plan(topo))}["decode-0.sh"]
    res = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "HF_TOKEN": "x"},
    )
    assert res.returncode == 2 and "pyxis" in res.stderr and "slurm" in res.stderr


def test_k8s_pods_take_image_mounts_devices_privileged_and_shm():
    plan = build_plan(load(TOPOLOGIES / "ascend-mooncake-tp2.yaml")[0])
    from pdlaunch.backends.k8s.pods import apply_container_spec, pod_template

    p = plan.by_role("prefill")[0]
    container = {"name": "vllm", "env": [], "volumeMounts": []}
    apply_container_spec(container, p.container)
    pod = pod_template(container, {"a": "b"}, p.container)
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: vols[m["name"]] for m in container["volumeMounts"]}
    assert mounts["/usr/local/Ascend/driver"]["hostPath"]["path"] == "/usr/local/Ascend/driver"
    assert mounts["/dev/davinci_manager"]["hostPath"]["path"] == "/dev/davinci_manager"
    assert container["securityContext"] == {"privileged": True}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "500Gi"}


def test_k8s_export_uses_the_topologys_image():
    topo, _ = _topo(
        **{
            "defaults.container.image": "registry.example/cpu-vllm:1",
            "router.container": {"image": "registry.example/router:1"},
        }
    )
    exp = k8s.build(build_plan(topo))
    images = {c["image"] for o in exp.objects for c in _containers(o)}
    assert images == {"registry.example/cpu-vllm:1", "registry.example/router:1"}
    text = json.dumps(exp.objects)
    assert '"mountPath": "/models"' in text and '"readOnly": true' in text


def _containers(obj):
    found = []

    def walk(x):
        if isinstance(x, dict):
            if "containers" in x and isinstance(x["containers"], list):
                found.extend(x["containers"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(obj)
    return found


def test_readme_examples_load(tmp_path: Path):
    """Each runtime's example in README.md loads and validates without errors."""
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in text.split("```yaml")[1:] if "container:" in b.split("```")[0]]
    blocks = [textwrap.dedent(b.split("```")[0]) for b in blocks]
    runtimes = set()
    for b in blocks:
        data = yaml.safe_load(b)
        if "deployment" not in data:
            continue
        topo, src = load_text(b, "README.md")
        assert not [f for f in validate(topo, src) if f.severity == "error"]
        runtimes |= {p.container.runtime for p in build_plan(topo).processes if p.container}
    assert runtimes >= {"docker", "podman", "pyxis"}
