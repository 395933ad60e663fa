"""The coursework machinery grades itself: markers, release, grader, and plausible student mistakes.

* markers: parsing, malformed markers, stubs that compile with the right indentation;
* consistency: every task in a task file has a solution region and every region a declared task;
* release: the student copy imports, carries no solution of the released or later assignments (nor
  bytecode, nor hidden tests) and keeps earlier assignments' solutions;
* the reference scores full marks on every assignment; the released starter scores 0 quickly;
* mutants: a small patch per task that a student could plausibly write loses that task's points, and
  the feedback names the problem (a deadlock and an endless loop included: they time out).
"""

from __future__ import annotations

import compileall
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minidist_course.assignments import grade, layout, release
from minidist_course.assignments.markers import blank, find_regions, regions_in
from minidist_course.assignments.tasks import load

REPO = layout.REPO_ROOT
ASSIGNMENTS = layout.available()
# MPI-heavy: the public tests show the 0 as well
PUBLIC_ONLY_STARTER = {"A2", "A3", "A4", "A5", "A6", "A7", "A9"}


def test_markers_parse_and_blank():
    text = (
        "def f(x):\n"
        '    """Doc."""\n'
        "    # BEGIN SOLUTION A2.1: double x\n"
        "    y = 2 * x\n"
        "    return y\n"
        "    # END SOLUTION\n"
        "\n"
        "def g():\n"
        "    # BEGIN SOLUTION A1.3: the answer\n"
        "    return 42\n"
        "    # END SOLUTION\n"
    )
    regions = find_regions(text)
    assert [(r.task, r.description, r.begin, r.end) for r in regions] == [
        ("A2.1", "double x", 2, 5),
        ("A1.3", "the answer", 8, 10),
    ]
    out, count = blank(text, lambda r: r.number >= 2)
    assert count == 1
    assert '    raise NotImplementedError("A2.1: double x")' in out and "return 42" in out
    namespace: dict = {}
    exec(compile(out, "<released>", "exec"), namespace)  # the stub compiles and keeps the signature
    with pytest.raises(NotImplementedError, match="A2.1: double x"):
        namespace["f"](3)
    assert namespace["g"]() == 42


@pytest.mark.parametrize(
    "bad, problem",
    [
        ("# BEGIN SOLUTION A1.1: x\ny = 1\n", "never closed"),
        ("y = 1\n# END SOLUTION\n", "without a BEGIN"),
        ("# BEGIN SOLUTION A1.1: x\n# BEGIN SOLUTION A1.2: y\n", "inside the region"),
        ("# BEGIN SOLUTION A1: no task number\ny = 1\n# END SOLUTION\n", "malformed"),
        ("# BEGIN SOLUTION A1.1: only a comment\n# nothing\n# END SOLUTION\n", "holds no code"),
    ],
)
def test_malformed_markers_are_rejected(bad, problem):
    with pytest.raises(ValueError, match=problem):
        find_regions(bad, "demo.py")


def test_every_task_has_a_region_and_every_region_a_task():
    regions = regions_in(layout.marked_files(REPO / "minidist"), REPO)
    declared = {}
    for a in ASSIGNMENTS:
        spec = load(layout.assignment_dir(a))
        declared.update({t.id: a for t in spec.tasks})
        assert sum(t.max_points for t in spec.tasks) > 0
    marked = {r.task for r in regions}
    assert set(declared) <= marked, f"tasks without a solution region: {sorted(set(declared) - marked)}"
    assert marked <= set(declared), f"regions of undeclared tasks: {sorted(marked - set(declared))}"


def _run_in(copy: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=copy, env=env, capture_output=True, text=True)


