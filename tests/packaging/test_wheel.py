"""The wheel ships the templates: install it into a fresh venv and render from there.

The fresh venv gets only the wheel (--no-deps); the runtime deps come from this venv's
site-packages on PYTHONPATH. The editable install's .pth file is not processed from
PYTHONPATH, and the command runs outside the repository, so the source tree cannot leak in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.kv import progress
from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import render_plan, write_files
from pdlaunch.spec.load import load

ROOT = Path(__file__).resolve().parents[2]


def sh(*cmd: str | Path, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def build_wheel(out: Path) -> Path:
    cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", out]
    if importlib.util.find_spec("hatchling") is not None:
        cmd.append("--no-isolation")  # no download of the build backend
    sh(*cmd, ROOT, timeout=300, cwd=ROOT)
    (wheel,) = out.glob("pdlaunch-*.whl")
    return wheel


def test_installed_wheel_renders_like_the_source_tree(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"pdlaunch/templates/process.sh.j2", "pdlaunch/templates/index.md.j2"} <= names
    assert {
        "pdlaunch/templates/slurm/job.sh.j2",
        "pdlaunch/templates/slurm/node-runner.sh.j2",
        "pdlaunch/templates/slurm/http-probe.sh.j2",
    } <= names
    assert "pdlaunch/topologies/local-cpu.yaml" in names
    # The sh the hosts send (pdlaunch/hosts/sh), read as package data: the Slurm render below
    # embeds sh/exec-owned.sh from the installed wheel.
    sh_dir = ROOT / "pdlaunch" / "hosts" / "sh"
    host_scripts = {f"pdlaunch/hosts/sh/{p.name}" for p in sh_dir.glob("*.sh")}
    assert "pdlaunch/hosts/sh/stop.sh" in host_scripts and host_scripts <= names

    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, timeout=120)
    py = venv / "bin" / "python"
    sh(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", wheel,
       timeout=300)  # fmt: skip

    work = tmp_path / "work"
    work.mkdir()
    topology = work / "local-cpu.yaml"
    shutil.copy(ROOT / "topologies" / "local-cpu.yaml", topology)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    env["PYTHONNOUSERSITE"] = "1"

    where = sh(
        py,
        "-c",
        "import json, pdlaunch, pdlaunch.plan.render as r, pdlaunch.kv.progress as k;"
        "print(json.dumps([pdlaunch.__file__, str(r.templates_dir()), str(k.SHIM_DIR)]))",
        cwd=work,
        env=env,
        timeout=120,
    )
    module, templates, shim = (Path(p).resolve() for p in json.loads(where.stdout))
    assert module.is_relative_to(venv.resolve()), module
    assert templates.is_relative_to(venv.resolve()), templates
    assert (templates / "process.sh.j2").is_file()
    # the NIXL progress shim ships in the wheel; the engines' PYTHONPATH names it there
    assert shim.is_relative_to(venv.resolve()) and (shim / "sitecustomize.py").is_file(), shim

    sh(py, "-m", "pdlaunch", "render", topology.name, "-o", "out", cwd=work, env=env,
       timeout=120)  # fmt: skip

    topo, _ = load(topology)
    write_files(render_plan(build_plan(topo)), tmp_path / "expected")
    got, expected = work / "out", tmp_path / "expected"
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in expected.iterdir())
    for path in expected.iterdir():
        # the one difference: where each pdlaunch has its shim (the plan names its own)
        want = path.read_text().replace(str(progress.SHIM_DIR), str(shim))
        assert (got / path.name).read_text() == want, path.name
        assert (got / path.name).stat().st_mode == path.stat().st_mode, path.name

    # The Slurm job's shell (templates/slurm) renders from the wheel as from the source tree.
    slurm_job = sh(
        py,
        "-c",
        "import json, sys; from pdlaunch.spec.load import load;"
        "from pdlaunch.plan.build import build_plan;"
        "from pdlaunch.backends.slurm import job as slurm;"
        "plan = build_plan(load(sys.argv[1])[0]);"
        "files = slurm.render_job(plan, slurm.SlurmOptions());"
        "print(json.dumps({f.name: f.content for f in files}))",
        topology.name,
        cwd=work,
        env=env,
        timeout=120,
    )
    expected_job = {
        f.name: f.content.replace(str(progress.SHIM_DIR), str(shim))
        for f in slurm.render_job(build_plan(topo), slurm.SlurmOptions())
    }
    assert json.loads(slurm_job.stdout) == expected_job
