"""Talking to running engines and routers: the bounded HTTP client (:mod:`.http`), health
(:mod:`.health`), Prometheus metrics parsing (:mod:`.metrics`), ``status --watch``
(:mod:`.watch`), the PD canary (:mod:`.canary`), ``bench`` with its disaggregation proof and
per-hop breakdown (:mod:`.bench`, :mod:`.bench_disagg`, :mod:`.bench_hops`,
:mod:`.hops_plot`) and the KV lease budget (:mod:`.lease_budget`)."""
