"""Slurm's own OCI containers (`slurm.container_support: oci`, pdlaunch/backends/slurm/oci.py):
the step flag the driver renders in each mode, the settings refused with their reason, and what
a bundle's config.json must hold, judged on real bundle directories.

The flag is srun's own, as Slurm 22.05.8 documents it (tests/fixtures/slurm/srun-container.txt)
and as this machine's srun lists it (`srun --help`, Debian 12's slurm-client).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm.client import pyxis_loaded
from pdlaunch.backends.slurm.oci import bundle_findings
from pdlaunch.backends.slurm.record import SlurmRunError
from pdlaunch.kv.progress import SHIM_DIR
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import LoadError, load_text
from pdlaunch.spec.slurm_options import SlurmError, SlurmOptions
from tests.support.cli_runner import pdl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
IMAGE = "nvcr.io#nvidia/vllm:25.09-py3"


def _topo(tmp_path: Path, **container: object) -> dict:
    return {
        "deployment": "oci",
        "model": {"name": "/models/tiny"},
        "defaults": {
            "work_dir": str(tmp_path / "work"),
            "container": {"image": IMAGE, "runtime": "pyxis", "mounts": ["/models:/models:ro"],
                          **container},
        },
        "prefill": [{"host": "node1", "device": "cpu", "port": 8100}],
        "decode": [{"host": "node2", "device": "cpu", "port": 8200}],
        "router": {"host": "node1", "port": 8123, "container": {"enabled": False}},
    }  # fmt: skip


def _plan(topo: dict):
    t, _ = load_text(yaml.safe_dump(topo), "t.yaml")
    return build_plan(t)


def _step_flags(job: str, name: str) -> list[str]:
    lines = job.splitlines()
    start = next(i for i, ln in enumerate(lines) if f"--job-name={name}" in ln)
    return shlex.split(lines[start + 2].rstrip("\\"))


def test_the_srun_flag_is_slurms_own() -> None:
    text = (FIXTURES / "srun-container.txt").read_text()
    assert "\\fB\\-\\-container\\fR=<\\fIpath_to_container\\fR>" in text
    assert "Absolute path to OCI container bundle." in text


def test_pyxis_mode_renders_pyxis_and_oci_mode_the_bundle(tmp_path: Path) -> None:
    # pass_env needs no flag under oci: Slurm hands the step's environment to the container
    plan = _plan(_topo(tmp_path, pass_env=["HF_HOME"]))
    pyxis = slurm.sbatch_script(plan, SlurmOptions())
    assert f"--container-image={IMAGE}" in _step_flags(pyxis, "prefill-0")
    bundle = "/shared/bundles/vllm-25.09"
    opts = SlurmOptions(container_support="oci", oci_bundles={IMAGE: bundle})
    job = slurm.sbatch_script(plan, opts)
    for name in ("prefill-0", "decode-0"):
        assert _step_flags(job, name) == [f"--container={bundle}"]
    assert "--container-image" not in job and "--container-mounts" not in job
    router = next(i for i, ln in enumerate(job.splitlines()) if "--job-name=router" in ln)
    assert not any("--container" in ln for ln in job.splitlines()[router : router + 4])
    # the step runs in the bundle already: its script execs vLLM itself, as under pyxis
    scripts = {f.name: f.content for f in slurm.render_job(plan, opts)}
    assert "podman run" not in scripts["prefill-0.sh"]
    assert "exec vllm serve" in scripts["prefill-0.sh"]
    subprocess.run(["bash", "-n"], input=job, text=True, check=True)


@pytest.mark.parametrize(
    ("container", "opts", "words"),
    [
        ({}, {}, ["image nvcr.io#nvidia/vllm:25.09-py3 has no OCI bundle", "umoci unpack",
                  "slurm.oci_bundles"]),
        ({"extra_args": ["--container-remap-root"]}, {IMAGE: "/b"},
         ["extra_args (--container-remap-root) are pyxis's"]),
    ],
)  # fmt: skip
def test_what_srun_cannot_carry_is_refused_with_the_reason(
    tmp_path: Path, container: dict, opts: dict, words: list[str]
) -> None:
    plan = _plan(_topo(tmp_path, **container))
    with pytest.raises(SlurmError) as exc:
        slurm.sbatch_script(plan, SlurmOptions(container_support="oci", oci_bundles=opts))
    assert all(w in str(exc.value) for w in words), str(exc.value)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"container_support": "enroot"}, "container_support 'enroot': give pyxis, oci, auto"),
        ({"oci_bundles": {IMAGE: "bundles/vllm"}}, "give the absolute path of the OCI bundle"),
        ({"oci_bundles": {IMAGE: "/shared/../etc"}}, "without '..'"),
        ({"oci_bundles": {IMAGE: "/shared/a b"}}, "give the absolute path"),
        ({"oci_bundles": {IMAGE: "/shared/%n"}}, "give the absolute path"),
    ],
)
def test_bad_settings_are_refused(kw: dict, words: str) -> None:
    with pytest.raises(SlurmError, match=words.replace("(", r"\(").replace(")", r"\)")):
        SlurmOptions(**kw)


def test_the_slurm_block_is_checked_with_its_line(tmp_path: Path) -> None:
    topo = _topo(tmp_path)
    topo["slurm"] = {"container_support": "oci", "oci_bundles": {IMAGE: "relative/bundle"}}
    with pytest.raises(LoadError) as exc:
        load_text(yaml.safe_dump(topo, sort_keys=False), "t.yaml")
    assert "oci_bundles" in str(exc.value) and "absolute path" in str(exc.value)


def _bundle(root: Path, mounts: list[dict], namespaces: list[str] = (), cwd: str = "/") -> Path:
    (root / "rootfs").mkdir(parents=True)
    config = {
        "ociVersion": "1.0.2",
        "process": {"cwd": cwd, "args": ["sh"]},
        "root": {"path": "rootfs"},
        "mounts": mounts,
        "linux": {"namespaces": [{"type": t} for t in namespaces]},
    }
    (root / "config.json").write_text(json.dumps(config))
    return root


def _bind(src: str, dst: str | None = None) -> dict:
    return {"destination": dst or src, "source": src, "type": "bind", "options": ["rbind"]}


def test_a_bundle_that_binds_what_the_steps_need_passes(tmp_path: Path) -> None:
    plan = _plan(_topo(tmp_path))
    work = plan.by_role("prefill")[0].work_dir
    # CPU engines get the NIXL progress shim mounted at pdlaunch's own path (plan/build.py).
    shim = _bind(str(SHIM_DIR))
    b = _bundle(tmp_path / "b", [_bind(str(tmp_path)), _bind("/models"), shim], ["pid", "mount"],
                work)  # fmt: skip
    opts = SlurmOptions(container_support="oci", oci_bundles={IMAGE: str(b)})
    assert bundle_findings(plan, opts) == []
    # runc spec's cwd "/": the engines would not start in their work dir (srun --chdir does
    # not reach the container), which is said, not refused
    _bundle(tmp_path / "c", [_bind(str(tmp_path)), _bind("/models"), shim])
    opts = SlurmOptions(container_support="oci", oci_bundles={IMAGE: str(tmp_path / "c")})
    (cwd,) = bundle_findings(plan, opts)
    assert cwd.severity == "warning" and "start in / (the bundle's process.cwd)" in cwd.message
    assert bundle_findings(plan, SlurmOptions()) == []  # pyxis: no bundle to read


def test_a_bundle_missing_the_work_dir_or_a_mount_is_an_error_naming_the_entry(
    tmp_path: Path,
) -> None:
    plan = _plan(_topo(tmp_path))
    b = _bundle(tmp_path / "b", [_bind("/proc")], ["network", "ipc"])
    findings = bundle_findings(
        plan, SlurmOptions(container_support="oci", oci_bundles={IMAGE: str(b)})
    )
    errors = [f for f in findings if f.severity == "error"]
    net = [f for f in errors if "network namespace" in f.message]
    assert len(net) == 1 and 'remove {"type": "network"}' in net[0].fix
    binds = [f for f in errors if "does not bind" in f.message]
    assert [f.message.split(":")[0] for f in binds] == ["prefill-0", "decode-0"]
    work = plan.by_role("prefill")[0].work_dir
    assert f"{work} at {work}" in binds[0].message and "/models at /models" in binds[0].message
    assert json.dumps(_bind("/models")) in binds[0].fix
    # the cpu kind shares the host's IPC (UCX shared memory): a private IPC namespace breaks it
    assert any("own IPC namespace" in f.message for f in errors)


def test_a_bundle_this_machine_cannot_see_or_read(tmp_path: Path) -> None:
    plan = _plan(_topo(tmp_path))

    def findings(path: Path):
        opts = SlurmOptions(container_support="oci", oci_bundles={IMAGE: str(path)})
        return bundle_findings(plan, opts)

    (gone,) = findings(tmp_path / "absent")
    assert gone.severity == "warning" and "is not on this machine" in gone.message
    (tmp_path / "sif").mkdir()
    (bare,) = findings(tmp_path / "sif")
    assert bare.severity == "warning" and "IgnoreFileConfigJson=true" in bare.message
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100 + "]" * 100)
    (bad,) = findings(deep)
    assert bad.severity == "error" and "nests deeper than" in bad.message
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    (odd,) = findings(fifo)  # refused at once, not waited on
    assert odd.severity == "error" and "not a regular file" in odd.message


def test_auto_asks_this_machines_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Debian's srun 22.05.8, no pyxis: its help lists --container, no plugin options
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1 State=UNKNOWN\n"
        "PartitionName=p Nodes=n1 Default=YES\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert pyxis_loaded() is False
    conf.write_text("Bogus=1\n")  # srun cannot say: auto is refused, not guessed
    with pytest.raises(SlurmRunError, match="srun --help failed"):
        pyxis_loaded()


def test_validate_names_the_bundle_problem_in_one_line(tmp_path: Path) -> None:
    topo = _topo(tmp_path)
    b = _bundle(tmp_path / "b", [_bind("/models")])
    topo["slurm"] = {"container_support": "oci", "oci_bundles": {IMAGE: str(b)},
                     "gpus_per_node": 1, "cpus_per_node": 8}  # fmt: skip
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo, sort_keys=False))
    run = pdl("validate", path, "--backend", "slurm")
    assert run.rc == 1, run
    assert "slurm-oci-bundle" in run.output and "does not bind" in run.output
    topo["slurm"]["oci_bundles"] = {}
    path.write_text(yaml.safe_dump(topo, sort_keys=False))
    run = pdl("validate", path, "--backend", "slurm")
    assert run.rc == 1 and "has no OCI bundle" in run.output, run
