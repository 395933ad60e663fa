"""The lesson notebooks: in sync with their sources, run top to bottom, and their exercises check.

Every notebook is executed twice with nbclient, as a new user gets it (placeholders: each check cell
prints NOT DONE YET) and with the reference answers of ``lessons/.solutions/`` filled in (each check
prints CORRECT), both in a student's copy made by ``lessons/copy_lessons.py`` (where students work; it
holds no solutions). Where no later cell can tell the two apart, the two versions are one kernel run
(tests/helpers/lesson_runs.py; the kernel, the engines and the lesson's runs start once): 9 of the 13 lessons.
A failing cell fails the test. The wrong answers of ``lessons/.solutions/`` are fed to the check
functions in this process: each must raise ``AssertionError``.

Marked ``lessons`` (deselect with ``-m "not lessons"``); needs the ``dev`` extra (nbclient, ipykernel,
ipyparallel, matplotlib). About 3.5 minutes on 2 cores, and about 1 more for lesson 10 (its two runs took
20 s and 36 s at a load average of 8).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_utils import REPO

pytest.importorskip("nbclient", reason='needs the notebook tools: pip install -e ".[dev]"')
pytest.importorskip("ipyparallel", reason='needs ipyparallel: pip install -e ".[dev]"')
os.environ.setdefault("MPLBACKEND", "Agg")  # figures render to PNG in the kernel; no window

LESSONS = REPO / "lessons"
_spec = importlib.util.spec_from_file_location("lessons_build", LESSONS / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

import lesson_runs  # noqa: E402

from minidist_course.notebook import checks  # noqa: E402  (as the notebooks import them)

SOURCES = sorted((LESSONS / "src").glob("[0-9][0-9]_*.py"))
MAX_SECONDS = 180  # a lesson must run within 3 minutes on a 2-core machine

# Not safe beside itself: _assert_no_engines_left sees every minidist cluster on the machine. The
# suite's `-n 2 --dist loadfile` keeps this whole file on one worker, so its notebooks run one at a time.
pytestmark = pytest.mark.lessons


def test_committed_notebooks_match_their_sources():
    assert SOURCES, "no lesson sources found"
    stale = build.stale_notebooks(SOURCES)
    # The advice never says "rebuild" for a notebook someone ran and saved here: that would wipe it.
    assert not stale, build.advice(stale)
    for source in SOURCES:
        nb = build.build_notebook(source)
        assert all(not c.get("outputs") for c in nb.cells), f"{source.name}: notebooks ship without outputs"


@pytest.fixture(scope="module")
def student_copy(tmp_path_factory) -> Path:
    """The lessons as a student gets them: copied to a folder of their own, without the solutions."""
    dest = tmp_path_factory.mktemp("student") / "my-lessons"
    cmd = [sys.executable, str(LESSONS / "copy_lessons.py"), str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return dest


def _exercise_keys(nb) -> list[str]:
    return [c.metadata["exercise"] for c in nb.cells if "exercise" in c.metadata.get("tags", [])]


@pytest.fixture(scope="module")
def executed(student_copy: Path):
    """``executed(source, solutions) -> (notebook, seconds)``: the notebook run top to bottom in a fresh
    kernel, as a new user gets it or with the reference answers. Where tests/helpers/lesson_runs.py can run
    both in one kernel (about half the time: the kernel, the MPI engines and the lesson's runs start once),
    the placeholders' test makes that run and the solutions' test reads its half; ``seconds`` is then the
    whole run's."""
    runs: dict[str, tuple[object, float]] = {}

    def run(source: Path, solutions: bool):
        nb = build.build_notebook(source)
        keys = _exercise_keys(nb)
        answers = build.solution_cells(source.stem)
        assert set(keys) <= set(answers), f"{source.stem}: exercises without a reference solution"
        answers = {k: answers[k]["solution"][0] for k in keys}
        version = lesson_runs.SOLUTIONS if solutions else lesson_runs.PLACEHOLDERS
        merged = lesson_runs.merged_notebook(nb, answers)
        if merged is None:  # a later cell uses an exercise's answer: each version needs its own run
            return _execute(build.with_answers(nb, answers) if solutions else nb, student_copy)
        if source.stem not in runs:
            runs[source.stem] = _execute(merged, student_copy)
        merged, seconds = runs[source.stem]
        return lesson_runs.view(merged, version), seconds

    return run


def _execute(nb, cwd: Path):
    start = time.perf_counter()
    # The kernel (and the ranks it starts) import this checkout's minidist, whatever is installed.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        build.execute(nb, timeout=MAX_SECONDS, cwd=cwd)  # raises CellExecutionError at a failing cell
    return nb, time.perf_counter() - start


@pytest.mark.parametrize("solutions", [False, True], ids=["placeholders", "solutions"])
@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_notebook_runs_top_to_bottom(source: Path, solutions: bool, executed):
    keys = _exercise_keys(build.build_notebook(source))
    nb, seconds = executed(source, solutions)
    assert seconds < MAX_SECONDS, f"{source.stem} took {seconds:.0f} s"
    # A `!python missing.py` cell does not raise: a path that only resolves in lessons/ shows up here.
    texts = [o.get("text", "") for c in nb.cells for o in c.get("outputs", [])]
    assert not [t for t in texts if "can't open file" in t], f"{source.stem} runs a file its copy lacks"
    if not solutions:  # what the cells print above an exercise must not give its formula away either
        printed = ""
        for cell in nb.cells:
            key = cell.metadata.get("exercise")
            if "exercise" in cell.metadata.get("tags", []) and key not in TAUGHT_BEFORE_THE_EXERCISE:
                leaked = [f for f in map(_squash, FORMULAS[key]) if f in printed]
                assert not leaked, f"{source.stem}: a cell's output above exercise {key!r} states {leaked}"
            for output in cell.get("outputs", []):
                printed += _squash(output.get("text", "") + output.get("data", {}).get("text/plain", ""))
    results = build.check_results(nb)
    assert {k for k, _ in results} == set(keys), f"every exercise needs a check cell: {results}"
    want = "correct" if solutions else "not done"
    assert all(status == want for _, status in results), results
    _assert_no_engines_left()


def test_one_run_serves_both_versions_only_where_no_later_cell_sees_the_answer():
    """tests/helpers/lesson_runs.py: the merged notebook's two views are the two notebooks (cells and order of
    the code that reads no answer), and a notebook whose later cell calls the exercise's function, or whose
    answer does more than define, is not merged."""
    import nbformat

    def notebook(*cells):
        nb = nbformat.v4.new_notebook()
        for kind, text in cells:
            cell = nbformat.v4.new_code_cell(text)
            if kind != "code":
                cell.metadata = {"tags": [kind], "exercise": "k"}
            nb.cells.append(cell)
        return nb

    nb = notebook(("code", "import numpy as np"), ("exercise", "def f(x):\n    pass"), ("code", "y = 2"),
                  ("check", "checks.f(f)"), ("code", "print(y)"))  # fmt: skip
    answer = "import numpy as np\n\n\ndef f(x):\n    return np.sin(x)"
    merged = lesson_runs.merged_notebook(nb, {"k": answer})
    sources = [c.source for c in merged.cells]
    assert sources[4:6] == [answer, "checks.f(f)"] and sources[-1] == "print(y)"  # the solution follows
    placeholders = lesson_runs.view(merged, lesson_runs.PLACEHOLDERS)
    assert [c.source for c in placeholders.cells] == [c.source for c in nb.cells]
    solutions = lesson_runs.view(merged, lesson_runs.SOLUTIONS)
    want = ["import numpy as np", "y = 2", answer, "checks.f(f)", "print(y)"]
    assert [c.source for c in solutions.cells] == want
    assert len({c.id for c in merged.cells}) == len(merged.cells)
    reads = notebook(*nb_cells(nb)[:-1], ("code", "plot(f)"))
    assert lesson_runs.merged_notebook(reads, {"k": answer}) is None
    # a call, an attribute, a statement; a new import whose name a later cell uses
    for acting in ("f = make()", "state.x = 1", "print(1)", "import y"):
        assert lesson_runs.merged_notebook(nb, {"k": acting + "\n" + answer}) is None, acting


def nb_cells(nb) -> list[tuple[str, str]]:
    return [(c.metadata.get("tags", ["code"])[0], c.source) for c in nb.cells]


def _check_calls(nb, key: str) -> list[str]:
    """The check cells of exercise ``key`` that call a check on the exercise's own names only."""
    return [
        c.source for c in nb.cells if "check" in c.metadata.get("tags", []) and c.metadata["exercise"] == key
    ]


def _run_check(answer_code: str, check_code: str) -> None:
    namespace: dict = {"checks": checks}
    exec(answer_code, namespace)
    eval(compile(check_code, "<check cell>", "eval"), namespace)


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_checks_accept_the_reference_and_reject_wrong_answers(source: Path, capsys):
    nb = build.build_notebook(source)
    answers = build.solution_cells(source.stem)
    for key in _exercise_keys(nb):
        calls = [c for c in _check_calls(nb, key) if _names_available(c, answers[key]["solution"][0])]
        assert calls, f"{source.stem}/{key}: no check cell that can run on the answer alone"
        assert answers[key]["wrong"], f"{source.stem}/{key}: give at least one wrong answer"
        for call in calls:
            _run_check(answers[key]["solution"][0], call)
            assert "CORRECT" in capsys.readouterr().out
            placeholder = next(
                c.source
                for c in nb.cells
                if c.metadata.get("exercise") == key and "exercise" in c.metadata["tags"]
            )
            _run_check(placeholder, call)
            assert "NOT DONE YET" in capsys.readouterr().out
            for wrong in answers[key]["wrong"]:
                with pytest.raises(AssertionError):
                    _run_check(wrong, call)


def _names_available(check_code: str, answer_code: str) -> bool:
    """True if the check cell uses only ``checks`` and names the answer code defines."""
    namespace: dict = {}
    exec(answer_code, namespace)
    code = compile(check_code, "<check cell>", "eval")
    return all(name == "checks" or name in namespace for name in _loaded_names(code))


def _loaded_names(code) -> set[str]:
    import dis

    return {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_NAME", "LOAD_GLOBAL")}


def _assert_no_engines_left() -> None:
    """No ipyparallel engine, nanny or controller of ours may outlive the kernel that started it.

    Ours are recognised by the private profile directory minidist_course.notebook gives them (in their
    environment as IPP_PROFILE_DIR=/tmp/minidist-ipp-...). Stopped engines take a few seconds to exit.
    """
    deadline = time.time() + 20
    while True:
        left = _our_cluster_processes()
        if not left or time.time() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"cluster processes left running: {left}"


def _our_cluster_processes() -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = (proc / "environ").read_bytes()
            if b"IPP_PROFILE_DIR=" in environ and b"minidist-ipp-" in environ and _alive(int(proc.name)):
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return found


CLUSTER_SCRIPT = """
import os, sys
from minidist_course.notebook import cluster_pids, mpi_cluster, start_cluster
try:
    with mpi_cluster(2) as rc:
        ranks = rc[:].apply_sync(lambda: __import__("minidist.distributed", fromlist=["init"]).init().rank)
        print("RANKS", sorted(ranks), flush=True)
        raise RuntimeError("a failing cell")
except RuntimeError:
    pass
assert cluster_pids() == [], "the context manager must stop the cluster when its body raises"
start_cluster(2)
print("PIDS", *cluster_pids(), flush=True)
os._exit(3)  # like a killed kernel: no atexit, no cleanup; the reaper must stop the cluster
"""


def test_cluster_helper_stops_engines_on_error_and_when_the_kernel_dies():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", CLUSTER_SCRIPT], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 3, proc.stderr
    assert "RANKS [0, 1]" in proc.stdout, proc.stdout + proc.stderr
    pids = [int(p) for p in next(ln for ln in proc.stdout.splitlines() if ln.startswith("PIDS")).split()[1:]]
    assert len(pids) == 2  # the controller and the mpiexec of the engines
    deadline = time.time() + 20
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(_alive(p) for p in pids), "the reaper did not stop the cluster of a dead kernel"
    _assert_no_engines_left()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and ") Z " not in Path(f"/proc/{pid}/stat").read_text()


def test_notebook_helper_imports_without_ipyparallel_and_says_how_to_install():
    code = (
        "import sys; sys.modules['ipyparallel'] = None\n"
        "from minidist_course import notebook\n"
        "try:\n    notebook.start_cluster(2)\nexcept ImportError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert 'pip install -e ".[lessons]"' in out, out


class _RecordingChannel:
    """Stands in for a group's collective channel on one rank: records the first value of every buffer
    sent and delivers zeros, so a chunk's contents (its own index) say which chunk went out."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def scratch(self, size: int, dtype) -> np.ndarray:
        return np.zeros(size, dtype)

    def host_sendrecv(self, send, dest, recv, source) -> None:
        self.sent.append(int(send[0]))
        recv[...] = 0


def test_lesson_03_send_chunk_is_the_schedule_ring_py_runs():
    """The lesson's reference answer must be what the library does, so that a student who reads
    ``ring.py`` is marked right and one who carries the lesson into A2 keeps the points."""
    from types import SimpleNamespace

    from minidist.distributed.algorithms.ring import ring_reduce_scatter

    namespace: dict = {}
    exec(build.solution_cells("03_ring_allreduce")["sendchunk"]["solution"][0], namespace)
    send_chunk = namespace["send_chunk"]
    for n in (2, 3, 4, 7):
        for r in range(n):
            channel = _RecordingChannel()
            group = SimpleNamespace(size=n, rank=r, collective_channel=channel)
            flat = np.repeat(np.arange(n, dtype=np.float64), 3)  # chunk c holds the value c
            ring_reduce_scatter(group, flat, "sum")
            assert channel.sent == [send_chunk(r, s, n) for s in range(n - 1)], (n, r)


# --- hints escalate and never state the formula -----------------------------------------------------

# The formula each exercise asks the student to derive, in the spellings a hint or a lesson might use
# (compared with all whitespace removed, lower case). The solutions' own expressions are added by
# _solution_expressions, so a hint cannot quote the reference answer either.
FORMULAS = {
    "tanh": ["1-out**2", "1-out^2", "1-tanh(x)**2", "1-tanh(x)^2", "1-tanh^2", "1-tanh²", "sech"],
    "numgrad": ["(f(x+eps)-f(x-eps))/(2*eps)", "/(2eps)", "/(2*eps)"],
    "ring": ["(rank-1)%size", "(rank+1)%size", "(r-1)%n", "(r+1)%n"],
    "sendchunk": ["(rank-step-1)%n", "(r-s-1)%n", "r-s-1", "rank-step-1"],
    "ringtime": ["2*(n-1)*alpha", "2(n-1)", "2*(n-1)", "(n-1)/n", "2(n−1)"],
    "accum": ["sizes[i]/sum(sizes)", "b_i/b", "b_i/sum", "n*b_i/b"],
    "zero": ["b*psi/", "k*psi/n", "kψ/n", "(b+k)ψ/n", "(2b+k)", "(b+b+k)", "bψ+bψ+kψ/n"],
    "shard": ["out_features//tp", "in_features//tp", "out/tp", "in/tp"],
    "fg": ["sum(grads)"],
    "bubble": ["(p-1)/(m+p-1)", "m+p-1", "(p-1)/m"],
    "peak": ["min(p-s,m)", "min(m,p-s)", "mostp-s"],
    "files": ["step_{step:09d}", ":05d"],
    "shards": ["max(lo,k*saved)", "k*saved"],
    "rank": ["pp_rank*dp*tp", "dp_rank*tp+tp_rank", "pp_rank*(dp*tp)"],
    "speedup": ["one/(one/gpus+comm)", "c/(g*f)", "c/(gf)", "\\frac{c}{gf}", "(g-1)alpha"],
    "layernorm": ["g-mean(g)-xhat*mean(g*xhat)", "mean(g*xhat)", "mean(gxhat)", "g-g.mean(", "sum(g*xhat)"],
    "params": ["12*c**2+13*c", "12c^2+13c", "12c²+13c", "l*(12*c*c+13*c)", "(12c^2+13c)"],
    "flops": ["24c^2+4tc", "24*c**2", "24*c*c", "24c^2", "4*t*c", "4tc", "2*c*v", "2cv"],
    "vocabloss": ["logs+m-z_t", "log(total)+top", "targets[mine]-start", "t-start_r", "t-start"],
    "online": ["exp(m-m')", "exp(running_max-new_max)", "o*c+", "l*c+", "out*correction"],
    "rank4": [
        "pp_rank*(dp*cp*tp)",
        "pp_rank*dp*cp*tp",
        "dp_rank*(cp*tp)",
        "dp_rank*cp*tp",
        "cp_rank*tp+tp_rank",
    ],
    "tpbytes": ["4*2*(tp-1)/tp", "4x2(tp-1)/tp", "8*(tp-1)/tp", "8(tp-1)/tp", "8(t-1)/t"],
    "linkbytes": ["2(g-1)/g", "2*(g-1)/g", "2(nodes-1)/nodes", "2*(nodes-1)/nodes", "2*(ring-1)/ring"],
    "powersgd": ["(m+n)*r", "(m+n)r", "m*r+n*r", "mr+nr", "(rows+cols)*rank", "(m+n)*rank"],
    "waits": ["last-t", "max(entries)-t", "max(entries)-entry", "last-entry"],
    "mtbf": ["node_mtbf/nodes", "mtbf/nodes", "mtbf/n", "m_node/n"],
    "young": ["sqrt(2*save_cost*mtbf)", "sqrt(2cm)", "sqrt(2*c*m)", "√(2cm)", "2*save_cost*mtbf"],
    "block": ["26sbh", "26*sbh", "26*s*b*h", "(26sbh+as²b", "26s b h"],
}
# The lesson text above numgrad's exercise gives the central difference on purpose: the exercise is to
# turn it into a loop over coordinates that leaves x unchanged, not to find the formula.
TAUGHT_BEFORE_THE_EXERCISE = {"numgrad"}


def _squash(text: str) -> str:
    return "".join(text.split()).lower()


def _solution_expressions(code: str) -> list[str]:
    """Every computed value a reference answer returns or assigns (tuple elements one by one)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.Return, ast.Assign)) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            found += [ast.unparse(v) for v in values if isinstance(v, (ast.BinOp, ast.Call))]
    return [_squash(e) for e in found if len(_squash(e)) > 6]  # "g", "[]", "x[i]" say nothing


def _exercises() -> list[tuple[str, str, object, list[str]]]:
    """(lesson, key, check function, wrong answers) for every exercise's check that runs on its answer."""
    import re

    found = []
    for source in SOURCES:
        nb = build.build_notebook(source)
        answers = build.solution_cells(source.stem)
        for key in _exercise_keys(nb):
            for call in _check_calls(nb, key):
                if _names_available(call, answers[key]["solution"][0]):
                    check = getattr(checks, re.match(r"checks\.(\w+)\(", call).group(1))
                    found.append((source.stem, key, call, check, answers[key]))
    return found


def _message(answer_code: str, check_code: str) -> str:
    with pytest.raises(AssertionError) as wrong:
        _run_check(answer_code, check_code)
    return str(wrong.value)


def test_a_wrong_answer_gets_a_question_first_and_a_different_nudge_after(capsys):
    exercises = _exercises()
    assert len(exercises) >= 15  # every exercise but the ring pass of lesson 02, checked on engines
    for stem, key, call, check, answers in exercises:
        question, nudge = check.hints
        assert question.rstrip().endswith("?"), f"{stem}/{key}: the first hint must be a question"
        assert _squash(question) != _squash(nudge)
        for wrong in answers["wrong"]:
            checks.reset_hints()
            first, second, third = (_message(wrong, call) for _ in range(3))
            assert question in first and nudge not in first, f"{stem}/{key}, first miss:\n{first}"
            assert nudge in second and question not in second, f"{stem}/{key}, second miss:\n{second}"
            assert nudge in third, f"{stem}/{key}, third miss:\n{third}"
    # Lesson 02's ring pass is checked on the engines' tokens: every rank kept its own one here.
    checks.reset_hints()
    question, nudge = checks.ring_pass.hints
    kept = [np.array([0.0]), np.array([1.0])]
    first, second = (
        _message(f"received = {[t.tolist() for t in kept]}", "checks.ring_pass(received)") for _ in "12"
    )
    assert question in first and nudge in second and nudge not in first and question not in second
    checks.reset_hints()


def test_a_first_miss_names_the_input_and_the_broken_property_not_the_expected_value(capsys):
    """A trial user's m*n for the job's MTBF got "got 7200.0, expected 1800.0", which gives m/n away."""
    checks.reset_hints()
    answer = "def system_mtbf(node_mtbf, nodes):\n    return node_mtbf * nodes"
    first, second, third = (_message(answer, "checks.system_mtbf(system_mtbf)") for _ in range(3))
    assert "nodes=2" in first and "7200" in first and "1800" not in first and "expected" not in first
    assert "grows with the number of nodes" in first and "shrink as nodes are added" in first
    assert "1800" not in second and "1800" in third  # a student stuck after three tries may work back
    # Every wrong answer's first two messages leave the expected value out.
    for stem, key, call, _check, answers in _exercises():
        for wrong in answers["wrong"]:
            checks.reset_hints()
            for text in (_message(wrong, call), _message(wrong, call)):
                leaks = ("value expected there", ", expected", "the mesh says")
                assert not [w for w in leaks if w in text], f"{stem}/{key}:\n{text}"
    checks.reset_hints()


def test_figures_after_an_exercise_use_the_students_answer_once_it_passes(capsys):
    def system_mtbf(node_mtbf, nodes):
        return node_mtbf / nodes

    assert checks.yours_or_minidists(system_mtbf) is system_mtbf
    assert "use your system_mtbf" in capsys.readouterr().out

    def young_interval(save_cost, mtbf):
        raise NotImplementedError

    fallback = checks.yours_or_minidists(young_interval)
    assert "use minidist's young_interval" in capsys.readouterr().out
    assert fallback is not young_interval and abs(fallback(1.0, 2.0) - 2.0) < 1e-12
    assert not fallback.__doc__  # the library's docstring is not one help() away from the exercise
    with pytest.raises(AssertionError):  # the quiet check counted no miss: the next one gets hint 1
        checks.young_interval(lambda save_cost, mtbf: mtbf)
    checks.reset_hints()
    for source in SOURCES:  # no reference function is fetched right below an exercise any more
        text = source.read_text()
        for name in ("system_mtbf", "young_interval", "inter_node_bytes", "powersgd_values"):
            assert f'stand_in("{name}")' not in text, f"{source.stem} uses minidist's {name} unasked"


def test_no_hint_states_the_formula_of_its_exercise(capsys):
    for stem, key, call, check, answers in _exercises():
        formulas = [_squash(f) for f in FORMULAS[key]] + _solution_expressions(answers["solution"][0])
        texts = list(getattr(check, "hints", ()))
        for wrong in answers["wrong"]:
            getattr(checks, "reset_hints", lambda: None)()
            texts += [_message(wrong, call), _message(wrong, call)]
        for text in texts:
            leaked = [f for f in formulas if f in _squash(text)]
            assert not leaked, f"{stem}/{key}: the hint gives away {leaked}:\n{text}"
    getattr(checks, "reset_hints", lambda: None)()


def test_lesson_text_before_an_exercise_does_not_state_its_formula():
    """The formula is revealed after the check (in a collapsed cell), never above the exercise."""
    for source in SOURCES:
        nb = build.build_notebook(source)
        above = ""
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                above += _squash(cell.source)
            key = cell.metadata.get("exercise")
            if "exercise" in cell.metadata.get("tags", []) and key not in TAUGHT_BEFORE_THE_EXERCISE:
                leaked = [f for f in map(_squash, FORMULAS[key]) if f in above]
                assert not leaked, f"{source.stem}: the text above exercise {key!r} states {leaked}"


def _all_formulas() -> list[str]:
    """Every exercise's formula spellings and its reference answer's expressions, squashed."""
    found = [_squash(f) for spellings in FORMULAS.values() for f in spellings]
    for source in SOURCES:
        for answers in build.solution_cells(source.stem).values():
            found += _solution_expressions(answers["solution"][0])
    return found


def _docstrings_and_comments(path: Path) -> list[str]:
    """The docstrings (module, classes, functions) and the ``#`` comments of one Python file."""
    import ast
    import io
    import tokenize

    tree = ast.parse(path.read_text())
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    texts = [doc for doc in map(ast.get_docstring, nodes) if doc]
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return texts + [t.string for t in tokens if t.type == tokenize.COMMENT]


def test_the_checks_say_what_they_check_never_the_answer():
    """The checks' docstrings and comments (a docstring's first line is printed after CORRECT, and a
    student may read the module) name what is checked, not the formula; only the code that computes
    the expected values may hold it, as minidist's own modules do."""
    assert checks.__file__, "the checks must be importable as the notebooks import them"
    path = Path(checks.__file__)
    files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
    # Spellings under 5 characters ("sech") turn up inside ordinary words once the spaces are gone.
    formulas = [f for f in _all_formulas() if len(f) >= 5]
    for file in files:
        for text in _docstrings_and_comments(file):
            leaked = [f for f in formulas if f in _squash(text)]
            assert not leaked, f"{file.name} states {leaked} in:\n{text}"


def test_the_checks_are_installed_with_minidist_not_kept_beside_the_notebooks():
    assert Path(checks.__file__).resolve().is_relative_to(REPO / "minidist_course"), checks.__file__
    assert not (LESSONS / "checks.py").exists(), "lessons/checks.py would be copied next to the notebooks"
    for source in SOURCES:
        assert "from minidist_course.notebook import" in source.read_text() and "checks" in source.read_text()


def _placeholders(nb) -> dict[str, list]:
    """``{exercise key: [ast.FunctionDef, ...]}``: the functions each exercise cell asks for."""
    import ast

    found: dict[str, list] = {}
    for cell in nb.cells:
        if "exercise" in cell.metadata.get("tags", []):
            defs = [n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.FunctionDef)]
            found.setdefault(cell.metadata["exercise"], []).extend(defs)
    return found


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_no_notebook_cell_holds_a_stand_in_for_an_exercise(source: Path, capsys):
    """A working version of an exercise's function, defined in a cell of the notebook (say, so that
    later cells run while the exercise is not done), shows the answer to anyone who scrolls on. Stand-ins
    come from ``checks.stand_in(NAME)``. Two ways to spot one: a function in any non-exercise cell that
    computes one of the reference answer's expressions, or one with an exercise's parameters that its
    check marks CORRECT."""
    import ast

    nb = build.build_notebook(source)
    answers = build.solution_cells(source.stem)
    placeholders = _placeholders(nb)
    calls = {
        key: [c for c in _check_calls(nb, key) if _names_available(c, answers[key]["solution"][0])]
        for key in placeholders
    }
    expressions = {key: _solution_expressions(answers[key]["solution"][0]) for key in placeholders}
    cells = [text for kind, _, text in build.parse_cells(source.read_text()) if kind == "code"]
    for text in cells:
        text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("%", "!")))  # magics
        for fn in [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)]:
            body = _squash(ast.unparse(fn))
            for key, wanted in placeholders.items():
                leaked = [e for e in expressions[key] if e in body]
                assert not leaked, f"{source.stem}: {fn.name}() computes {leaked}, the answer to {key!r}"
                for placeholder in wanted:
                    if [a.arg for a in fn.args.args] != [a.arg for a in placeholder.args.args]:
                        continue
                    fn.name = placeholder.name  # run it as the student's answer
                    for call in calls[key]:
                        try:
                            _run_check("import math\nimport numpy as np\n" + ast.unparse(fn), call)
                        except Exception:  # a wrong answer, or a helper that needs the notebook's state
                            pass
                        out = capsys.readouterr().out
                        assert "CORRECT" not in out, (
                            f"{source.stem}: a cell defines a function that passes the check of {key!r} "
                            f"(a stand-in? use checks.stand_in): {call}"
                        )
    checks.reset_hints()


