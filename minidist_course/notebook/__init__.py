"""What the lesson notebooks (``lessons/``) use from minidist.

* :mod:`minidist_course.notebook.cluster`: real MPI ranks inside a notebook (``start_cluster(n)`` starts ``n``
  ipyparallel engines as one ``mpiexec`` job and registers the ``%%px`` magic; ``stop_cluster()``),
  and ``mpiexec_path()``, the one answer to "which mpiexec?" for the lessons, the tests and the grader.
* :mod:`minidist_course.notebook.checks`: the checks of the lessons' "your turn" exercises
  (``from minidist_course.notebook import checks``). They live in the installed package, not beside the
  notebooks, so a student browsing their lessons folder in Jupyter does not come across them.

Importing this package imports neither ipyparallel nor MPI.
"""

from minidist_course.notebook.cluster import (
    ENGINE_ENV,
    cluster_pids,
    mpi_cluster,
    mpiexec_path,
    start_cluster,
    stop_cluster,
)

__all__ = ["ENGINE_ENV", "cluster_pids", "mpi_cluster", "mpiexec_path", "start_cluster", "stop_cluster"]
