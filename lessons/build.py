"""Build the lesson notebooks from their sources, and execute them (the "make lessons" command).

    python lessons/build.py                      # lessons/src/*.py -> lessons/*.ipynb, without outputs
    python lessons/build.py --check              # fail if a committed notebook differs from its source
    python lessons/build.py --execute            # build, then run every notebook top to bottom
    python lessons/build.py --execute --solutions 03   # run lesson 03 with the reference answers
    python lessons/build.py --execute --save-outputs /tmp/run   # keep the executed notebooks there

Sources are plain Python in the "percent" format: a line ``# %%`` starts a code cell, ``# %% [markdown]``
a markdown cell (every line prefixed with ``# ``). Two more cell kinds carry the exercises:

* ``# %% [exercise KEY]``: the "your turn" cell, shipped with the student's placeholder;
* ``# %% [check KEY]``: the cell that checks it (a call into ``minidist_course.notebook.checks``, which the
  notebooks import from the installed package: nothing beside the notebooks computes an answer).

A text cell after a check that gives the exercise's answer is written ``# %% [markdown reveal]``: the
build collapses its source in JupyterLab (cell metadata ``jupyter.source_hidden``), so the answer stays
hidden until the student opens the cell. Its first line, the one JupyterLab shows on the collapsed
cell, says "Try first; then open this cell" and gives nothing away.

Inside code cells two comment forms keep the sources valid Python (so ruff checks them): a first line
``# %%px`` becomes the cell magic ``%%px`` (run the cell on every MPI engine), and a line
``# !command`` becomes the shell escape ``!command``.

``lessons/.solutions/NN_name.py`` (a hidden folder, so that a student browsing the lessons in Jupyter
does not come across it) holds, for each KEY, a ``# %% [solution KEY]`` cell (the reference
answer) and one or more ``# %% [wrong KEY]`` cells (wrong answers the check must reject). Executing
with ``--solutions`` replaces every exercise cell by its solution; the tests do the same.

Students do not work in ``lessons/`` but in a copy of their own (``python lessons/copy_lessons.py DIR``).
A notebook here that a kernel has touched (outputs, execution counts, the kernel's ``language_info``) is
someone's work, not a build output: this script never overwrites it, and says how to keep it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

LESSONS = Path(__file__).resolve().parent
SOURCES = LESSONS / "src"
SOLUTIONS = LESSONS / ".solutions"
HEADER = re.compile(r"^# %%(?: \[(\w+)(?: ([\w-]+))?\])?\s*$")
REVEAL = "reveal"  # ``# %% [markdown reveal]``: a text cell collapsed until the student opens it
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def parse_cells(text: str) -> list[tuple[str, str | None, str]]:
    """Split a percent-format source into ``(kind, key, source)`` cells, kind one of "code",
    "markdown", "exercise", "check", "solution", "wrong" (a markdown cell's key is None or "reveal").
    Text before the first header is dropped (a module docstring for the file itself). Raises
    ``ValueError`` for an unknown kind, or a markdown key other than "reveal"."""
    cells: list[tuple[str, str | None, list[str]]] = []
    for line in text.splitlines():
        match = HEADER.match(line)
        if match:
            kind, key = match.group(1) or "code", match.group(2)
            if kind not in ("code", "markdown", "exercise", "check", "solution", "wrong"):
                raise ValueError(f"unknown cell kind [{kind}] in line {line!r}")
            if kind == "markdown" and key not in (None, REVEAL):
                raise ValueError(f"a markdown cell takes no key but [markdown {REVEAL}], got {line!r}")
            cells.append((kind, key, []))
        elif cells:
            cells[-1][2].append(line)
    out = []
    for kind, key, lines in cells:
        if kind == "markdown":
            lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines]
        else:
            lines = [ln[2:] if ln.startswith(("# !", "# %%px")) else ln for ln in lines]
        out.append((kind, key, "\n".join(lines).strip("\n")))
    return out


def build_notebook(source: Path):
    """The notebook (an ``nbformat`` node, no outputs) for one source file; cell ids are stable."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    for i, (kind, key, text) in enumerate(parse_cells(source.read_text())):
        if kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(text)
            if key == REVEAL:  # collapsed in JupyterLab until clicked; the tag lets tests find it
                cell.metadata = {"jupyter": {"source_hidden": True}, "tags": [REVEAL]}
        else:
            cell = nbformat.v4.new_code_cell(text)
            if kind in ("exercise", "check"):
                cell.metadata = {"tags": [kind], "exercise": key}
        cell.id = f"{source.stem[:2]}-{i:02d}"
        nb.cells.append(cell)
    return nb


def solution_cells(stem: str) -> dict[str, dict[str, list[str]]]:
    """``{KEY: {"solution": [code], "wrong": [code, ...]}}`` from ``lessons/.solutions/<stem>.py``."""
    path = SOLUTIONS / f"{stem}.py"
    found: dict[str, dict[str, list[str]]] = {}
    for kind, key, text in parse_cells(path.read_text()) if path.exists() else []:
        if kind in ("solution", "wrong"):
            found.setdefault(key, {"solution": [], "wrong": []})[kind].append(text)
    return found


def with_answers(nb, answers: dict[str, str]):
    """A copy of ``nb`` whose exercise cells KEY are replaced by ``answers[KEY]`` (others unchanged)."""
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        key = cell.metadata.get("exercise")
        if "exercise" in cell.metadata.get("tags", []) and key in answers:
            cell.source = answers[key]
    return nb


def execute(nb, timeout: int = 300, cwd: Path = LESSONS):
    """Run ``nb`` top to bottom in a fresh kernel whose working folder is ``cwd`` (it must hold
    ``scripts/``, as ``lessons/`` and a student's copy do); return it with outputs.

    Raises ``nbclient.exceptions.CellExecutionError`` at the first failing cell."""
    from nbclient import NotebookClient

    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()
    return nb


def check_results(nb) -> list[tuple[str, str]]:
    """``[(KEY, "correct" | "not done" | "?"), ...]`` from the printed output of each executed check cell."""
    results = []
    for cell in nb.cells:
        if "check" in cell.metadata.get("tags", []):
            text = "".join(o.get("text", "") for o in cell.get("outputs", []))
            status = "correct" if "CORRECT" in text else "not done" if "NOT DONE YET" in text else "?"
            results.append((cell.metadata["exercise"], status))
    return results


def notebook_path(source: Path) -> Path:
    return LESSONS / f"{source.stem}.ipynb"


def touched_by_a_kernel(path: Path) -> bool:
    """True if the notebook at ``path`` holds what only running it writes: an output, an execution
    count, or a kernel's full ``language_info`` (JupyterLab stores it as soon as a kernel starts, before
    any cell runs), or if it is not valid JSON any more. A build writes none of these, so such a
    notebook is someone's work and must not be overwritten."""
    try:
        nb = json.loads(path.read_text())
        if set(nb.get("metadata", {}).get("language_info", {})) - {"name"}:
            return True
        return any(c.get("outputs") or c.get("execution_count") is not None for c in nb.get("cells", []))
    except (ValueError, AttributeError):
        return True


def advice(stale: list[tuple[Path, bool]]) -> str:
    """What to do about notebooks that differ from their sources, ``stale`` being ``[(notebook,
    touched_by_a_kernel)]``; worded so that following it never loses a student's work."""
    lines = []
    rebuild = [p.name for p, touched in stale if not touched]
    if rebuild:
        lines.append(f"out of date: {', '.join(rebuild)}; run `python lessons/build.py` and commit")
    work = [f"lessons/{p.name}" for p, touched in stale if touched]
    if work:
        lines += [
            f"{', '.join(work)}: saved by Jupyter (outputs, or a kernel's metadata), so this is someone's",
            "work: build.py leaves it alone. Lessons are worked through in a copy of your own. To keep the",
            "work, copy the lessons as they are now (an existing folder is never overwritten; add --force",
            "to refresh one, and your changed files there are kept renamed):",
            "    python lessons/copy_lessons.py ~/my-lessons   # it prints the jupyter lab command to run",
            "then give lessons/ back its generated notebooks:",
            f"    git checkout -- {' '.join(work)} && python lessons/build.py",
        ]
    return "\n".join(lines)


def differs(target: Path, text: str) -> bool:
    """True if the notebook file ``target`` is missing, unreadable, or not the notebook JSON ``text``."""
    try:
        return json.loads(target.read_text()) != json.loads(text)
    except (OSError, ValueError):
        return True


def stale_notebooks(sources: list[Path]) -> list[tuple[Path, bool]]:
    """``[(notebook, touched_by_a_kernel(notebook))]`` for each source whose notebook in ``lessons/``
    is not its build (``--check``; the test suite asks the same)."""
    import nbformat

    targets = [(notebook_path(s), nbformat.writes(build_notebook(s)) + "\n") for s in sources]
    return [(t, t.exists() and touched_by_a_kernel(t)) for t, text in targets if differs(t, text)]


def main(argv: list[str] | None = None) -> int:
    import nbformat

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lessons", nargs="*", help="lesson numbers or stems (default: all), e.g. 01 03")
    p.add_argument(
        "--check", action="store_true", help="only compare the committed notebooks with the sources"
    )
    p.add_argument("--execute", action="store_true", help="run each notebook top to bottom")
    p.add_argument("--solutions", action="store_true", help="run with the reference answers filled in")
    p.add_argument("--save-outputs", type=Path, metavar="DIR", help="write the executed notebooks to DIR")
    args = p.parse_args(argv)
    if args.save_outputs and args.save_outputs.resolve() == LESSONS:
        p.error("--save-outputs: give a folder other than lessons/, whose notebooks ship without outputs")
    sources = sorted(SOURCES.glob("[0-9][0-9]_*.py"))
    if args.lessons:
        sources = [s for s in sources if any(s.stem.startswith(w) for w in args.lessons)]
    stale = stale_notebooks(sources) if args.check else []
    for source in [] if args.check else sources:
        nb, target = build_notebook(source), notebook_path(source)
        text = nbformat.writes(nb) + "\n"
        if differs(target, text):
            if target.exists() and touched_by_a_kernel(target):
                stale.append((target, True))  # someone's work: never overwritten
            else:
                target.write_text(text)
                print(f"wrote {target.relative_to(LESSONS.parent)}")
        if args.execute:
            if args.solutions:
                nb = with_answers(nb, {k: v["solution"][0] for k, v in solution_cells(source.stem).items()})
            start = time.perf_counter()
            execute(nb)
            print(f"{target.name}: ran in {time.perf_counter() - start:.1f} s; exercises {check_results(nb)}")
            if args.save_outputs:
                args.save_outputs.mkdir(parents=True, exist_ok=True)
                (args.save_outputs / target.name).write_text(nbformat.writes(nb) + "\n")
    if not args.check and not stale:
        print(f"lessons/: {len(sources)} notebooks match their sources")
    if stale:
        print(advice(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
