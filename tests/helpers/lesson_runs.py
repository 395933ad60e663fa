"""One kernel run for both versions of a lesson notebook, where that cannot change what either shows.

tests/course/test_lessons.py executes every notebook as a new user gets it (placeholders) and with the
reference answers (solutions). Starting the kernel, the MPI engines and the lesson's own runs costs the same
both times; only the exercise cells differ. :func:`merged_notebook` makes one notebook that runs each
exercise's placeholder and its check cells, then its solution and the check cells again, and goes on:
:func:`view` then gives each version's cells, with the outputs they would have had in a run of their own,
provided that

* no later cell (code, other exercises and their checks, other solutions) reads a name an exercise
  cell or its solution binds: the cells after it cannot see which version ran (``checks.stand_in("f")``,
  the library's own version of the answer, names no variable);
* exercise and solution cells only define things (functions, classes, constants, imports the notebook
  already made): neither changes state that a later cell reads.

A notebook that breaks a rule (an exercise whose function a later cell plots, say) gets ``None``: it
runs twice, as before. The rules are checked on the syntax tree, conservatively (a name read anywhere in a
later cell counts, inside a function or an f-string too; any word of a shell line), so a merge never hides
a placeholder that a later cell would trip over.
"""

from __future__ import annotations

import ast
import copy
import re

PLACEHOLDERS, SOLUTIONS = "placeholders", "solutions"
_RUN = "run"  # cell metadata: the version a cell belongs to; absent: both


def _python(source: str) -> ast.Module:
    """The cell's Python, without cell magics (``%%px``) and shell escapes (``!cmd``)."""
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


def _imports(source: str) -> set[str]:
    return {ast.unparse(s) for s in _python(source).body if isinstance(s, (ast.Import, ast.ImportFrom))}


def _defined(source: str, imported_before: set[str]) -> set[str] | None:
    """The names a definitions-only cell binds; ``None`` if it does anything else (a call, a loop)."""
    names: set[str] = set()
    for stmt in _python(source).body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if ast.unparse(stmt) not in imported_before:  # the same import again binds the same module
                names |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        elif isinstance(stmt, ast.Assign) and not any(isinstance(n, ast.Call) for n in ast.walk(stmt.value)):
            for target in stmt.targets:
                plain = (ast.Name, ast.Tuple, ast.Load, ast.Store)
                if not all(isinstance(n, plain) for n in ast.walk(target)):
                    return None  # an attribute or an item: changes an object others hold
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):  # a docstring
            return None
    return names


def _read(source: str) -> set[str]:
    """Every name the cell's Python reads (in functions and f-strings too; not in strings or comments),
    and every word of its magic and shell lines (``!cmd {name}`` interpolates names)."""
    names = {n.id for n in ast.walk(_python(source)) if isinstance(n, ast.Name)}
    shell = [ln for ln in source.splitlines() if ln.lstrip().startswith(("%", "!"))]
    return names | set(re.findall(r"\w+", "\n".join(shell)))


def _tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


def merged_notebook(nb, answers: dict[str, str]):
    """``nb`` (placeholders) with, after the last check cell of each exercise KEY, the solution
    ``answers[KEY]`` and copies of KEY's check cells; ``None`` where the module docstring's rules do not
    hold. ``nb`` is not changed."""
    cells = nb.cells
    for i, cell in enumerate(cells):
        if "exercise" not in _tags(cell):
            continue
        key = cell.metadata["exercise"]
        before = set().union(*(_imports(c.source) for c in cells[:i] if c.cell_type == "code"))
        names = [_defined(cell.source, before), _defined(answers[key], before)]
        if None in names:
            return None
        defined = names[0] | names[1]
        for later in cells[i + 1 :]:
            own_check = "check" in _tags(later) and later.metadata["exercise"] == key
            if later.cell_type != "code" or own_check:
                continue
            texts = [later.source]
            if "exercise" in _tags(later):
                texts.append(answers[later.metadata["exercise"]])
            if any(defined & _read(t) for t in texts):
                return None
    merged = copy.deepcopy(nb)
    out = []
    for i, cell in enumerate(merged.cells):
        key = cell.metadata.get("exercise")
        if key is not None:
            cell.metadata[_RUN] = PLACEHOLDERS  # exercise and check cells as shipped
        out.append(cell)
        later = merged.cells[i + 1 :]
        if "check" not in _tags(cell) or any(c.metadata.get("exercise") == key for c in later):
            continue
        # KEY's last check: the solution's run of the exercise and its checks follows
        of_key = [c for c in merged.cells[: i + 1] if c.metadata.get("exercise") == key]
        for original in of_key:
            again = copy.deepcopy(original)
            if "exercise" in _tags(again):
                again.source = answers[key]
            again.metadata[_RUN] = SOLUTIONS
            out.append(again)
    for n, cell in enumerate(out):
        cell.id = f"{cell.id.split('-')[0]}-m{n:02d}"  # unique ids: the copies would repeat them
    merged.cells = out
    return merged


def view(merged, version: str):
    """The cells of ``version`` (PLACEHOLDERS or SOLUTIONS) of an executed merged notebook, outputs
    included, in run order; the version marks removed, so the cells look as a run of their own made them."""
    nb = copy.deepcopy(merged)
    nb.cells = [c for c in nb.cells if c.metadata.get(_RUN, version) == version]
    for cell in nb.cells:
        cell.metadata.pop(_RUN, None)
    return nb
