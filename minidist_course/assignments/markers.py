"""Solution regions: the markers that turn the reference code into student starter code.

A region is a few lines of reference code between two comments, the first naming the task::

    def ring_all_reduce(group, flat, op):
        \"\"\"(docstring stays in the student copy)\"\"\"
        # BEGIN SOLUTION A2.3: all-reduce as reduce-scatter followed by all-gather
        bounds = chunk_bounds(flat.size, group.size)
        ...
        # END SOLUTION

The markers are comments, so the reference behaves exactly as without them. :func:`blank` replaces a
region (markers included) by a stub at the indentation of its BEGIN line::

        # TODO A2.3: all-reduce as reduce-scatter followed by all-gather
        raise NotImplementedError("A2.3: all-reduce as reduce-scatter followed by all-gather")

so the released module still imports and the first call of a missing piece names its task. A task may
own several regions (e.g. two functions); regions never nest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

BEGIN = re.compile(
    r"^(?P<indent>[ \t]*)# BEGIN SOLUTION (?P<task>A(?P<number>\d+)\.\d+): (?P<what>\S.*?)\s*$"
)
END = re.compile(r"^[ \t]*# END SOLUTION\s*$")
ANY_MARKER = re.compile(r"#\s*(BEGIN|END) SOLUTION")


@dataclass(frozen=True)
class Region:
    """One marked region: lines ``begin..end`` (0-based, both the marker lines) of ``path``."""

    path: Path
    task: str  # "A2.1"
    description: str  # "the reduce-scatter half of the ring"
    begin: int
    end: int
    indent: str

    @property
    def assignment(self) -> str:
        """``"A2"`` for task ``"A2.1"``."""
        return self.task.split(".")[0]

    @property
    def number(self) -> int:
        """The assignment's number (2 for ``"A2.1"``): releases blank regions from this number on."""
        return assignment_number(self.assignment)


def assignment_number(assignment: str) -> int:
    """2 for ``"A2"``; raises ``ValueError`` for a name that is not ``A<number>``."""
    match = re.fullmatch(r"A(\d+)", assignment)
    if match is None:
        raise ValueError(f"an assignment is named A<number> (e.g. A2), got {assignment!r}")
    return int(match.group(1))


def find_regions(text: str, path: Path | str = "<text>") -> list[Region]:
    """Every region in ``text`` in file order.

    Raises ``ValueError`` (naming the file and line) for a BEGIN without END, an END without BEGIN, a
    nested BEGIN, a malformed marker (wrong task id or missing description) or an empty region.
    """
    path = Path(path)
    regions: list[Region] = []
    open_match, open_line = None, -1
    for i, line in enumerate(text.splitlines()):
        begin, end = BEGIN.match(line), END.match(line)
        where = f"{path}:{i + 1}"
        if begin:
            if open_match is not None:
                raise ValueError(f"{where}: BEGIN SOLUTION inside the region opened at line {open_line + 1}")
            open_match, open_line = begin, i
        elif end:
            if open_match is None:
                raise ValueError(f"{where}: END SOLUTION without a BEGIN SOLUTION before it")
            body = text.splitlines()[open_line + 1 : i]
            if not any(s.strip() and not s.strip().startswith("#") for s in body):
                raise ValueError(f"{where}: the region opened at line {open_line + 1} holds no code")
            regions.append(
                Region(path, open_match["task"], open_match["what"], open_line, i, open_match["indent"])
            )
            open_match = None
        elif ANY_MARKER.search(line):
            raise ValueError(
                f"{where}: malformed marker {line.strip()!r}; write '# BEGIN SOLUTION A<n>.<k>: <what to "
                "implement>' and '# END SOLUTION' on lines of their own"
            )
    if open_match is not None:
        raise ValueError(f"{path}:{open_line + 1}: BEGIN SOLUTION {open_match['task']} is never closed")
    return regions


def stub_lines(region: Region) -> list[str]:
    """The two lines that replace ``region`` in a student copy."""
    message = f"{region.task}: {region.description}"
    return [
        f"{region.indent}# TODO {message}",
        f"{region.indent}raise NotImplementedError({json.dumps(message)})",
    ]


def blank(text: str, should_blank: Callable[[Region], bool], path: Path | str = "<text>") -> tuple[str, int]:
    """``text`` with every region for which ``should_blank(region)`` is true replaced by its stub.

    Returns the new text and the number of regions replaced. Kept regions keep their markers.
    """
    lines = text.splitlines()
    count = 0
    for region in reversed(find_regions(text, path)):  # from the end, so earlier line numbers stay valid
        if should_blank(region):
            lines[region.begin : region.end + 1] = stub_lines(region)
            count += 1
    return "\n".join(lines) + ("\n" if text.endswith("\n") else ""), count


def regions_in(files: Iterable[Path], root: Path | None = None) -> list[Region]:
    """The regions of every file, with paths relative to ``root`` when given."""
    found = []
    for f in sorted(files):
        text = f.read_text()
        if "SOLUTION" in text:
            found += find_regions(text, f.relative_to(root) if root else f)
    return found
