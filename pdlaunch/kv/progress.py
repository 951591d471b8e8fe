"""NIXL's progress-thread poll delay: what pdlaunch renders and where the shim lives.

The shim (``nixl_progress/sitecustomize.py``) runs inside every engine process and imports
nothing of pdlaunch, so its names are repeated there; ``tests/kv/test_progress_shim.py``
keeps the two equal. This module is safe on the control host (no torch, vLLM or nixl).
"""

from __future__ import annotations

from pathlib import Path

#: the variable the plan renders and the shim reads (microseconds; 0 or unset: off)
ENV_VAR = "PDLAUNCH_NIXL_PROGRESS_DELAY_US"
#: the line an engine's log gets for each NIXL agent the delay reached
MARK = "pdlaunch: NIXL progress thread poll delay"
#: the line an engine's log gets when the shim changed nothing (and why, after a colon)
UNCHANGED = "pdlaunch: NIXL progress thread poll delay not applied"
#: kv_connector.progress_delay_us's ceiling: NIXL waits at most this long for a UCX event
#: its poll missed (ucx_thread_engine.cpp: the delay is also its periodic wake-up)
MAX_DELAY_US = 1_000_000
#: the directory the plan puts first on PYTHONPATH: it holds sitecustomize.py and nothing
#: else, so it shadows no other module
SHIM_DIR = Path(__file__).resolve().parent / "nixl_progress"
SHIM_MODULE = "sitecustomize"
