"""pdlaunch: declarative launcher for prefill/decode disaggregated vLLM serving."""

__version__ = "0.1.0"
