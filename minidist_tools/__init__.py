"""The tools around the minidist framework: they use it, it never uses them.

* ``cluster/``: a cluster of network namespaces on one machine, linked over TCP;
* ``launch/``: the elastic launcher (restarts from the newest checkpoint after a failure);
* ``straggler/``: finding the rank that makes every step wait;
* ``perfmodel/``: models of a step's time, memory, network and failures; ``checkpoint_interval.py``:
  how often to checkpoint;
* ``timeline.py``: every rank's trace spans in one Perfetto file, and how much communication was
  hidden; ``gantt.py``: a pipeline step as a text grid or a Gantt chart;
* ``report.py``: how a training script ends on an error, printing it once for all ranks;
* ``checkpoint_info.py``: listing and verifying checkpoints without MPI; ``info.py``: versions and the
  MPI library; ``mpiexec.py``: which ``mpiexec`` every tool runs.

The ``minidist`` command (``minidist_cli/``) reaches every one of them: ``minidist --help``.
"""
