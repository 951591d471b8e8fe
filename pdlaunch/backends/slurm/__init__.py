"""The Slurm backend: the deployment as one heterogeneous batch job. :mod:`.job` renders it
(sbatch script, driver, process scripts), :mod:`.rules` the placement rules, :mod:`.files`
writes the job's files, :mod:`.client` parses Slurm's commands, :mod:`.jobs` submits, finds
and cancels, :mod:`.record` is its record view, :mod:`.runtime` its `Runtime` and
:mod:`.doctor` what doctor reads of a job."""

from pdlaunch.moved import forward

# What `pdlaunch.backends.slurm` had before it became this package (its job).
__getattr__ = forward("pdlaunch.backends.slurm", "pdlaunch.backends.slurm.job")
