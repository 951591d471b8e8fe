"""Topology -> typed plan -> rendered scripts. :mod:`.build` turns a valid topology into every
process fully resolved, asking the steps beside it: placement and ports (:mod:`.ports`),
CPU cores (:mod:`.cpu`), the node environment (:mod:`.env`), the KV path and geometry
(:mod:`.kv_path`, :mod:`.kv_geometry`, :mod:`.kv_readers`), the KV lease (:mod:`.lease`) and
containers (:mod:`.containers`); :mod:`.render` fills the Jinja templates from the plan.
Pure functions: nothing here runs a command or talks to an engine."""

from pdlaunch.moved import forward

# What `pdlaunch.plan` had before it became this package (its build).
__getattr__ = forward("pdlaunch.plan", "pdlaunch.plan.build")
