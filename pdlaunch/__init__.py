"""pdlaunch: declarative launcher for prefill/decode disaggregated vLLM serving."""

__version__ = "0.1.0"

from pdlaunch import moved as _moved

_moved.install()  # old import paths (before the regrouping) still import, with a warning
