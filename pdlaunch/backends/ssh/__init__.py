"""The SSH backend: processes started on the topology's hosts over SSH (or locally), through
the hosts layer (:mod:`pdlaunch.hosts`). :mod:`.runtime` is its `Runtime`; :mod:`.launch` one
`up`; :mod:`.records` what runs and what was recorded; :mod:`.stopping` proving it gone."""
