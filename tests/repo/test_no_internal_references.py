"""The repository speaks of itself only: no ticket numbers, no labels of past work periods.

A reader of minidist meets the code, its tests, lessons and pages, not the tracker or the calendar it was
built with. A ticket number tells a student nothing they can check; "a per-call cache cuts about 1,000
instructions per call (benchmarks/collectives.py)" does. So every tracked text file under the library
packages (minidist, minidist_tools, minidist_course, minidist_cli), README.md, CHANGELOG.md, docs/,
benchmarks/, examples/, lessons/ (the notebooks as their JSON text), tests/, scripts/, and the
repository's configuration (pyproject.toml, .gitignore, .ci/) must be free of:

* **ticket numbers**: the word "issue" or "issues" followed by a number, with or without a ``#`` or a
  hyphen between them, in any case. The word must stand alone ("tissue" is not a ticket). The verb
  counts too, since a line cannot tell them apart: write "each rank issues two sends", with the number
  in words. A bare ``#`` and a number is allowed, because minidist numbers its collective calls that way
  in its own messages ("collective #2 mismatch").
* **work-period labels**: "session", "wave" or "stop" after an ordinal or a word that places it in time
  (first ... tenth, last, previous, this, next, earlier), or followed by a number; and "week" after
  "this", "last" or "previous". The check cannot tell a Jupyter or MPI session from a period of work,
  so the product does not speak of "this" session in either sense: it says "the kernel", "this run",
  "the current process". Plurals of the ordinal form count; "stops 4 batches into epoch 2" and
  ``range(start, stop)`` do not match, and a slice's end is written ``stop=5``.

Keep the fact and the command that measures it, drop the ticket. The test lists every hit as
``file:line: text`` so that one run shows all there is to fix. It skips (with the reason) outside a git
checkout, since it reads the tracked files from ``git ls-files``, and skips binary files (a NUL byte, or
not UTF-8). This file is scanned too: its examples put the words in angle brackets, so that ``git grep``
finds no ticket here either.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from mpi_utils import REPO

SCANNED = (
    "minidist",
    "minidist_tools",
    "minidist_course",
    "minidist_cli",
    "README.md",
    "CHANGELOG.md",
    "docs",
    "benchmarks",
    "examples",
    "lessons",
    "tests",
    "scripts",
    "pyproject.toml",
    ".gitignore",
    ".ci",
)

TICKET = re.compile(r"\bissues?\s*[-#]?\s*\d+", re.IGNORECASE)
_WHEN = r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|previous|this|next|earlier"
PERIOD = re.compile(
    rf"\b(?:{_WHEN})\s+(?:session|wave|stop)s?\b"  # an ordinal or time word, then the period
    r"|\b(?:session|wave|stop)\s+#?\d+"  # the period, then its number
    r"|\b(?:this|last|previous)\s+week\b",
    re.IGNORECASE,
)


def spelled(example: str) -> str:
    """An example line of this file as the text it stands for: ``<issue> 16`` is the ticket word and
    its number (the brackets keep this file itself free of what it looks for)."""
    return re.sub(r"<(\w+)>", r"\1", example)


def internal_references(line: str) -> list[str]:
    """The ticket numbers and work-period labels in one line of text, as written there."""
    return [m.group(0) for pattern in (TICKET, PERIOD) for m in pattern.finditer(line)]


def tracked_files() -> list[Path]:
    """The tracked files under ``SCANNED``, from ``git ls-files`` (skips the test outside a checkout)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *SCANNED], cwd=REPO, capture_output=True, check=False
    )
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {listed.stderr.decode(errors='replace').strip()}")
    names = [name for name in listed.stdout.decode().split("\0") if name]
    paths = [REPO / name for name in names if ".git" not in Path(name).parts]
    return [p for p in paths if p.is_file()]  # a deleted, unstaged file: gone


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@pytest.mark.parametrize(
    "line",
    [
        "a per-call cache (<issue> 16) cuts the cost",
        "<Issue> #21: FSDP",
        "the <issue>-3 targets, measured",
        "<issue>s 14 and 15",
        "### Changed (<issue> 16, sixth <session>)",
        "until the sixth <session> the contenders copied",
        "re-timed after the fifth <session>'s cuts",
        "as the last <wave> left it",
        "this <stop> adds a flag",
        "in earlier <session>s",
        "<session> 3 measured it",
        "<wave> 2",
        "<stop> 31",
        "this <week>'s numbers",
    ],
)
def test_the_patterns_catch_tickets_and_work_periods(line):
    line = spelled(line)
    assert internal_references(line), line


@pytest.mark.parametrize(
    "line",
    [
        "the <tissue> 3 of a model",
        "collective #2 mismatch on a group of 4 ranks",
        "all ranks issue the same collectives in the same order",
        "rank 0 issues a StragglerWarning",
        "--max-steps 15 stops 4 batches into epoch 2",
        "for i in range(start, stop): ...",
        "a record made before the latest reset() is not subtracted",
        "a session of the pipeline: the next step",
        "one week of compute",
    ],
)
def test_the_patterns_leave_ordinary_prose_alone(line):
    line = spelled(line)
    assert not internal_references(line), internal_references(line)


def test_no_tracked_file_names_a_ticket_or_a_work_period():
    files = tracked_files()
    assert files, f"git ls-files listed nothing under {SCANNED} in {REPO}"
    hits = []
    for path in files:
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            found = internal_references(line)
            if found:
                hits.append(f"{path.relative_to(REPO)}:{number}: {', '.join(found)}: {line.strip()[:120]}")
    assert not hits, (
        f"{len(hits)} lines name a ticket or a past work period; keep the fact and its measurement, drop"
        " the label (see this test's docstring for the rule):\n" + "\n".join(hits)
    )
