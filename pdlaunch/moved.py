"""Import paths that moved when the package was regrouped (issue 33), kept working for users'
scripts: importing an old name gives the module at its new place (the same module object),
with a DeprecationWarning naming the new path (the modules of the old ``runtime/ssh/`` and
``runtime/slurm/`` packages as attributes: ``from pdlaunch.runtime.slurm import jobs``). Old
names that are packages now
(``pdlaunch.plan``, ``pdlaunch.backends.slurm``, ``pdlaunch.backends.k8s``) forward their old
attributes from their ``__init__`` instead (:func:`forward`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

MODULES = {
    "pdlaunch.addresses": "pdlaunch.spec.addresses",
    "pdlaunch.backend_settings": "pdlaunch.spec.backend_settings",
    "pdlaunch.devices": "pdlaunch.spec.devices",
    "pdlaunch.plugins": "pdlaunch.spec.plugins",
    "pdlaunch.topology": "pdlaunch.spec.topology",
    "pdlaunch.load": "pdlaunch.spec.load",
    "pdlaunch.facts": "pdlaunch.spec.facts",
    "pdlaunch.ports": "pdlaunch.plan.ports",
    "pdlaunch.nodeenv": "pdlaunch.plan.env",
    "pdlaunch.cpubudget": "pdlaunch.plan.cpu",
    "pdlaunch.kvgeometry": "pdlaunch.plan.kv_geometry",
    "pdlaunch.kvreaders": "pdlaunch.plan.kv_readers",
    "pdlaunch.kvpath": "pdlaunch.plan.kv_path",
    "pdlaunch.containers": "pdlaunch.plan.containers",
    "pdlaunch.render": "pdlaunch.plan.render",
    "pdlaunch.health": "pdlaunch.observe.health",
    "pdlaunch.httpclient": "pdlaunch.observe.http",
    "pdlaunch.promhist": "pdlaunch.observe.metrics",
    "pdlaunch.watch": "pdlaunch.observe.watch",
    "pdlaunch.canary": "pdlaunch.observe.canary",
    "pdlaunch.bench": "pdlaunch.observe.bench",
    "pdlaunch.benchdisagg": "pdlaunch.observe.bench_disagg",
    "pdlaunch.benchhops": "pdlaunch.observe.bench_hops",
    "pdlaunch.hopsplot": "pdlaunch.observe.hops_plot",
    "pdlaunch.state": "pdlaunch.runtime.state",
    "pdlaunch.interrupts": "pdlaunch.runtime.interrupts",
    "pdlaunch.runtime.ssh": "pdlaunch.backends.ssh.runtime",
    "pdlaunch.runtime.slurm": "pdlaunch.backends.slurm.runtime",
    "pdlaunch.backends.slurm_client": "pdlaunch.backends.slurm.client",
    "pdlaunch.backends.slurm_files": "pdlaunch.backends.slurm.files",
    "pdlaunch.backends.slurm_record": "pdlaunch.backends.slurm.record",
    "pdlaunch.backends.slurm_rules": "pdlaunch.backends.slurm.rules",
    "pdlaunch.doctor.slurm": "pdlaunch.backends.slurm.doctor",
    "pdlaunch.backends.k8s_files": "pdlaunch.backends.k8s.files",
    "pdlaunch.backends.k8s_pods": "pdlaunch.backends.k8s.pods",
    "pdlaunch.backends.k8s_router": "pdlaunch.backends.k8s.router",
    "pdlaunch.backends.k8s_types": "pdlaunch.backends.k8s.model",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}", DeprecationWarning, stacklevel=3)


# A loader and a finder by protocol (not importlib.abc's base classes, whose import costs the
# command line a tenth of its start-up).
class _Alias:
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn(spec.name, self.new)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module at its new place already ran


class _Finder:
    def find_spec(
        self, name: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MODULES.get(name)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(name, _Alias(new))

    def invalidate_caches(self) -> None:
        pass


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def forward(package: str, module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a package that replaced a module of the same name: an
    attribute the old module had is read from ``module`` (imported on first use)."""

    def __getattr__(attr: str) -> Any:
        # A submodule of the package (`from pdlaunch.plan import ports`) is the import
        # system's to load: answering for it here would import the old module's code first.
        from importlib.util import find_spec

        if attr.startswith("__") or find_spec(f"{package}.{attr}") is not None:
            raise AttributeError(attr)
        target = importlib.import_module(module)
        try:
            value = getattr(target, attr)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {attr!r}") from None
        _warn(f"{package}.{attr}", f"{module}.{attr}")
        return value

    return __getattr__
