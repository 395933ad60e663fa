"""Every citation of a section of the two measurement pages names a heading that page has.

Docstrings, comments, guides and lessons point a reader at the figure behind a claim by naming the page
and the section that holds it: ``docs/performance.md, "Per-step overhead of autograd"``. When a page is
rewritten and a section renamed or moved, such a pointer leads nowhere, silently. So every tracked text
file is read for citations of the two pages, and each title cited must be a heading (``#`` to ``######``,
outside fenced code) of that page. Not read: the lesson notebooks, generated from ``lessons/src`` (which
is read), and this file, whose own test plants a wrong title.

The grammar, kept small:

* the page, as ``benchmarks/README.md`` or ``docs/performance.md``, bare or in backticks;
* then ``,`` or ``(``, optionally the word ``section`` (or ``sections``);
* then one or more titles in double quotes, joined by ``,``, ``and`` or ``, and``:
  ``docs/performance.md, "GPT"``, ``benchmarks/README.md`` ("Gradient compression"),
  ``benchmarks/README.md``, section "DDP", ``docs/performance.md``, "GPT" and "Pipeline".

A citation may break across lines, also inside its title and inside a comment: a line break with the
indentation and ``#`` after it reads as one space. Titles compare ignoring case, backticks, runs of
white space and trailing punctuation. A page named without a quoted title after it (``see
docs/performance.md``) is not a section citation and is not checked; links between the site's pages
(``performance.md#the-straggler-monitor``) are checked by the strict site build (``mkdocs.yml``,
``validation.anchors``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from mpi_utils import REPO

PAGES = ("benchmarks/README.md", "docs/performance.md")
_TITLE = r'"[^"\n]{1,120}"'
_JOIN = r"\s*(?:,\s*and|,|and)\s*"
CITATION = re.compile(
    r"`{0,2}(?P<page>" + "|".join(re.escape(page) for page in PAGES) + r")`{0,2}"
    r"\s*[,(]\s*(?:sections?\s+)?"
    rf"(?P<titles>{_TITLE}(?:{_JOIN}{_TITLE})*)"
)
THIS_FILE = Path(__file__).resolve()
LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*(?:#+[ \t]*)?")  # a newline, its indentation and a comment mark


def normalize(title: str) -> str:
    """A title as compared: case folded, backticks dropped, white space collapsed, no trailing punctuation."""
    title = " ".join(title.replace("`", "").split()).casefold()
    return title.rstrip(" .,:;!?")


def headings(page: str) -> set[str]:
    """The normalized headings of a markdown page, skipping fenced code (whose ``#`` lines are comments)."""
    found, fenced = set(), False
    for line in (REPO / page).read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)):
            found.add(normalize(m.group(1)))
    return found


def citations(text: str) -> list[tuple[str, str, int]]:
    """``(page, title, line)`` for each title cited in ``text``; ``line`` is where the citation starts."""
    joined, starts = [], []  # the text with line breaks folded; the original line of each joined char
    line, last = 1, 0
    for m in LINE_BREAK.finditer(text):
        joined.append(text[last : m.start()])
        starts.extend([line] * (m.start() - last))
        joined.append(" ")
        starts.append(line)
        line, last = line + 1, m.end()
    joined.append(text[last:])
    starts.extend([line] * (len(text) - last))
    flat = "".join(joined)
    return [
        (m.group("page"), title, starts[m.start()])
        for m in CITATION.finditer(flat)
        for title in re.findall(r'"([^"]+)"', m.group("titles"))
    ]


def tracked_text_files() -> dict[str, str]:
    """Path -> text of the tracked text files that name one of the pages (skips outside a git checkout)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {listed.stderr.decode(errors='replace').strip()}")
    texts = {}
    for name in filter(None, listed.stdout.decode().split("\0")):
        path = REPO / name
        if name.endswith(".ipynb") or not path.is_file() or path.resolve() == THIS_FILE:
            continue  # generated from lessons/src; deleted but not staged; this file's planted title
        data = path.read_bytes()
        if b"\0" in data or not any(page.encode() in data for page in PAGES):
            continue
        try:
            texts[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def wrong_citations(texts: dict[str, str]) -> tuple[list[str], int]:
    """``file:line: page, "title"`` for each cited title its page lacks, and how many titles were cited."""
    known = {page: headings(page) for page in PAGES}
    wrong, count = [], 0
    for name, text in sorted(texts.items()):
        for page, title, line in citations(text):
            count += 1
            if normalize(title) not in known[page]:
                wrong.append(f'{name}:{line}: {page}, "{title}"')
    return wrong, count


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('see docs/performance.md, "GPT".', [("docs/performance.md", "GPT", 1)]),
        ('(`benchmarks/README.md`, section "DDP")', [("benchmarks/README.md", "DDP", 1)]),
        (
            '``benchmarks/README.md`` ("Gradient compression")',
            [("benchmarks/README.md", "Gradient compression", 1)],
        ),
        (
            'x\n    # (docs/performance.md, "The operating system: page\n    # faults")',
            [("docs/performance.md", "The operating system: page faults", 2)],
        ),
        (
            '`docs/performance.md`, "GPT"\n  and "Pipeline"',
            [("docs/performance.md", "GPT", 1), ("docs/performance.md", "Pipeline", 1)],
        ),
        ("the numbers in benchmarks/README.md; see docs/performance.md (measured).", []),
    ],
)
def test_the_grammar_reads_each_form(text, expected):
    assert citations(text) == expected


def test_a_wrong_title_is_caught():
    wrong, count = wrong_citations({"planted.py": '# docs/performance.md, "A section that is not there"\n'})
    assert count == 1 and wrong == ['planted.py:1: docs/performance.md, "A section that is not there"']


def test_every_cited_section_exists():
    wrong, count = wrong_citations(tracked_text_files())
    assert count >= 20, f"only {count} section citations found: is the pattern still right?"
    assert not wrong, "these cite a section their page does not have:\n" + "\n".join(wrong)
