"""The grading environment: the child process's variables, and telling a setup problem from a wrong answer.

A submission scores points only for what its code does. When the tests cannot run because the Python
that grades lacks pytest, hypothesis or mpi4py, or minidist's own dependencies (numpy, scipy, ...), no
student is at fault: the grader must say "setup problem", name the missing piece and the one command
that installs it, give no algorithm hint, and exit with its own code (``report.EXIT_SETUP``). A
``ModuleNotFoundError`` for a module *inside* minidist, a ``SyntaxError`` or a ``NameError`` in the
submission's code is the student's, and is graded as a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from minidist_course.assignments import layout

STARTUP_LIMIT_S = 120.0  # from starting the child to its first test: imports and collection
GRADE_EXTRA = "grade"  # pyproject.toml's extra with what grading needs beyond minidist's dependencies
_TEST_MODULES = ("pytest", "hypothesis")  # what every assignment's tests import
# The pytest plugins the child loads (``-p``; auto-loading is off, see child_env): hypothesis's, which
# reports a falsifying example and checks ``@given`` tests' fixtures. Present whenever hypothesis is.
CHILD_PLUGINS = ("_hypothesis_pytestplugin",)
_MPI_MODULES = ("mpi4py",)  # also needed when the assignment launches MPI ranks (it has workers/)
# Modules the grading needs that no student writes: the test modules, minidist's dependencies
# (pyproject.toml) and the tests' shared helper. A missing module outside this list (say ``torch``,
# imported by a submission) is the submission's failure, graded as such.
_ENVIRONMENT_MODULES = frozenset(
    _TEST_MODULES + _MPI_MODULES + ("numpy", "scipy", "tqdm", "safetensors", "tomli", "gradelib")
)
_MISSING = re.compile(r"No module named '?([\w.]+)'?")
_BROKEN = ("INTERNALERROR", "ImportError while loading conftest", "ERROR: file or directory not found")


class SetupProblem(Exception):
    """The grading environment cannot run the tests; the message says what is missing and the fix."""


def install_command(root: Path | None = None, pip: str | None = None) -> str:
    """The one command that installs what grading needs into the tree at ``root`` (default: this one).

    ``pip`` defaults to the pip of the Python running now (the one that lacked a module); a release's
    README says plain ``pip`` (the student's virtual environment).
    """
    root = root if root is not None else layout.REPO_ROOT
    pip = pip if pip is not None else f"{sys.executable} -m pip"
    return f'cd {root} && {pip} install -e ".[{GRADE_EXTRA}]"'


def child_env(code: Path, limit: float, tmp: Path) -> dict[str, str]:
    """The environment of the child pytest: ``code`` first on ``PYTHONPATH``, one thread per rank."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        {
            "MINIDIST_GRADE_PATH": str(code),
            "MINIDIST_GRADE_TIMEOUT": str(limit),
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",  # leave no __pycache__ in a student's folder
            "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp / "hypothesis"),
            # pytest rewrites the asserts of every module of an auto-loaded plugin's distribution: all
            # of hypothesis (90 modules), and with no bytecode written, again in every child: ~1.5 s of
            # CPU per child. The grader loads the one plugin the tests need by name instead (CHILD_PLUGINS).
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
    )
    return env


def missing_module(text: str) -> str:
    """The top-level name of a missing module of the environment named in ``text``; "" if none.

    ``No module named 'minidist.distributed.rng'`` (a renamed file) or ``'torch'`` (an import the
    student added) is the submission's own failure: "".
    """
    for match in _MISSING.finditer(text):
        top = match.group(1).split(".")[0]
        if top in _ENVIRONMENT_MODULES:
            return top
    return ""


def problem_in(output: str) -> str:
    """The setup problem shown by a pytest run that graded nothing (its ``output``); "" if none."""
    module = missing_module(output)
    if module:
        return setup_problem(module)
    for sign in _BROKEN:
        if sign in output:
            line = next(x for x in output.splitlines() if sign in x)
            return (
                f"pytest could not start the tests ({line.strip()[:300]}); this is not your code's "
                f"fault: check the grading tree's lessons/assignments, then run: {install_command()}"
            )
    return ""


def setup_problem(module: str, root: Path | None = None) -> str:
    """The message for a missing ``module``: what is missing, where, and the command that installs it."""
    return (
        f"the Python that grades ({sys.executable}) cannot import {module!r}, which the tests need; "
        f"this is not your code's fault. Run: {install_command(root)}  (then grade again)"
    )


def check(code: Path, env: dict[str, str], cwd: Path, needs_mpi: bool) -> str:
    """Probe the child: "" if it imports the test modules and minidist from ``code``.

    Returns the submission's own import error (e.g. a ``SyntaxError`` line) for the grader to score.
    Raises :class:`SetupProblem` if a test module or a dependency of minidist is missing, and
    ``RuntimeError`` if it imports another minidist (an installed copy shadows the submission).
    """
    needed = _TEST_MODULES + (_MPI_MODULES if needs_mpi else ())
    probe = (
        "import importlib.util, sys\n"
        f"missing = [m for m in {needed!r} if importlib.util.find_spec(m) is None]\n"
        "if missing: sys.exit(f\"ModuleNotFoundError: No module named '{missing[0]}'\")\n"
        "import minidist\n"
        "sys.stdout.write(minidist.__file__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=STARTUP_LIMIT_S,
    )
    if proc.returncode != 0:
        module = missing_module(proc.stderr)
        if module:
            raise SetupProblem(setup_problem(module))
        return (last_error_line(proc.stderr) + syntax_error_place(proc.stderr, code)) or proc.stderr.strip()[
            -300:
        ]
    found = Path(proc.stdout.strip()).resolve()
    if not found.is_relative_to(code):
        raise RuntimeError(
            f"the grading process imports minidist from {found}, not from {code}: another copy shadows the "
            "submission (a .pth file or a PYTHONPATH entry?); fix the environment before grading"
        )
    return ""


_SYNTAX_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)$')  # no ", in f": a SyntaxError


def syntax_error_place(text: str, code: Path) -> str:
    """`` (at minidist/x.py:12: the file does not compile)`` for a SyntaxError in ``code``, else ``""``.

    A SyntaxError's traceback ends with the place of the bad line (``File "...", line 12``, without a
    function: none ran). Where it is matters to the student: the table then gives no algorithm hint.
    """
    for line in reversed(text.splitlines()):
        match = _SYNTAX_FRAME.match(line)
        if match and Path(match["file"]).resolve().is_relative_to(code.resolve()):
            short = Path(match["file"]).resolve().relative_to(code.resolve()).as_posix()
            return f" (at {short}:{match['line']}: the file does not compile)"
    return ""


_ERROR_LINE = re.compile(r"^(?:E\s+)?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$")


def last_error_line(text: str) -> str:
    """The last ``SomeError: message`` line of a traceback (``""`` if none)."""
    found = ""
    for line in text.splitlines():
        match = _ERROR_LINE.match(line.strip())
        if match:
            found = match.group(1)
    return found
