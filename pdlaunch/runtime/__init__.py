"""Running a deployment: one lifecycle (:mod:`.lifecycle`: up, down, status, logs) over the
:class:`~pdlaunch.runtime.base.Runtime` interface, which each backend implements
(:mod:`.ssh`, :mod:`.slurm`). See docs/architecture.md."""
