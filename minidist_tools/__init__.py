"""The tools around the minidist framework: they use it, it never uses them.

* ``cli.py``: the ``minidist`` command, whose subcommands reach every tool (``minidist --help``);
* ``cluster/``: a cluster of network namespaces on one machine, linked over TCP;
* ``launch/``: the elastic launcher (restarts from the newest checkpoint after a failure);
* ``straggler/``: finding the rank that makes every step wait;
* ``perfmodel/``: models of a step's time, memory, network and failures; ``checkpoint_interval.py``:
  how often to checkpoint;
* ``checkpoint_info.py``: listing and verifying checkpoints without MPI; ``mpiexec.py``: which
  ``mpiexec`` every tool runs.
"""
