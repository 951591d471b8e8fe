"""Backends whose records hold what only they understand, by the name a record gives them.

The runtime layer sits below the backends, so it names them here by module and imports one
only when a record of that backend is read: the record store asks a backend's *record view*
what only that backend knows (its working view of a record, a format-1 file, what to do by
hand, where its processes run now). A backend without one (SSH) keeps its record in the
common fields the store reads itself.

A record view module provides ``to_native(rec)``, ``from_native(native, source)``,
``parse_legacy(text, deployment)``, ``by_hand(deployment, path)`` and ``place(rec)``.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

# backend name -> its record view
RECORD_VIEWS = {"slurm": "pdlaunch.backends.slurm.record_view"}


def record_view(backend: str) -> ModuleType:
    return import_module(RECORD_VIEWS[backend])