def test_stand_ins_pass_their_exercises_checks_and_unknown_names_are_refused(capsys):
    checks.tanh_backward(checks.stand_in("tanh_backward"))
    checks.numerical_grad(checks.stand_in("numerical_grad"))
    checks.inter_node_bytes(checks.stand_in("inter_node_bytes"))
    checks.powersgd_values(checks.stand_in("powersgd_values"))
    assert capsys.readouterr().out.count("CORRECT") == 4
    with pytest.raises(ValueError, match="numerical_grad"):
        checks.stand_in("ring_time")


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_the_answer_after_a_check_stays_collapsed_until_opened(source: Path):
    """Text right after a check that states the exercise's formula is a ``[markdown reveal]`` cell:
    JupyterLab shows it collapsed, with only its first line (which says to try first, and gives nothing
    away) on the placeholder."""
    nb = build.build_notebook(source)
    formulas, key, revealed = _all_formulas(), None, 0
    for cell in nb.cells:
        if "check" in cell.metadata.get("tags", []):
            key = cell.metadata["exercise"]
            continue
        if cell.cell_type != "markdown":
            key = None  # only the text right after a check is its commentary
            continue
        hidden = cell.metadata.get("jupyter", {}).get("source_hidden") is True
        if "reveal" in cell.metadata.get("tags", []) or hidden:
            first = cell.source.splitlines()[0]
            assert hidden and "reveal" in cell.metadata["tags"], f"{source.stem}: {cell.metadata}"
            assert "Try first; then open this cell" in first, f"{source.stem}: first line {first!r}"
            assert not [f for f in formulas if f in _squash(first)], f"{source.stem}: {first!r}"
            revealed += 1
        elif key is not None:
            leaked = [f for f in map(_squash, FORMULAS[key]) if f in _squash(cell.source)]
            assert not leaked, f"{source.stem}: the text after check {key!r} shows {leaked}, not collapsed"
    if source.stem[:2] in (
        "03",
        "05",
        "07",
        "09",
        "10",
        "12",
    ):  # the lessons that give the answer after a check
        assert revealed, f"{source.stem}: no collapsed answer"


