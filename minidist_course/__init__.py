"""The course around the minidist framework: what the lessons and the graded assignments use.

* ``notebook/``: real MPI ranks inside a notebook (``start_cluster``) and the checks of the lessons'
  exercises (``checks``);
* ``assignments/``: release, grade and batch-grade the assignments of ``lessons/assignments/``.
"""
