"""Coursework: student starter code from the reference, and an autograder with per-task scores.

* ``markers.py``: solution regions in the reference code (``# BEGIN SOLUTION A2.1: ...`` /
  ``# END SOLUTION``) and the stubs that replace them;
* ``release.py``: ``minidist assignments release A2 --out DIR`` writes a student copy;
* ``tasks.py``: the task files (``lessons/assignments/A2/tasks.toml``) mapping tests to tasks and points;
* ``grade.py``: ``minidist assignments grade A2 --path DIR`` runs the tests against ``DIR``
  and prints a per-task table; ``--results results.json`` writes Gradescope's format (``report.py``);
* ``submission.py``: a copy of minidist, or files uploaded alone placed into a release;
  ``environment.py``: the child's environment, and a setup problem told from a wrong answer;
* ``batch.py``: ``grade A2 --path submissions/ --batch --out results/`` and the class summary CSV.

Handouts, tests and the instructor guide live in ``lessons/assignments/``. This package imports no MPI.
"""

from minidist_course.assignments.grade import GradeReport, grade
from minidist_course.assignments.markers import Region, blank, find_regions
from minidist_course.assignments.release import ReleaseReport, release

__all__ = ["GradeReport", "Region", "ReleaseReport", "blank", "find_regions", "grade", "release"]