def test_build_collapses_reveal_cells_and_refuses_other_markdown_keys():
    cells = build.parse_cells("# %% [markdown reveal]\n# **The answer.** Try first; then open this cell.\n")
    assert cells == [("markdown", "reveal", "**The answer.** Try first; then open this cell.")]
    with pytest.raises(ValueError, match="reveal"):
        build.parse_cells("# %% [markdown answer]\n# text\n")


# --- every exercise's reference answer agrees with the library -------------------------------------
# A student who reads the library must be marked right, and one who carries a lesson's answer into an
# assignment must keep the points: where minidist computes the quantity an exercise asks for, the
# lesson's reference answer is compared with minidist's own function over a range of inputs.


def _reference(stem: str, key: str, name: str):
    """The function (or value) ``name`` defined by lesson ``stem``'s reference answer to ``key``."""
    namespace: dict = {}
    exec(build.solution_cells(stem)[key]["solution"][0], namespace)
    return namespace[name]


class _NeighbourChannel(_RecordingChannel):
    """Also records to whom every message goes and from whom every message comes."""

    def __init__(self) -> None:
        super().__init__()
        self.peers: set[tuple[int, int]] = set()

    def host_sendrecv(self, send, dest, recv, source) -> None:
        self.peers.add((source, dest))
        super().host_sendrecv(send, dest, recv, source)


