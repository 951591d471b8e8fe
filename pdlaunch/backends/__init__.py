"""One folder per backend, each everything about running the same plan on one platform:
:mod:`.ssh` (processes over SSH), :mod:`.slurm` (one batch job), :mod:`.k8s` (manifests).
A backend that runs deployments implements :class:`pdlaunch.runtime.base.Runtime`; adding
one is a folder here plus its line in :data:`pdlaunch.runtime.registry.BACKENDS`."""