def test_release_blanks_this_and_later_assignments_and_still_imports(tmp_path):
    out = tmp_path / "A2"
    report = release("A2", out)
    assert set(report.blanked) >= {"A2.1", "A2.2", "A2.3", "A3.1", "A3.2", "A3.3", "A7.1", "A7.2"}
    assert not any(t.startswith("A1.") for t in report.blanked)
    left = {r.task for r in regions_in(layout.marked_files(out / "minidist"), out)}
    assert left and all(t.startswith("A1.") for t in left), f"kept regions: {left}"  # earlier: intact
    assert not list(out.rglob("__pycache__")) and not list(out.rglob("*.pyc"))
    handout = (layout.REPO_ROOT / "lessons/assignments/A2/README.md").read_text()
    assert (out / "README.md").read_text().endswith(handout)  # the handout, not the project README
    assert (out / "lessons/assignments/A2/public").is_dir() and (
        out / "lessons/assignments/A2/tasks.toml"
    ).exists()
    assert not (out / "lessons/assignments/A2/hidden").exists(), "hidden tests must not be released"
    assert not (out / "lessons/assignments/A3").exists(), "other assignments' folders must not be released"
    assert (
        "host_sendrecv" not in (out / "minidist/distributed/algorithms/ring.py").read_text()
    )  # the ring's code is gone
    proc = _run_in(
        out,
        "import minidist, minidist.distributed, minidist.parallel, minidist_course.assignments; "
        "print(minidist.__file__)",
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve().is_relative_to(out.resolve())
    with pytest.raises(ValueError, match="earlier release; pass --force"):
        release("A2", out)
    with pytest.raises(ValueError, match="available"):
        release("A10", tmp_path / "ten")


def test_release_never_deletes_what_it_did_not_write(tmp_path):
    """--force replaces only an earlier release: never a folder holding the reference tree, never
    someone's other files, never a file."""
    precious = tmp_path / "work"
    precious.mkdir()
    (precious / "precious.txt").write_text("a week of work")
    repo = layout.REPO_ROOT
    for out in (precious, repo.parent, repo, repo / "minidist" / "x"):  # repo.parent contains the repo
        with pytest.raises(ValueError, match="refusing|not an earlier release"):
            release("A2", out, force=True)
    assert (precious / "precious.txt").read_text() == "a week of work"
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        release("A2", a_file, force=True)
    copy = tmp_path / "copy"
    release("A2", copy)
    release("A2", copy, force=True)  # an earlier release may be replaced
    assert (copy / "minidist").is_dir()


@pytest.fixture(scope="module")
def compiled() -> None:
    """Bytecode next to the reference's sources, as any earlier run leaves it where Python may write it.

    The grader's processes write none (``PYTHONDONTWRITEBYTECODE``: nothing in a student's folder) and
    neither does this machine's environment, so without this every probe, pytest child and MPI rank
    compiled minidist anew: ~0.2 s of CPU each, a fifth of the A2 grading. Python checks each .pyc
    against its source's mtime and size, so an edited file is compiled from its source all the same.
    """
    for folder in (REPO / "minidist", REPO / "lessons" / "assignments"):
        compileall.compile_dir(folder, quiet=1)


# A1 is graded in test_grading_workflow.py's class workflow: "alice" hands in a copy of the reference and
# must score 28 of 28, public and hidden tests (the same check, through the command line): not twice.
@pytest.mark.parametrize("assignment", [a for a in ASSIGNMENTS if a != "A1"])
def test_reference_scores_full_marks(assignment, compiled):
    report = grade(assignment)
    assert report.score == report.max_score > 0, report.table()
    assert not report.notes, report.notes  # hidden tests were found and run


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_released_starter_scores_zero(assignment, tmp_path):
    release(assignment, tmp_path / "starter")
    number = int(assignment[1:])
    earlier = [r for r in regions_in(layout.marked_files(REPO / "minidist"), REPO) if r.number < number]
    kept = regions_in(layout.marked_files(tmp_path / "starter" / "minidist"), tmp_path / "starter")
    assert [(r.path, r.task) for r in kept] == [(r.path, r.task) for r in earlier], (
        "earlier solutions must stay"
    )
    proc = _run_in(
        tmp_path / "starter", "import minidist.parallel, minidist.parallel.pipeline, minidist.checkpoint"
    )
    assert proc.returncode == 0, proc.stderr  # every module still imports with this and later regions blanked
    public_only = assignment in PUBLIC_ONLY_STARTER  # graded with the release's own tests, as a student does
    starter = tmp_path / "starter"
    report = grade(assignment, starter, include_hidden=not public_only, root=starter if public_only else None)
    assert report.score == 0, report.table()
    for task in report.tasks:
        assert "NotImplementedError" in task.feedback, task.feedback
    assert_gives_nothing_away(report)  # no hint and no solution for code not written yet
    assert report.seconds < 60, f"the starter took {report.seconds:.0f} s to grade: something waited"


def test_results_json_and_cli(tmp_path):
    results = tmp_path / "results.json"
    cmd = [
        sys.executable,
        "-m",
        "minidist_course.assignments",
        "grade",
        "A1",
        "--task",
        "A1.1",
        "--results",
        str(results),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "A1.1" in proc.stdout and "total" in proc.stdout
    data = json.loads(results.read_text())
    assert data["score"] == sum(t["max_score"] for t in data["tests"]) > 0
    for t in data["tests"]:
        assert set(t) >= {"name", "score", "max_score", "output", "visibility"}
    assert {t["visibility"] for t in data["tests"]} == {"visible", "after_published"}
    grade = [sys.executable, "-m", "minidist_course.assignments", "grade"]
    bad = subprocess.run([*grade, "A1", "--task", "A1.9"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown task" in bad.stderr


def test_grader_refuses_a_shadowed_minidist(tmp_path):
    fake = tmp_path / "sub" / "minidist"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__file__ = '/somewhere/else/minidist/__init__.py'\n")
    with pytest.raises(RuntimeError, match="shadows"):
        grade("A1", tmp_path / "sub", only_tasks=["A1.1"])


# (assignment, task, file, old, new, words the feedback must contain, per-test timeout or None)
MUTANTS = [
    ("A1", "A1.1", "minidist/ops/arithmetic.py", "grad.sum(axis=stretched, keepdims=True)",
     "grad.sum(axis=stretched)", "expected (2, 1)", None),
    ("A1", "A1.2", "minidist/ops/arithmetic.py", "grad_b = -grad * ((self.a / self.b) / self.b)",
     "grad_b = grad * ((self.a / self.b) / self.b)", "Div", None),
    ("A1", "A1.3", "minidist/ops/elementwise.py", "return (grad * self.y * (1 - self.y),)",
     "return (grad * self.y,)", "Sigmoid", None),
    # ReLU's op is tested by itself: nn.Sequential runs Linear + ReLU fused (ops/linear_relu.py), without it
    ("A1", "A1.3", "minidist/ops/elementwise.py", "return (grad * self.positive,)", "return (grad,)", "ReLU",
     None),
    ("A1", "A1.4", "minidist/ops/softmax.py", "d_logits *= grad * self.scale",
     "d_logits *= grad", "CrossEntropy", None),
    ("A1", "A1.5", "minidist/autograd/graph.py", "counts[id(inp)] += 1", "counts[id(inp)] = 1",
     "diamond", None),
    ("A1", "A1.5", "minidist/autograd/graph.py",
     "node.grad = node.grad + g", "node.grad = g.copy()", "must ADD",
     None),
    ("A1", "A1.5", "minidist/autograd/graph.py", "node = ready.pop()", "node = ready[-1]", "timed out", 4),
    ("A2", "A2.1", "minidist/distributed/algorithms/ring.py",
     "send_start, send_stop = bounds[(r - step - 1) % n]", "send_start, send_stop = bounds[(r - step) % n]",
     "ring_reduce_scatter", None),
    ("A2", "A2.1", "minidist/distributed/algorithms/ring.py",
     "    finish(op, flat[own_start:own_stop], n)", "    pass", "divide it by the group size", None),
    ("A2", "A2.2", "minidist/distributed/algorithms/ring.py",
     "link.host_sendrecv(flat[send_start:send_stop], right, flat[recv_start:recv_stop], left)",
     "link.host_sendrecv(flat[send_start:send_stop], right, flat[recv_start:recv_stop], right)", "hang", 5),
    ("A2", "A2.3", "minidist/distributed/algorithms/ring.py",
     "    ring_reduce_scatter(group, flat, op, bounds)\n    ring_all_gather(group, flat, bounds)\n",
     "    ring_all_gather(group, flat, bounds)\n    ring_reduce_scatter(group, flat, op, bounds)\n",
     "ring_all_reduce", None),
    ("A3", "A3.1", "minidist/parallel/data_parallel/buckets.py", "for i in reversed(range(len(nbytes))):",
     "for i in range(len(nbytes)):", "REVERSE", None),
    ("A3", "A3.2", "minidist/parallel/data_parallel/ddp.py",
     'bucket.pack()\n            dist.all_reduce(bucket.flat, op="avg"',
     'bucket.pack()\n            dist.all_reduce(bucket.flat, op="sum"', "times too large", None),
    ("A3", "A3.3", "minidist/parallel/data_parallel/ddp.py", "self._missing[self._bucket_of[i]] -= 1",
     "self._missing[i] -= 1", "_on_grad_ready", None),  # parameter index used as bucket index
    ("A3", "A3.3", "minidist/parallel/data_parallel/ddp.py",
     "while len(self._started) < len(self._buckets) and self._missing[len(self._started)] == 0:\n"
     "                self._start_next_bucket()",
     "pass", "did not overlap", None),
    ("A7", "A7.1", "minidist/parallel/zero/optimizer.py", 'dist.reduce_scatter(flat, op="avg"',
     'dist.reduce_scatter(flat, op="sum"', "times too large", None),
    ("A7", "A7.2", "minidist/parallel/zero/optimizer.py",
     "self._write_parameters(dist.all_gather(mine, group=self.group))", "pass",
     "differs from single-device", None),
    ("A4", "A4.1", "minidist/parallel/tensor_parallel/mappings.py",
     'return (dist.all_reduce(grad.copy(), op="sum", group=self.group),)', "return (grad,)",
     "f's backward must all-reduce", None),
    ("A4", "A4.2", "minidist/parallel/tensor_parallel/layers.py",
     "index[tp_dim] = slice(group.rank * width, (group.rank + 1) * width)",
     "index[tp_dim] = slice(group.rank, None, group.size)", "strided", None),
    ("A4", "A4.3", "minidist/parallel/tensor_parallel/layers.py",
     "x = copy_to_tensor_parallel_region(x, self.group)  # f", "pass  # f", "pass the input through f", None),
    ("A4", "A4.4", "minidist/parallel/tensor_parallel/layers.py",  # the bias on every rank before the g
     "partial = F.linear(x, self.weight)  # (..., out): this rank's share of the sum over in\n"
     "        y = reduce_from_tensor_parallel_region(partial, self.group)  # g\n"
     "        return y if self.bias is None else y + self.bias",
     "partial = F.linear(x, self.weight, self.bias)\n"
     "        y = reduce_from_tensor_parallel_region(partial, self.group)  # g\n        return y",
     "bias was added 2 times", None),
    ("A5", "A5.1", "minidist/parallel/pipeline/schedules.py",  # plain blocking sends, no Exchange:
     "prog.append(Exchange(Instruction(SEND_ACT, i), Instruction(RECV_GRAD, j)))\n"  # both neighbours
     "            prog.append(Instruction(BACKWARD, j))\n"  # send at once and wait for each other
     "            if not first:  # the gradient goes up as the next forward's input comes down\n"
     "                more = j < steady - 1\n"
     "                prog.append(\n"
     "                    Exchange(Instruction(SEND_GRAD, j), Instruction(RECV_ACT, i + 1))\n"
     "                    if more\n"
     "                    else Instruction(SEND_GRAD, j)\n"
     "                )",
     "prog += [Instruction(SEND_ACT, i), Instruction(RECV_GRAD, j)]\n"
     "            prog.append(Instruction(BACKWARD, j))\n"
     "            if not first:\n"
     "                prog.append(Instruction(SEND_GRAD, j))\n"
     "                if j < steady - 1:\n"
     "                    prog.append(Instruction(RECV_ACT, i + 1))",
     "deadlocks", 5),
    ("A5", "A5.1", "minidist/parallel/pipeline/schedules.py", "warmup = min(p - s - 1, m)",
     "warmup = m if s < p - 1 else 0", "1F1B holds at most", None),  # GPipe's memory
    ("A5", "A5.2", "minidist/parallel/pipeline/messaging.py",  # a real deadlock over MPI: cut by the timeout
     "recvtag=_tag(step.recv)", "recvtag=_tag(step.send)", "hang", 5),
    ("A6", "A6.1", "minidist/checkpoint/layout.py",
     "return full[shard_index(shape, tp_dim, tp, tp_rank, stride)]",
     "return full[shard_index(shape, 0, tp, tp_rank, stride)]", "slice along THIS model's tp_dim", None),
    ("A6", "A6.2", "minidist/checkpoint/save.py",
     "atomic.commit_dir(tmp, final)\n                doing, path = \"replacing the 'latest' pointer\", "
     "root / atomic.LATEST\n                atomic.write_latest(root, final.name)",
     "atomic.write_latest(root, final.name)\n                atomic.commit_dir(tmp, final)",
     "switched before the new folder was complete", None),
    ("A6", "A6.2", "minidist/checkpoint/atomic.py", 'write_durable(tmp, (name + "\\n").encode())',
     'tmp.write_text(name + "\\n")', "not fsynced", None),
    ("A6", "A6.3", "minidist/checkpoint/file_checks.py",
     "            if digest.result() != sha256:\n                raise CheckpointError(\n"
     '                    "shard file corrupt: its sha256 checksum differs from the manifest", path\n'
     "                )\n            # END SOLUTION",
     "            pass\n            # END SOLUTION", "silently different model", None),
    ("A8", "A8.1", "minidist/ops/layer_norm.py",
     "g -= xhat * (dy_xhat @ self.weight_over_n)[:, None]", "pass",  # sigma as a constant
     "orthogonal to that row's xhat", None),
    ("A8", "A8.1", "minidist/ops/layer_norm.py", "g -= (dy @ self.weight_over_n)[:, None]",
     "g -= (dy @ self.weight_over_n)[:, None] * n", "must sum to 0", None),  # a sum where the mean belongs
    ("A8", "A8.2", "minidist/ops/attention.py", "grad_q *= grad_q.dtype.type(self.scale)", "pass",
     "times the right one", None),  # the scale forgotten in dL/dq
    ("A8", "A8.2", "minidist/ops/attention.py", "dp -= (dp * p).sum(axis=-1, keepdims=True)", "pass",
     "sum to zero over the keys", None),  # the softmax Jacobian's rowsum term forgotten
    ("A8", "A8.2", "minidist/ops/attention.py",  # P recomputed in backward from Q and K, without the mask
     "qs, k, v, p, keep = self.qs, self.k, self.v, self.p, self.keep",
     "qs, k, v, keep = self.qs, self.k, self.v, self.keep\n"
     "        p = np.exp(qs @ _swap(k))\n        p /= p.sum(axis=-1, keepdims=True)",
     "cannot see keys", None),
    ("A8", "A8.2", "minidist/ops/attention.py", "        if keep is not None:\n            dp *= keep\n", "",
     "dropout_p=0.4", None),  # the dropout mask forgotten on the way back through P
    ("A9", "A9.1", "minidist/parallel/tensor_parallel/vocab_parallel_loss.py",  # the max all-reduce left out
     'm = dist.all_reduce(z.max(axis=1), op="max", group=group)', "m = z.max(axis=1)",
     "its own largest logit", None),
    ("A9", "A9.1", "minidist/parallel/tensor_parallel/vocab_parallel_loss.py",  # the shift of an even split
     "        local = t - start\n", "        local = t - group.rank * z.shape[1]\n",
     "does not own the target", None),
    ("A9", "A9.2", "minidist/parallel/context_parallel/ring_attention.py",  # a fully masked block computed
     "elif k_start <= q_stop - 1:", "else:", "fully masked", None),
    ("A9", "A9.2", "minidist/parallel/context_parallel/ring_attention.py",  # strictly below the diagonal
     "blocks.append(Block(q, k, q_start - k_start))", "blocks.append(Block(q, k, q_start - k_start - 1))",
     "never sees the key", None),
    ("A9", "A9.2", "minidist/parallel/context_parallel/ring_attention.py", "    o *= alpha\n", "",
     "rescaled too", None),  # the running output not rescaled when the maximum grows
    ("A9", "A9.2", "minidist/parallel/context_parallel/ring_attention.py",  # the ring turned the other way
     "source = (rank - step) % cp  # whose block", "source = (rank + step) % cp  # whose block",
     "which rank's block", None),
]  # fmt: skip


def mutant_copy(tmp_path: Path, file: str, old: str, new: str) -> Path:
    """A student's copy of ``minidist/`` under ``tmp_path`` with ``old`` (once in ``file``) made ``new``."""
    copy = tmp_path / "student"
    shutil.copytree(REPO / "minidist", copy / "minidist")  # with the bytecode (mtimes kept), see compiled
    target = copy / file
    source = target.read_text()
    assert source.count(old) == 1, f"{old!r} must occur once in {file}"
    target.write_text(source.replace(old, new))
    # The patched file's bytecode goes: the mutant is certainly compiled from its patched source.
    Path(importlib.util.cache_from_source(str(target))).unlink(missing_ok=True)
    return copy


@pytest.mark.parametrize(
    "assignment, task, file, old, new, words, timeout", MUTANTS, ids=[f"{m[1]}-{m[5]}" for m in MUTANTS]
)
def test_a_plausible_mistake_loses_the_task_and_is_named(
    tmp_path, assignment, task, file, old, new, words, timeout, compiled
):
    copy = mutant_copy(tmp_path, file, old, new)
    report = grade(assignment, copy, only_tasks=[task], include_hidden=False, timeout=timeout)
    assert report.points_of(task) < report.tasks[0].max_points, report.table()
    assert words in report.feedback_of(task), report.table()
    if timeout is not None:
        assert report.seconds < 4 * timeout + 30, f"a hang blocked the grader for {report.seconds:.0f} s"


def test_a_test_graded_by_property_scores_each_part_and_hints_at_the_failed_one(tmp_path, compiled):
    """A8.1's public test grades dx, dgamma and dbeta separately: a dgamma off by a factor keeps the
    points of dx and dbeta, and the hint is dgamma's, not the one about dx's three paths."""
    old = "(ones @ dy_xhat).reshape(inputs[1].shape)"
    copy = mutant_copy(
        tmp_path, "minidist/ops/layer_norm.py", old, "(2 * (ones @ dy_xhat)).reshape(inputs[1].shape)"
    )
    report = grade("A8", copy, only_tasks=["A8.1"], include_hidden=False)
    (result,) = report.tasks[0].results
    parts = {p.name: p for p in result.spec.parts}
    assert set(parts) == {"dx", "dgamma", "dbeta"}, result.spec.parts
    assert report.points_of("A8.1") == parts["dx"].points + parts["dbeta"].points, report.table()
    feedback = report.feedback_of("A8.1")
    assert feedback.startswith(f"{result.spec.label}: dgamma:") and "times the right one" in feedback
    assert parts["dgamma"].hint in feedback and parts["dx"].hint not in feedback, feedback
    entry = report.gradescope()["tests"][0]
    assert entry["score"] == report.points_of("A8.1") and entry["max_score"] == 4


def test_a1_scores_each_op_of_a_test_on_its_own(tmp_path, compiled):
    """A1.2's arithmetic test holds Mul and Div: a Div with the wrong sign for b keeps Mul's point, and
    the hint is Div's (the sign and the power of b), not Mul's."""
    old = "grad_b = -grad * ((self.a / self.b) / self.b)"
    copy = mutant_copy(
        tmp_path, "minidist/ops/arithmetic.py", old, "grad_b = grad * ((self.a / self.b) / self.b)"
    )
    report = grade("A1", copy, only_tasks=["A1.2"], include_hidden=False)
    by_name = {r.spec.name: r for r in report.tasks[0].results}
    parts = {p.name: p for p in by_name["test_mul_div_backward"].spec.parts}
    assert set(parts) == {"Mul", "Div"}
    lost = report.tasks[0].max_points - report.points_of("A1.2")
    assert lost == parts["Div"].points, report.table()  # Mul's point and MatMul's test are kept
    feedback = report.feedback_of("A1.2")
    assert parts["Div"].hint in feedback and parts["Mul"].hint not in feedback, feedback


def test_task_files_check_that_parts_add_up(tmp_path):
    folder = tmp_path / "A0"
    (folder / "public").mkdir(parents=True)
    (folder / "public" / "test_a.py").write_text("def test_a():\n    pass\n")
    head = '[[task]]\nid = "A0.1"\nname = "t"\n[[test]]\ntask = "A0.1"\nfile = "public/test_a.py"\n'
    parts = '[[test.part]]\nname = "x"\npoints = 1\n[[test.part]]\nname = "y"\npoints = 2\n'
    (folder / "tasks.toml").write_text(head + 'name = "test_a"\n' + parts)
    assert load(folder).tasks[0].tests[0].points == 3
    (folder / "tasks.toml").write_text(head + 'name = "test_a"\npoints = 4\n' + parts)
    with pytest.raises(ValueError, match="add up to 3"):
        load(folder)


# -- hints escalate and never give the answer; the graders enforce the handouts' rules --------------------


def _squeezed(text: str) -> str:
    """Text without spaces, one kind of quote: ``(r - s - 1) % n`` and ``(r-s-1)%n`` compare equal."""
    return "".join(text.split()).replace('"', "'")


def _solution_text(assignment: str | None = None) -> tuple[str, str]:
    """The lines inside the reference's solution regions, squeezed: (code and comments, code only)."""
    lines = []
    for region in regions_in(layout.marked_files(REPO / "minidist"), REPO):
        if assignment is None or region.assignment == assignment:
            source = (REPO / region.path).read_text().splitlines()
            lines += source[region.begin + 1 : region.end]
    code = [line.split("#")[0] for line in lines]
    return _squeezed("\n".join(lines)), _squeezed("\n".join(code))


def _formulas_shared(text: str, solution: tuple[str, str], code: bool = True) -> set[str]:
    """Pieces of ``text`` that the solution also holds: a formula (8 characters squeezed, with an
    arithmetic operator and a digit, bracket or ``=``; not a hyphenated word) anywhere in the regions,
    or (``code``) 24 characters of their code (a line of it; off for a traceback, which names
    functions the solution calls)."""
    squeezed = _squeezed(text)

    def pieces(width: int) -> set[str]:
        return {squeezed[i : i + width] for i in range(len(squeezed) - width + 1)}

    formulas = {
        p for p in pieces(8) if any(c in p for c in "+-*/%@^") and any(c in p for c in "0123456789()[]=")
    }
    everything, lines = solution
    return {p for p in formulas if p in everything} | {p for p in pieces(24) if code and p in lines}


def assert_gives_nothing_away(report) -> None:
    """The grade of an untouched starter: "not implemented yet", no hint, no piece of a solution.

    Checked in the table and in results.json (what Gradescope shows the student).
    """
    shown = report.table() + "\n" + json.dumps(report.gradescope())
    solution = _solution_text(report.assignment.name)
    for task in report.tasks:
        assert "not implemented yet" in task.feedback and "Hint:" not in task.feedback, task.feedback
        for result in task.results:
            assert not result.spec.hint or result.spec.hint not in shown, result.spec.hint
    assert not _formulas_shared(shown, solution, code=False), _formulas_shared(shown, solution, code=False)


def test_hints_ask_and_never_give_the_solution():
    """Every hint of every task file (public and hidden) is a question, and holds no formula of a solution.

    The grader shows a hint with a wrong answer: it should make the student look in the right place
    (escalating to the diagnosis the test prints), never hand over the chunk index or the derivative.
    """
    solution = _solution_text()
    for assignment in ASSIGNMENTS:
        for task in load(layout.assignment_dir(assignment)).tasks:
            for spec in task.tests:
                for hint in [spec.hint, *(part.hint for part in spec.parts)]:  # a failed part's hint too
                    where = f"{assignment} {spec.name}: {hint!r}"
                    assert "?" in hint, f"a hint asks a question: {where}"
                    assert not _formulas_shared(hint, solution), (
                        f"{where} gives away {_formulas_shared(hint, solution)}"
                    )


# Solutions that compute the right numbers with what the handout forbids: they lose the test, and the
# feedback says why. (assignment, task, file, old, new, words, timeout), as in MUTANTS.
RULE_BREAKERS = [
    ("A2", "A2.3", "minidist/distributed/algorithms/ring.py",
     "    ring_reduce_scatter(group, flat, op, bounds)\n    ring_all_gather(group, flat, bounds)\n",
     "    from mpi4py import MPI  # right numbers, from MPI's own collective\n"
     "    group.mpi.Allreduce(MPI.IN_PLACE, flat, op={'max': MPI.MAX, 'min': MPI.MIN}.get(op, MPI.SUM))\n"
     "    if op == 'avg':\n        flat /= group.size\n",
     "uses MPI's own Allreduce (called from minidist/distributed/algorithms/ring.py line", None),
    # The same through the unbound method: straight into C, past the watch's recording subclass; the
    # worker sees instead that the right numbers arrived without a single point-to-point receive.
    ("A2", "A2.3", "minidist/distributed/algorithms/ring.py",
     "    ring_reduce_scatter(group, flat, op, bounds)\n    ring_all_gather(group, flat, bounds)\n",
     "    from mpi4py import MPI  # MPI's own collective, called unbound: no record names it\n"
     "    MPI.Intracomm.Allreduce(group.mpi, MPI.IN_PLACE, flat,\n"
     "                            op={'max': MPI.MAX, 'min': MPI.MIN}.get(op, MPI.SUM))\n"
     "    if op == 'avg':\n        flat /= group.size\n",
     "A2.3 (ring_all_reduce) received no point-to-point message", None),
    # the full gradient all-reduced, then this rank's part
    ("A7", "A7.1", "minidist/parallel/zero/optimizer.py",
     'averaged = dist.reduce_scatter(flat, op="avg", group=self.group)',
     'averaged = dist.all_reduce(flat, op="avg", group=self.group)'
     "[self.layout.start : self.layout.stop].copy()",
     "A7.1 (ZeroRedundancyOptimizer._reduce_scatter_gradients) uses dist.all_reduce", None),
    # The softmax's backward taken from minidist's autograd (the softmax of log P is P): the right numbers,
    # but the handout asks for it by hand.
    ("A8", "A8.2", "minidist/ops/attention.py",
     "        dp -= (dp * p).sum(axis=-1, keepdims=True)\n        dp *= p\n",
     "        from minidist import tensor\n        from minidist.nn.functional import softmax\n\n"
     "        logs = np.log(np.where(p > 0, p, 1)) + np.where(p > 0, 0, -np.inf)\n"
     "        logs = tensor(logs, requires_grad=True)\n"
     "        softmax(logs, dim=-1).backward(dp)\n        dp = logs.grad\n",
     "A8.2 (ScaledDotProductAttention.backward) uses tensor.Tensor.backward (called from "
     "minidist/ops/attention.py line", None),
    # The maxima gathered instead of all-reduced: the right numbers, but A9.1 is three all-reduces, no gather.
    ("A9", "A9.1", "minidist/parallel/tensor_parallel/vocab_parallel_loss.py",
     'm = dist.all_reduce(z.max(axis=1), op="max", group=group)',
     "m = dist.all_gather(xp.ascontiguousarray(z.max(axis=1)), group=group)"
     ".reshape(group.size, -1).max(axis=0)",
     "uses dist.all_gather", None),
]  # fmt: skip


@pytest.mark.parametrize(
    "assignment, task, file, old, new, words, timeout",
    RULE_BREAKERS,
    ids=[f"{m[1]}-{m[5][:24]}" for m in RULE_BREAKERS],
)
def test_a_forbidden_call_loses_the_test_and_is_explained(
    tmp_path, assignment, task, file, old, new, words, timeout, compiled
):
    test_a_plausible_mistake_loses_the_task_and_is_named(
        tmp_path, assignment, task, file, old, new, words, timeout, compiled
    )


STUDENT_CODE = """
import numpy as np
from mpi4py import MPI
import minidist.distributed as dist
from minidist.distributed.algorithms import mpi_builtin


def raw(group):
    group.mpi.Allreduce(MPI.IN_PLACE, np.ones(3))


def builtin(group):
    mpi_builtin.mpi_all_reduce(group, np.ones(3), "sum")


def allowed(group):
    dist.all_reduce(np.ones(3), group=group)  # a minidist collective: fine unless the rule lists it
"""


def test_the_watch_sees_only_the_students_own_forbidden_calls(tmp_path, monkeypatch):
    """rules.watch in one process (a world of 1): which calls count, sub-groups, and a clean exit."""
    monkeypatch.syspath_prepend(str(REPO / "lessons" / "assignments"))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "student_i15.py").write_text(STUDENT_CODE)
    import numpy as np  # noqa: PLC0415
    import rules  # noqa: PLC0415  (imports mpi4py: only this test needs it)
    import student_i15  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    import minidist.distributed as dist  # noqa: PLC0415
    from minidist.distributed.algorithms import mpi_builtin  # noqa: PLC0415

    world = dist.Communicator(MPI.COMM_WORLD)  # not dist.init(): its excepthook would end pytest on an error
    original, world_handle = world.mpi, MPI.COMM_WORLD
    rule = rules.Rule(files=("student_i15",), why="not here", tasks={"raw": "A9.1"})
    with rules.watch(rule, [world]) as seen:
        mpi_builtin.mpi_all_reduce(world, np.ones(2), "sum")  # not the student's call: not counted
        student_i15.allowed(world)
        sub = world.split(0)  # made while watching: watched too (Split does not keep the subclass)
        student_i15.raw(sub)
        student_i15.builtin(world)
    assert [(v.called, v.function, v.line) for v in seen.violations] == [
        ("MPI's own Allreduce", "raw", 9),
        ("MPI's own Allreduce", "builtin", 13),
    ]
    assert seen.messages()[0].startswith("A9.1 (raw) uses MPI's own Allreduce (called from ")
    assert world.mpi is original and MPI.COMM_WORLD is world_handle  # everything restored
    strict = rules.Rule(
        files=("student_i15",), why="not here", functions=("minidist.distributed.collectives:all_reduce",)
    )
    with rules.watch(strict, [world]) as seen:
        student_i15.allowed(world)
    assert [(v.called, v.function) for v in seen.violations] == [("dist.all_reduce", "allowed")]