def test_lesson_01_tanh_backward_is_minidists_tanh_gradient():
    import minidist as md

    tanh_backward = _reference("01_autograd", "tanh", "tanh_backward")
    x = np.linspace(-4, 4, 41)
    g = np.random.default_rng(1).standard_normal(x.shape)
    t = md.tensor(x, dtype=np.float64, requires_grad=True)
    t.tanh().backward(g)
    np.testing.assert_allclose(tanh_backward(np.tanh(x), g), t.grad, rtol=1e-12, atol=1e-15)


def test_lesson_01_numerical_grad_agrees_with_autograd_and_the_gradcheck_helper():
    import minidist as md

    numerical_grad = _reference("01_autograd", "numgrad", "numerical_grad")
    import gradcheck as helper  # tests/helpers/gradcheck.py

    w = np.random.default_rng(2).standard_normal((4, 3))
    for seed in range(3):
        x0 = np.random.default_rng(seed).standard_normal(4)

        def f(v: np.ndarray) -> float:
            return float(np.sum(np.tanh(v @ w) ** 2) + np.sum(np.exp(v / 3)))

        t = md.tensor(x0[None, :], dtype=np.float64, requires_grad=True)  # (1, 4): matmul wants 2-d
        ((t @ md.tensor(w, dtype=np.float64)).tanh() ** 2).sum().backward()
        (t / 3).exp().sum().backward()  # accumulates into t.grad: the gradient of the sum
        analytic = t.grad[0]
        ours = numerical_grad(f, x0.copy(), 1e-6)
        np.testing.assert_allclose(ours, analytic, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(ours, helper.numerical_gradient(f, x0.copy()), rtol=1e-9, atol=1e-9)


def test_lesson_02_ring_neighbors_are_the_peers_ring_py_talks_to():
    from types import SimpleNamespace

    from minidist.distributed.algorithms.ring import ring_reduce_scatter

    ring_neighbors = _reference("02_mpi", "ring", "ring_neighbors")
    for n in (2, 3, 5, 8):
        for r in range(n):
            channel = _NeighbourChannel()
            ring_reduce_scatter(
                SimpleNamespace(size=n, rank=r, collective_channel=channel), np.ones(n), "sum"
            )
            assert channel.peers == {ring_neighbors(r, n)}, (n, r)  # (left = source, right = dest)


def test_lesson_03_ring_time_is_perfmodels_ring_all_reduce_time():
    from minidist_tools.perfmodel import step as perfmodel

    ring_time = _reference("03_ring_allreduce", "ringtime", "ring_time")
    for n in (1, 2, 3, 8, 64, 1024):
        for nbytes in (0, 1, 1e3, 4e8):
            for alpha, beta in [(5e-6, 1 / 12.5e9), (2e-6, 1e-9), (0.0, 1e-10)]:
                want = perfmodel.ring_all_reduce_time(nbytes, n, alpha, beta)
                assert ring_time(nbytes, n, alpha, beta) == pytest.approx(want, rel=1e-12, abs=1e-18)


def test_lesson_04_microbatch_weight_makes_minidists_accumulated_gradient_the_full_batch_one():
    import minidist as md
    from minidist import nn

    microbatch_weight = _reference("04_data_parallel", "accum", "microbatch_weight")
    rng = np.random.default_rng(4)
    for batch, k in [(31, 2), (128, 3), (10, 4), (7, 1), (12, 5)]:
        x, y = rng.standard_normal((batch, 6)), rng.integers(0, 3, batch)
        md.manual_seed(0)
        full = nn.Linear(6, 3, dtype=np.float64)
        nn.functional.cross_entropy(full(md.tensor(x, dtype=np.float64)), y).backward()
        md.manual_seed(0)
        accumulated = nn.Linear(6, 3, dtype=np.float64)
        pieces = np.array_split(np.arange(batch), k)  # the split minidist's samplers and pipeline use
        for i, rows in enumerate(pieces):
            loss = nn.functional.cross_entropy(accumulated(md.tensor(x[rows], dtype=np.float64)), y[rows])
            (loss * microbatch_weight([len(p) for p in pieces], i)).backward()  # .grad accumulates
        np.testing.assert_allclose(accumulated.weight.grad, full.weight.grad, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(accumulated.bias.grad, full.bias.grad, rtol=1e-12, atol=1e-14)


def test_lesson_06_shard_shape_is_the_shape_minidists_tp_layers_keep():
    """Every tp size on one process (``shard_parameter`` with a stand-in group, the axis each layer
    shards); the layers themselves on real ranks in the MPI test below."""
    from types import SimpleNamespace

    from minidist.nn import Parameter
    from minidist.parallel.tensor_parallel.layers import shard_parameter

    shard_shape = _reference("06_tensor_parallel", "shard", "shard_shape")
    for out_f, in_f in [(8, 4), (12, 24), (1024, 4096)]:
        full = Parameter(np.zeros((out_f, in_f)))
        for tp in (1, 2, 4):
            for kind, tp_dim in (("column", 0), ("row", 1)):  # as ColumnParallelLinear / RowParallelLinear
                for rank in range(tp):
                    group = SimpleNamespace(size=tp, rank=rank)
                    assert shard_parameter(full, tp_dim, group).shape == shard_shape(out_f, in_f, tp, kind)


def test_lesson_07_bubble_fraction_is_perfmodels_and_the_simulated_schedules():
    from minidist.parallel.pipeline import gpipe, one_f_one_b, simulate
    from minidist_tools.perfmodel import step as perfmodel

    bubble_fraction = _reference("07_pipeline_parallel", "bubble", "bubble_fraction")
    for p in range(1, 7):
        for m in (1, 2, 3, 5, 8, 16):
            want = perfmodel.bubble_fraction(p, m)
            assert bubble_fraction(p, m) == pytest.approx(want, rel=1e-12, abs=1e-15), (p, m)
            for schedule in (gpipe(p, m), one_f_one_b(p, m)):
                assert simulate(schedule, 1.0, 2.0).bubble_fraction() == pytest.approx(want, abs=1e-12)


def test_lesson_07_peak_activations_is_what_minidists_1f1b_schedule_holds():
    from minidist.parallel.pipeline import one_f_one_b, peak_activations

    peak = _reference("07_pipeline_parallel", "peak", "peak_activations_1f1b")
    for p in range(1, 7):
        for m in (1, 2, 3, 5, 8):
            assert [peak(p, m, s) for s in range(p)] == list(peak_activations(one_f_one_b(p, m))), (p, m)


def test_lesson_08_shards_needed_reads_what_minidists_resharding_assembles():
    from minidist.checkpoint.layout import local_piece

    shards_needed = _reference("08_checkpoints", "shards", "shards_needed")
    for size, saved_tp, new_tp in [(12, 2, 3), (12, 3, 2), (8, 4, 4), (8, 1, 4), (8, 4, 1), (24, 4, 6)]:
        data = np.arange(size)
        saved = np.split(data, saved_tp)
        entry = {"tp_dim": 0, "global_shape": [size], "shards": [{"tp_rank": k} for k in range(saved_tp)]}
        for r in range(new_tp):
            want = local_piece("w", entry, saved, new_tp, r, 0)
            got = np.concatenate([saved[k][lo:hi] for k, lo, hi in shards_needed(size, saved_tp, new_tp, r)])
            np.testing.assert_array_equal(got, want)


def test_lesson_09_mesh_rank_and_dp_speedup_are_the_librarys():
    from minidist.parallel.mesh import mesh_coords
    from minidist.parallel.mesh import mesh_rank as library_mesh_rank
    from minidist_tools.perfmodel import step as perfmodel

    mesh_rank = _reference("09_scaling", "rank", "mesh_rank")
    for dp, tp, pp in [(2, 2, 2), (3, 2, 1), (1, 4, 2), (2, 1, 3), (4, 8, 2)]:
        for rank in range(dp * tp * pp):
            d, t, s = mesh_coords(rank, dp, tp, pp)
            assert mesh_rank(d, t, s, dp, tp) == library_mesh_rank(d, t, s, dp, tp) == rank
    dp_speedup = _reference("09_scaling", "speedup", "dp_speedup")
    for hw in (
        perfmodel.Hardware(flops=1.2e14, alpha=20e-6, beta=1 / 12.5e9),
        perfmodel.Hardware(1e12, 1e-6, 1e-9),
    ):
        for params in (125e6, 1.3e9):
            work = perfmodel.Workload(
                params=params, global_batch=1024, tokens_per_sample=2048, bytes_per_value=2
            )
            for gpus in (1, 2, 8, 64, 1024):
                want = perfmodel.predict(work, hw, dp=gpus).speedup
                args = (work.flops_per_step, gpus, params * work.bytes_per_value, hw.flops, hw.alpha, hw.beta)
                assert dp_speedup(*args) == pytest.approx(want, rel=1e-9), (params, gpus)


def test_lesson_10_layer_norm_backward_is_minidists_over_shapes_and_offsets():
    import minidist as md
    from minidist.nn import functional as F

    layer_norm_backward = _reference("10_transformer", "layernorm", "layer_norm_backward")
    rng = np.random.default_rng(10)
    for rows, n, offset, eps in [
        (1, 2, 0.0, 1e-5),
        (6, 33, 100.0, 1e-5),
        (3, 5, -1.0, 0.1),
        (2, 64, 0.0, 1e-12),
    ]:
        x = rng.standard_normal((rows, n)) + offset
        gamma, beta, dy = rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal((rows, n))
        tx, tg, tb = (md.tensor(a, dtype=np.float64, requires_grad=True) for a in (x, gamma, beta))
        F.layer_norm(tx, (n,), tg, tb, eps=eps).backward(dy)
        for ours, lib in zip(layer_norm_backward(x, gamma, dy, eps), (tx.grad, tg.grad, tb.grad)):
            np.testing.assert_allclose(ours, lib, rtol=1e-9, atol=1e-11)


def test_lesson_10_counts_are_gpts_num_parameters_and_flops_per_token():
    from minidist.models import GPT, GPTConfig

    count_parameters = _reference("10_transformer", "params", "count_parameters")
    count_flops = _reference("10_transformer", "flops", "count_flops")
    for vocab, block, layers, heads, width in [(3, 2, 1, 1, 2), (65, 64, 4, 4, 128), (11, 9, 5, 3, 12)]:
        config = GPTConfig(vocab_size=vocab, block_size=block, n_layer=layers, n_head=heads, n_embd=width)
        model = GPT(config)
        assert (
            count_parameters(config) == model.num_parameters() == sum(p.data.size for p in model.parameters())
        )
        assert count_flops(config) == model.flops_per_token()


def test_lesson_answers_agree_with_minidist_on_real_ranks(tmp_path):
    """Lessons 05, 06, 08 and 11 against the library on 2 ranks: the tp layers' weight shapes, the f
    operator's backward, ZeRO's measured memory, the files of a committed checkpoint and the
    vocabulary-parallel loss."""
    import json

    from mpi_utils import run_mpi

    run_mpi(2, "lessons/library_quantities.py", tmp_path, timeout=120)
    lib = json.loads((tmp_path / "library.json").read_text())
    shard_shape = _reference("06_tensor_parallel", "shard", "shard_shape")
    for kind, shapes in lib["shapes"].items():
        for sizes, shape in shapes.items():
            out_f, in_f = map(int, sizes.split(","))
            assert tuple(shape) == shard_shape(out_f, in_f, 2, kind), (kind, sizes)

    assert _reference("06_tensor_parallel", "fg", "OPERATOR_BEFORE_COLUMN") == "f"
    f_backward = _reference("06_tensor_parallel", "fg", "f_backward")
    ours = f_backward([np.array(r["local"]) for r in lib["f_backward"]])
    for rank, r in enumerate(lib["f_backward"]):
        np.testing.assert_allclose(ours[rank], np.array(r["out"]), rtol=1e-12, err_msg=f"rank {rank}")

    zero_bytes = _reference("05_zero", "zero", "zero_bytes")
    for stage, report in lib["zero"].items():
        # float32 AdamW: b = 4, K = 8. The formula divides by N; array_split gives the largest rank
        # one more element of a part when N does not divide Psi: at most b + b + K bytes more.
        formula = zero_bytes(lib["psi"], 2, int(stage), 4, 8)
        assert 0 <= report["total"] - formula <= 4 + 4 + 8, (stage, report, formula)

    files_before_latest = _reference("08_checkpoints", "files", "files_before_latest")
    saved = lib["checkpoint"]
    assert files_before_latest(saved["step"], saved["writers"]) == set(saved["files"])

    vocab_parallel_loss = _reference("11_transformer_parallelism", "vocabloss", "vocab_parallel_loss")
    case = lib["vocab_loss"]
    shards = np.array_split(np.array(case["logits"]), 2, axis=1)  # the slices the ranks held
    np.testing.assert_allclose(
        vocab_parallel_loss(shards, np.array(case["targets"])), case["losses"], rtol=1e-12
    )


def test_lesson_11_answers_are_minidists_loss_attention_traffic_and_mesh():
    """The split-vocabulary loss is cross_entropy of the whole logits; the online softmax is
    scaled_dot_product_attention; the bytes are perfmodel_transformer's; the rank is the mesh's."""
    import minidist as md
    from minidist.nn import functional as F
    from minidist.parallel.mesh import mesh_coords4, mesh_rank
    from minidist_tools.perfmodel import transformer as pt

    stem = "11_transformer_parallelism"
    vocab_parallel_loss = _reference(stem, "vocabloss", "vocab_parallel_loss")
    online_attention = _reference(stem, "online", "online_attention")
    tp_bytes_per_layer = _reference(stem, "tpbytes", "tp_bytes_per_layer")
    mesh_rank4 = _reference(stem, "rank4", "mesh_rank4")
    rng = np.random.default_rng(11)
    for vocab, tp in [(2, 2), (65, 2), (65, 4), (50257, 8)]:
        logits, targets = rng.standard_normal((5, vocab)) * 10, rng.integers(0, vocab, 5)
        want = F.cross_entropy(md.tensor(logits), targets, reduction="none").numpy()
        got = vocab_parallel_loss(np.array_split(logits, tp, axis=1), targets)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-10)  # log S + M - z_t cancels
    for blocks in [(1,), (3, 1, 4), (2, 2, 2, 2)]:
        q, k = rng.standard_normal((3, 4)) * 5, rng.standard_normal((sum(blocks), 4)) * 5
        v = rng.standard_normal((sum(blocks), 2))
        want = F.scaled_dot_product_attention(md.tensor(q), md.tensor(k), md.tensor(v)).numpy()
        cuts = np.cumsum(blocks)[:-1]
        np.testing.assert_allclose(
            online_attention(q, np.split(k, cuts), np.split(v, cuts)), want, rtol=1e-10
        )
    for batch, seq, hidden, tp in [(1, 1, 1, 1), (4, 64, 128, 2), (1, 2048, 12288, 8)]:
        want = pt.tensor_parallel_bytes_per_layer(batch, seq, hidden, tp, bytes_per_value=2).total
        assert tp_bytes_per_layer(batch, seq, hidden, tp, 2) == pytest.approx(want, rel=1e-12)
    for dp, tp, pp, cp in [(2, 2, 2, 2), (1, 4, 1, 2), (3, 1, 2, 2)]:
        for rank in range(dp * tp * pp * cp):
            d, t, s, c = mesh_coords4(rank, dp, tp, pp, cp)
            assert mesh_rank4(d, t, s, c, dp, tp, cp) == mesh_rank(d, t, s, dp, tp, cp_rank=c, cp=cp) == rank


def test_lesson_12_link_bytes_and_powersgd_values_are_what_minidist_sends(tmp_path):
    """The counts of ``minidist_tools.perfmodel.network`` (whose sweet spots the lesson plots), and on
    simulated nodes (blocks of ranks, real MPI): the bytes the ranks of one node send to other nodes
    in minidist's ring and hierarchical all-reduce, for 2 nodes of 2 ranks and 4 nodes of 1, equal the
    reference ``inter_node_bytes``; the bytes the all-reduces of a DDP step with the PowerSGD hook reduce
    (DDP's ``comm_stats``) are 4 (float32) per value of ``powersgd_values``, once it compresses. The
    real links' counters are compared in ``test_lesson_12_link_bytes_cross_the_cluster_links``. Two
    launches of 4 ranks: about 6 s on an idle 2-core machine (25 s at a load average of 18)."""
    import json

    from mpi_utils import run_mpi

    from minidist_tools.perfmodel import network as pn

    inter_node_bytes = _reference("12_network_bottleneck", "linkbytes", "inter_node_bytes")
    powersgd_values = _reference("12_network_bottleneck", "powersgd", "powersgd_values")
    for nodes in (1, 2, 3, 16):  # the model the lesson's sweet spots come from counts the same bytes
        for per_node in (1, 2, 8):
            for algorithm in ("ring", "hierarchical"):
                want = pn.inter_node_bytes(1e9, nodes, per_node, algorithm)
                assert inter_node_bytes(1e9, nodes, per_node, algorithm) == pytest.approx(want, rel=1e-12)
    for shapes in ([(3, 4, 5), (7,), (100, 100)], [(50257, 768), (768,)], [(2, 2)]):
        for rank, rate in [(1, 2), (4, 1), (8, 2)]:
            assert powersgd_values(shapes, rank, rate) == pn.powersgd_values(shapes, rank, rate)
    for ranks, per_node in [(4, 2), (4, 1)]:  # a hierarchy; none (one rank per node: the flat fallback)
        out = tmp_path / f"{ranks}x{per_node}"
        out.mkdir()
        env = {"MINIDIST_RANKS_PER_NODE": str(per_node), "POWERSGD": str(int(per_node == 2))}
        run_mpi(ranks, "lessons/network_bytes.py", out, 4 * 2**20, timeout=120, env=env)
        lib = json.loads((out / "network.json").read_text())
        nodes = ranks // per_node
        assert lib["node_of_rank"] == [r // per_node for r in range(ranks)]
        for algorithm in ("ring", "hierarchical"):
            per_node_sent = [
                sum(lib[algorithm][r] for r in range(n * per_node, (n + 1) * per_node)) for n in range(nodes)
            ]
            want = inter_node_bytes(lib["nbytes"], nodes, per_node, algorithm)
            # The ring cuts the message into chunks of whole elements: at most a few bytes off per step.
            assert per_node_sent == pytest.approx([want] * nodes, abs=8 * ranks), (ranks, per_node, algorithm)
        if per_node == 2:
            step = lib["powersgd"]
            shapes = [tuple(s) for s in step["shapes"]]
            compressed = 4 * powersgd_values(shapes, step["rank"], step["rate"])
            plain = 4 * sum(int(np.prod(s)) for s in shapes)
            assert step["payload_per_step"] == [plain, plain, compressed, compressed], (
                step,
                compressed,
                plain,
            )


@pytest.mark.cluster
def test_lesson_12_link_bytes_cross_the_cluster_links(tmp_path):
    """On a cluster of 2 namespaces x 2 ranks (real TCP; skipped without root): the bytes that leave each
    node's link during one ring and one hierarchical all-reduce of 16 MiB are the reference
    ``inter_node_bytes``, plus the frames' headers (Ethernet, IP, TCP: up to 5 % in 1500-byte frames;
    measured 0.3 %, since the veths pass segments of up to 64 KiB) and the launcher's own messages (well
    under 1 MB). About 4 s on an idle 2-core machine (14 s at a load average of 18)."""
    from minidist_tools.cluster import Cluster, cluster_available

    available, reason = cluster_available()
    if not available:
        pytest.skip(reason)
    inter_node_bytes = _reference("12_network_bottleneck", "linkbytes", "inter_node_bytes")
    worker = REPO / "tests" / "workers" / "lessons" / "network_bytes.py"
    nbytes = 16 * 2**20
    with Cluster.up(nodes=2, ranks_per_node=2) as cluster:
        before = cluster.link_bytes()
        env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "workers")])}
        proc = cluster.run([sys.executable, str(worker), str(tmp_path), str(nbytes)], timeout=120, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        after = cluster.link_bytes()
    # The worker runs one ring and one hierarchical all-reduce (and nothing else of that size).
    want = inter_node_bytes(nbytes, 2, 2, "ring") + inter_node_bytes(nbytes, 2, 2, "hierarchical")
    for node in after:
        sent = after[node][0] - before[node][0]
        assert want <= sent <= 1.08 * want + 1e6, f"{node} sent {sent:,} bytes, the lesson says {want:,.0f}"


def test_lesson_13_answers_are_perfmodel_failures_and_what_the_simulation_shows():
    """The reference answers of lesson 13 are ``minidist_tools.perfmodel.failures``' functions, and what those
    claim holds where it can be sampled: the first failure among N nodes comes after the answer's MTBF on
    average (the minimum of N exponential samples), and Young's interval minimises the first-order waste
    C / tau + tau / (2M) on a fine grid; the simulated optimum itself is tested in
    ``tests/tools/perfmodel/test_perfmodel_failures.py``. Well under a second."""
    from minidist_tools.perfmodel import failures as pf

    system_mtbf = _reference("13_failures", "mtbf", "system_mtbf")
    young_interval = _reference("13_failures", "young", "young_interval")
    for node_mtbf, nodes in [(1.0, 1), (3600.0, 7), (1.6e8, 16384)]:
        assert system_mtbf(node_mtbf, nodes) == pytest.approx(pf.system_mtbf(node_mtbf, nodes), rel=1e-12)
    # 20,000 draws of the first of 32 failures of mean 100 s: standard error 100 / 32 / sqrt(20000).
    first = np.random.default_rng(5).exponential(100.0, (20_000, 32)).min(axis=1)
    assert first.mean() == pytest.approx(system_mtbf(100.0, 32), abs=4 * 100 / 32 / np.sqrt(20_000))
    for save, mtbf in [(60.0, 9630.6), (1.0, 1e6), (300.0, 3600.0)]:
        tau = young_interval(save, mtbf)
        assert tau == pytest.approx(pf.young_interval(save, mtbf), rel=1e-12)
        grid = tau * np.linspace(0.5, 2.0, 3001)
        waste = save / grid + grid / (2 * mtbf)
        assert grid[np.argmin(waste)] == pytest.approx(tau, rel=1e-3)  # the grid's step is 5e-4 tau


def test_lesson_14_block_bytes_is_what_the_memory_tracker_measures():
    """The reference answer of lesson 14 is ``perfmodel_memory.gpt_layer_activation_bytes`` (which
    tests/memory/test_memory.py holds to the tracker's measurement), and the measurement itself: one block is
    the difference of a 2-block and a 1-block GPT's activations after forward. Under a second."""
    import minidist as md
    from minidist import memory
    from minidist.models import GPT, GPTConfig
    from minidist_tools.perfmodel.memory import gpt_layer_activation_bytes

    block_bytes = _reference("14_memory", "block", "block_activation_bytes")
    for s, b, h, a, itemsize in [(16, 8, 96, 2, 4), (5, 3, 12, 3, 8), (64, 1, 32, 4, 2)]:
        assert block_bytes(s, b, h, a, itemsize) == gpt_layer_activation_bytes(b, s, h, a, itemsize=itemsize)
    held = []
    for layers in (1, 2):
        md.manual_seed(0)
        gpt = GPT(GPTConfig(vocab_size=11, block_size=6, n_layer=layers, n_head=3, n_embd=12))
        with memory.MemoryTracker(gpt) as tracker:
            out = gpt(np.zeros((2, 6), dtype=np.int64))
            held.append(tracker.report()["activations"]["current"])
        del out
    assert held[1] - held[0] == block_bytes(6, 2, 12, 3, 4)


# --- lesson figures ------------------------------------------------------------------------------


def test_lesson_01_graph_figure_names_every_leaf_and_no_boxes_overlap():
    """Runs lesson 01's cells up to its graph drawing and inspects the figure it leaves behind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = build.parse_cells((LESSONS / "src" / "01_autograd.py").read_text())
    code = [text for kind, _, text in cells if kind == "code"]
    namespace: dict = {}
    plt.close("all")
    for text in code:
        exec(text, namespace)
        if "draw(y)" in text:
            break
    fig = plt.gcf()
    fig.canvas.draw()
    texts = [t for t in fig.axes[0].texts if t.get_bbox_patch() is not None]
    assert len(texts) == 10, [t.get_text() for t in texts]  # 5 leaves, 2 products, 2 sums, tanh
    first_lines = sorted(t.get_text().splitlines()[0] for t in texts)
    assert {"x1", "x2", "w1", "w2", "b"} <= set(first_lines), f"unnamed leaves: {first_lines}"
    boxes = [t.get_bbox_patch().get_window_extent() for t in texts]
    for i, a in enumerate(boxes):
        for j, other in enumerate(boxes[:i]):
            assert not a.overlaps(other), f"boxes {texts[i].get_text()!r} and {texts[j].get_text()!r} overlap"
    plt.close("all")


def test_lesson_07_synthetic_stages_measure_the_theoretical_bubble(tmp_path):
    """Lesson 07's measurement under its own conditions (2 ranks, 1F1B, m = 4, stages of 40 ms): the
    measured bubble is within the tolerance the lesson states of (p-1)/(m+p-1), also on a loaded machine
    (the stage time dwarfs wake-up and message delays). About 3 s."""
    import json
    import re

    from mpi_utils import run_mpi

    from minidist.parallel.pipeline import one_f_one_b
    from minidist_tools.gantt import timeline_from_trace

    source = (LESSONS / "src" / "07_pipeline_parallel.py").read_text()
    tolerance = float(re.search(r"^TOLERANCE = ([0-9.]+)", source, re.M).group(1))
    assert '"--stage-ms", 40' in source and '"--width", 64, "--batch", 256' in source  # what is tested here
    p, m = 2, 4
    run_mpi(
        p,
        str(LESSONS / "scripts" / "pipeline_trace.py"),
        tmp_path / "trace.json",
        *("--schedule", "1f1b", "-m", m, "--width", 64, "--batch", 256, "--stage-ms", 40),
        timeout=120,
        env={"MINIDIST_TIMEOUT": "60"},
    )
    result = json.loads((tmp_path / "trace.json").read_text())
    measured = timeline_from_trace(one_f_one_b(p, m), result["events"]).bubble_fraction()
    assert abs(measured - (p - 1) / (m + p - 1)) <= tolerance, f"measured bubble {measured:.3f}, formula 0.2"
