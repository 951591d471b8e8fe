"""Start-up shim: NIXL's UCX progress thread waits in ``poll`` instead of spinning.

Why: nixl 1.5.1's Python agent hard-codes ``agent_config.pthrDelay = 0`` when it builds the
C++ agent (nixl_cu12/_api.py:226, ``nixl_agent.__init__``; ``nixl_agent_config`` has no
parameter for it, and vLLM 0.32's NixlConnector passes only ``num_threads`` and
``capture_telemetry``, nixl/base_worker.py:634-641). The UCX backend's progress thread then
calls ``poll(fds, n, 0)`` in a loop: one core per engine, forever
(docs/cpu-pd-recipe.md, gotcha 7). Given a delay, the thread sleeps in ``poll`` until a UCX
worker's event fd fires or the delay passes (NIXL's own periodic wake-up), so transfers
still progress and only the idle spin goes.

How: pdlaunch puts this directory first on an engine's PYTHONPATH and sets
``PDLAUNCH_NIXL_PROGRESS_DELAY_US`` (topology key ``kv_connector.progress_delay_us``), so
Python imports this file at start-up in the API server, the engine core and every worker
(children inherit the environment). It adds an import hook for NIXL's compiled bindings;
when vLLM builds an agent, the hook sets the delay on the agent's config, and only when the
Python agent left it at the hard-coded 0. It then writes one line to stderr (the engine's
log), :data:`MARK`, which the e2e tests look for.

Robust by construction: nothing happens without the variable; a value that is not a whole
number of microseconds, bindings without ``nixlAgent`` / ``pthrDelay``, or any error in the
hook leave NIXL untouched and log one line saying so; a second import installs nothing
twice; and the next ``sitecustomize`` on sys.path (a distribution's own) still runs. It
imports nothing of pdlaunch (it must start before anything else, in every engine process).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

#: the variable pdlaunch renders (pdlaunch/kv/progress.py ENV_VAR; a test keeps them equal)
ENV_VAR = "PDLAUNCH_NIXL_PROGRESS_DELAY_US"
#: the line each engine's log gets when the delay reached a NIXL agent (progress.MARK)
MARK = "pdlaunch: NIXL progress thread poll delay"
#: what this shim says when it changed nothing (progress.UNCHANGED)
UNCHANGED = "pdlaunch: NIXL progress thread poll delay not applied"
#: NIXL's compiled bindings, by wheel (nixl/__init__.py picks one and aliases nixl._bindings)
BINDINGS = ("nixl_cu12._bindings", "nixl_cu13._bindings", "nixl_rocm._bindings", "nixl._bindings")
#: the most pdlaunch renders (1 s); kv_connector.progress_delay_us refuses more
MAX_DELAY_US = 1_000_000
_PATCHED = "_pdlaunch_progress_delay"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _say(text: str) -> None:
    with contextlib.suppress(Exception):  # a closed stderr must not stop the engine
        print(f"{text} (pid {os.getpid()})", file=sys.stderr, flush=True)


def patch(bindings: Any, delay_us: int) -> bool:
    """Wrap ``bindings.nixlAgent`` so that an agent built with ``pthrDelay == 0`` gets
    ``delay_us``. Returns whether the bindings are now wrapped (already wrapped: True)."""
    real = getattr(bindings, "nixlAgent", None)
    config_type = getattr(bindings, "nixlAgentConfig", None)
    if real is None or config_type is None or not hasattr(config_type, "pthrDelay"):
        _say(f"{UNCHANGED}: {bindings.__name__} has no nixlAgent/nixlAgentConfig.pthrDelay")
        return False
    if getattr(real, _PATCHED, None) is not None:
        return True

    def nixl_agent_with_delay(name: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            current = config.pthrDelay
            if current == 0:
                config.pthrDelay = delay_us
                _say(f"{MARK}: {delay_us} us for agent {name}")
            else:  # a NIXL that lets the caller choose: its choice stands
                _say(f"{UNCHANGED}: agent {name} already has pthrDelay {current}")
        except Exception as exc:
            _say(f"{UNCHANGED}: agent {name}: {exc!r}")
        return real(name, config, *args, **kwargs)

    setattr(nixl_agent_with_delay, _PATCHED, delay_us)
    bindings.nixlAgent = nixl_agent_with_delay
    return True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, delay_us: int) -> None:
        self._inner, self._delay_us = inner, delay_us

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)  # an error here is NIXL's own: let it through
        try:
            patch(module, self._delay_us)
        except Exception as exc:
            _say(f"{UNCHANGED}: {exc!r}")


class Finder(importlib.abc.MetaPathFinder):
    """Hands NIXL's bindings to :class:`_Loader`; every other import is untouched."""

    _pdlaunch_progress_delay = True  # what install() looks for on sys.meta_path

    def __init__(self, delay_us: int) -> None:
        self.delay_us = delay_us

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in BINDINGS:
            return None
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.delay_us)
            return spec
        except Exception as exc:
            _say(f"{UNCHANGED}: {exc!r}")
            return None


def parse_delay(value: str | None) -> int | None:
    """The delay in microseconds, None when unset or 0 (off). Raises ValueError."""
    text = (value or "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) > MAX_DELAY_US:
        raise ValueError(
            f"{ENV_VAR}={text!r} is not a whole number of microseconds 0-{MAX_DELAY_US}"
        )
    return int(text) or None


def _findable(top: str) -> bool:
    try:  # a path scan, no import: NIXL itself loads only when vLLM asks for it
        return importlib.machinery.PathFinder.find_spec(top) is not None
    except Exception:
        return False


def install(environ: Any = os.environ) -> Finder | None:
    """Put the hook first on sys.meta_path once; None when off or already there."""
    try:
        delay = parse_delay(environ.get(ENV_VAR))
    except ValueError as exc:
        _say(f"{UNCHANGED}: {exc}")
        return None
    # a marker, not isinstance: a second copy of this file (another path) is another class
    if delay is None or any(getattr(f, _PATCHED, False) for f in sys.meta_path):
        return None
    if not any(_findable(top) for top in {b.partition(".")[0] for b in BINDINGS}):
        _say(f"{UNCHANGED}: no NIXL wheel on sys.path")
        return None
    loaded = [name for name in BINDINGS if name in sys.modules]
    for name in loaded:  # imported before us (not at start-up): wrap what is there
        patch(sys.modules[name], delay)
    finder = Finder(delay)
    sys.meta_path.insert(0, finder)
    return finder


def _chain() -> None:
    """Run the sitecustomize this one shadows (a distribution's own), if there is one."""
    for entry in sys.path:
        try:
            if not entry or os.path.abspath(entry) == _HERE:
                continue
            spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        except Exception:
            continue
        if spec is None or spec.loader is None or spec.origin == __file__:
            continue
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as exc:  # as site.py does for a failing sitecustomize: say, go on
            _say(f"pdlaunch: {spec.origin} failed: {exc!r}")
        return


if __name__ == "sitecustomize":
    try:
        install()
    except Exception as exc:
        _say(f"{UNCHANGED}: {exc!r}")
    _chain()
