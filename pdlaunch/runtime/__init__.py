"""Running a deployment: one lifecycle (:mod:`.lifecycle`: up, down, status, logs) over the
:class:`~pdlaunch.runtime.base.Runtime` interface, which each backend implements
(:mod:`pdlaunch.backends.ssh`, :mod:`pdlaunch.backends.slurm`); the one record
(:mod:`.record`, :mod:`.record_store`). See docs/architecture.md."""
