"""What the tests share (no tests here): real daemons to test against, stand-ins, runners.

* ``sshd``, ``sshd_fixtures``: real sshd "hosts" on loopback and their fixtures.
* ``netns/``, ``netns_fixtures``: a cluster of network-namespace hosts (root) and its fixtures.
* ``slurm_cluster``, ``slurm_fixtures``: a real Slurm cluster (munged, slurmctld, slurmd) on
  this machine and the session's one ``slurm_cluster`` fixture; ``slurm_specs``: topologies
  for it; ``slurm_lifecycle``: the lifecycle called on the Slurm runtime.
* ``engines``, ``engine_requests``, ``tiny_model``: real vLLM engines of a tiny random model,
  what the engine tests send to them and read back.
* ``fake_vllm``, ``fake_router``, ``fake_bins``: stand-in engine and router (executables);
  ``fake_host``: in-memory hosts; ``fake_slurm``: stand-in Slurm commands
  (pdlaunch.testing.FakeSlurm) as a fixture.
* ``deployments``: launch-test topologies and the in-process CLI; ``processes``: is anything
  left running under a work dir; ``cli_runner``: ``pdlaunch`` as its own process.
"""
