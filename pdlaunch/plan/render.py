"""Fill the Jinja templates from a plan: one script per process, plus an index.

Every value that reaches a shell goes through `shquote` (or `command`, built on it);
templates never quote by hand. Same plan in, same bytes out.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from pdlaunch import __version__
from pdlaunch.fsutil import atomic_write, sync_dir
from pdlaunch.plan.build import Plan, Process
from pdlaunch.plan.containers import env_names, in_container_argv, prepend_var, run_argv
from pdlaunch.plan.node_addr import (
    EXIT_NO_ADDRESS,
    NODE_ADDR,
    PLACEHOLDER,
    RESOLVE_SH,
    SIDE_CHANNEL_HOST,
)

_PACKAGE = Path(__file__).resolve().parent.parent  # pdlaunch/, not pdlaunch/plan/


def templates_dir() -> Path:
    """Templates ship inside the wheel (pdlaunch/templates); a source checkout keeps them
    at the top level."""
    for candidate in (_PACKAGE / "templates", _PACKAGE.parent / "templates"):
        if (candidate / "process.sh.j2").is_file():
            return candidate
    raise FileNotFoundError("pdlaunch templates are missing from this installation")


def shquote(value: object) -> str:
    return shlex.quote(str(value))


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def comment(value: object) -> str:
    """Text safe inside a `#` comment: no newline can end the comment early."""
    return _CONTROL.sub("?", str(value))


def command(argv: list[str]) -> str:
    """Quoted argv, one flag (with its value) per line, for scripts people read."""
    lines: list[list[str]] = [[]]
    for i, arg in enumerate(argv):
        if i > 0 and arg.startswith("-") and lines[-1]:
            lines.append([])
        lines[-1].append(shquote(arg))
    return " \\\n    ".join(" ".join(words) for words in lines)


def container_argv(p: Process) -> list[str]:
    """The process's argv inside `<runtime> run`, which passes every variable the script
    exports by name (their values are quoted once, in the `export` lines)."""
    assert p.container is not None
    prepend = [prepend_var(k) for k in p.path_prepend]
    names = env_names(p.env, p.secret_env, prepend)
    run = run_argv(p.container, names)  # ends with the image
    cmd = in_container_argv(p.argv, list(p.path_prepend))
    # The plan's argv is the whole command, whatever the image's ENTRYPOINT (vllm/vllm-openai
    # sets `vllm serve`, which would run `vllm serve vllm serve ...`): replaced, as pyxis
    # (entrypoint off by default) and a pod's `command:` do.
    return [*run[:-1], "--entrypoint", cmd[0], run[-1], *cmd[1:]]


def template_environment() -> jinja2.Environment:
    """The Jinja environment of every script pdlaunch renders (SSH and Slurm): strict
    undefined names, no autoescape, and the quoting filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(
        shquote=shquote, comment=comment, command=command, container_argv=container_argv
    )
    env.globals.update(
        prepend_var=prepend_var,
        resolve_sh=RESOLVE_SH,
        node_addr_var=NODE_ADDR,
        node_addr_placeholder=PLACEHOLDER,
        node_addr_env=SIDE_CHANNEL_HOST,
        exit_no_address=EXIT_NO_ADDRESS,
    )
    return env


@dataclass(frozen=True)
class RenderedFile:
    name: str
    content: str
    executable: bool


def render_plan(plan: Plan) -> list[RenderedFile]:
    env = template_environment()
    script = env.get_template("process.sh.j2")
    files = [
        RenderedFile(f"{p.name}.sh", script.render(plan=plan, p=p, version=__version__), True)
        for p in plan.processes
    ]
    index = env.get_template("index.md.j2").render(plan=plan, version=__version__)
    files.append(RenderedFile("index.md", index, False))
    files.append(RenderedFile("plan.json", plan_json(plan), False))
    return files


def render_secrets(values: dict[str, str]) -> str:
    """The mode-0600 file a script sources for its secrets (written by `up`, never rendered
    to disk by `render`); values go through the same quoting as every script value."""
    lines = ["# written by pdlaunch up; mode 0600; removed by pdlaunch down"]
    lines += [f"{var}={shquote(value)}" for var, value in values.items()]
    return "\n".join(lines) + "\n"


def plan_json(plan: Plan) -> str:
    """One process per line: diffable, and fast (indent= would force the pure-Python encoder
    on thousand-process plans)."""
    data = plan.model_dump(mode="json")
    procs = data.pop("processes")
    head = json.dumps(data, sort_keys=True)[:-1]
    body = ",\n".join("  " + json.dumps(p, sort_keys=True) for p in procs)
    return f'{head}, "processes": [\n{body}\n]}}\n'


def write_files(files: list[RenderedFile], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for f in files:
        path = out_dir / f.name
        # Same plan, same bytes: a render is repeatable, so one directory sync at the end
        # instead of two per file (1,000 instances: ~2,000 fsyncs were most of render's time).
        atomic_write(path, f.content, 0o755 if f.executable else 0o644, durable=False)
        written.append(path)
    sync_dir(out_dir)
    return written
