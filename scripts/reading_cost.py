"""How many lines a reader opens to understand each concept: the figures the house plan is held to.

    python scripts/reading_cost.py

For each concept, the framework files its reading order sends a student to (the mechanism: the checks
and the safety net are read apart, later) and their lines (``wc -l``), against the most the house plan
allows; for the ring all-reduce, its whole import closure inside minidist, in files. The targets are
checked by ``tests/repo/test_reading_cost.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# concept -> (files, the most lines allowed, or None where no target is set)
CONCEPTS: dict[str, tuple[list[str], int | None]] = {
    "autograd": (
        [f"minidist/autograd/{f}.py" for f in ("grad_mode", "tensor", "function", "graph")],
        None,
    ),
    "DDP (the naive wrapper apart)": (
        [f"minidist/parallel/data_parallel/{f}.py" for f in ("ddp", "buckets", "launch", "comm_thread")],
        700,
    ),
    "tensor-parallel linear": (
        [f"minidist/parallel/tensor_parallel/{f}.py" for f in ("layers", "mappings", "split", "cut")],
        750,
    ),
    "1F1B schedule and executor": (
        [f"minidist/parallel/pipeline/{f}.py" for f in ("schedules", "executor", "messages", "messaging")],
        800,
    ),
    "checkpoint save/load": (
        [f"minidist/checkpoint/{f}.py" for f in ("save", "load", "format", "layout", "atomic")],
        1200,
    ),
    "FSDP unit": (
        [f"minidist/parallel/fsdp/{f}.py" for f in ("units", "flat_unit", "schedule", "fully_sharded")],
        None,
    ),
}
RING = "minidist/distributed/algorithms/ring.py"
RING_MAX_FILES = 8


def lines(path: str) -> int:
    return (REPO / path).read_text().count("\n")


def _module_file(name: str) -> Path | None:
    base = REPO / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def import_closure(path: str) -> list[str]:
    """Every module of minidist that ``path`` imports, directly or not (function-level imports too):
    what a reader may have to open. ``from package import module`` opens the module, not the package's
    ``__init__`` (which Python runs for every submodule, and a reader need not open)."""
    seen, todo = set(), [REPO / path]
    while todo:
        file = todo.pop()
        if file in seen:
            continue
        seen.add(file)
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [
                    f"{node.module}.{alias.name}"
                    if _module_file(f"{node.module}.{alias.name}")
                    else node.module
                    for alias in node.names
                ]
            else:
                continue
            todo += [_module_file(n) for n in names if n.split(".")[0] == "minidist" and _module_file(n)]
    return sorted(str(f.relative_to(REPO)) for f in seen)


def main() -> int:
    print(f"{'concept':<32} {'lines':>6} {'at most':>8}  files")
    for concept, (files, most) in CONCEPTS.items():
        total = sum(lines(f) for f in files)
        print(f"{concept:<32} {total:>6} {most or '-':>8}  {', '.join(Path(f).name for f in files)}")
    closure = import_closure(RING)
    total = sum(lines(f) for f in closure)
    print(f"{'ring all-reduce, import closure':<32} {total:>6} {'-':>8}  {len(closure)} files "
          f"(at most {RING_MAX_FILES}): {', '.join(Path(f).name for f in closure)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
