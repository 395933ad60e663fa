"""The documentation stays true to the tree: the design page names what is there, and no page points
at a file, module or page that is not.

``docs/design.md`` describes the house (the packages, their layers, the import-linter contracts), so a
contract added to ``pyproject.toml`` or a folder added to ``minidist/`` without a word on that page
fails here. The guides (``docs/*.md``) name files as code spans (`minidist/parallel/fsdp/units.py`)
and modules by their dotted names (`minidist.memory.MemoryTracker`); after a file moves or a name is
renamed, these tests list every page that still says the old one. The checks read text only: nothing
is imported, so no MPI starts.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from mpi_utils import REPO

DOCS = REPO / "docs"
DESIGN = DOCS / "design.md"
PACKAGES = ("minidist", "minidist_tools", "minidist_course", "minidist_cli")
# Folders of the repository that pages name as code spans (a path must start with one of them).
TOP_FOLDERS = (*PACKAGES, "examples", "tests", "benchmarks", "lessons", "scripts")

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# A repository path inside a code span: starts with a top folder, not inside another path
# (`/run/minidist/cluster/NAME.json` is a path on the machine, not in the tree).
REPO_PATH = re.compile(rf"(?<![\w/.~-])((?:{'|'.join(TOP_FOLDERS)})/[\w./-]*)")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.\w+)+)")
PLACEHOLDER = re.compile(r"[<>*]|\.\.\.")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def page_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def code_spans(text: str) -> list[str]:
    """The inline code spans of a page (fenced blocks hold commands and output, not references)."""
    return CODE_SPAN.findall(FENCE.sub("", text))


def contract_names() -> list[str]:
    """The ``name = "..."`` of every ``[[tool.importlinter.contracts]]`` table in pyproject.toml.

    Read as text: ``tomllib`` is Python 3.11+, and the project supports 3.10.
    """
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    names = []
    for table in text.split("[[tool.importlinter.contracts]]")[1:]:
        table = table.split("\n[", 1)[0]  # up to the next table header
        found = re.search(r'^name\s*=\s*"([^"]+)"', table, re.MULTILINE)
        assert found, f"an import-linter contract without a name in pyproject.toml:\n{table}"
        names.append(found.group(1))
    return names


def test_the_design_page_names_every_import_linter_contract():
    text = page_text(DESIGN)
    names = contract_names()
    assert names, "pyproject.toml declares no import-linter contract: the house would be unchecked"
    missing = [name for name in names if name not in text]
    assert not missing, f"docs/design.md does not name these import-linter contracts (section 1): {missing}"


def test_the_design_page_names_every_package_and_every_folder_of_the_framework():
    text = page_text(DESIGN)
    missing = [package for package in PACKAGES if f"{package}/" not in text]
    for package in PACKAGES:
        for child in sorted((REPO / package).iterdir()):
            if child.name.startswith(("_", ".")):
                continue  # __init__.py, __main__.py, __pycache__
            if child.is_dir():
                name = f"{child.name}/"
                named = re.search(rf"(?<![\w.-]){re.escape(child.name)}/", text)
            elif child.suffix == ".py":
                # a top-level module: backend.py on the framework's page, or timeline as a tool
                name = child.name
                named = re.search(rf"(?<![\w.-]){re.escape(child.stem)}(\.py)?(?![\w/])", text)
            else:
                continue  # data files
            if not named:
                missing.append(f"{package}/{name}")
    assert not missing, f"docs/design.md (section 1, the house) does not name: {missing}"


def test_every_repository_path_a_page_names_exists():
    stale = []
    for page in pages():
        for span in code_spans(page_text(page)):
            for path in REPO_PATH.findall(span):
                path = path.rstrip(".")
                if PLACEHOLDER.search(path):
                    continue
                if not (REPO / path).exists():
                    stale.append(f"{page.relative_to(REPO)}: {path}")
    assert not stale, "these pages name files or folders that do not exist:\n" + "\n".join(sorted(set(stale)))


def module_source(parts: list[str]) -> tuple[int, str]:
    """How many leading ``parts`` are packages or modules of the tree, and the source of the last one."""
    path, source, depth = REPO, "", 0
    for part in parts:
        if (path / part).is_dir():
            path = path / part
            init = path / "__init__.py"
            source = init.read_text(encoding="utf-8") if init.exists() else ""
        elif (path / f"{part}.py").is_file():
            path = path / f"{part}.py"
            source = path.read_text(encoding="utf-8")
        else:
            break
        depth += 1
        if path.suffix == ".py":
            break
    return depth, source


def test_every_module_and_name_a_page_names_exists():
    """`minidist.parallel.fsdp.tp_clip.clip_grad_norm_`: every module on the way is a file of the tree,
    and the name after the last one is defined or imported there (a text search: nothing is imported)."""
    stale = []
    for page in pages():
        for span in code_spans(page_text(page)):
            for dotted in DOTTED.findall(span):
                parts = dotted.split(".")
                depth, source = module_source(parts)  # minidist.manual_seed: depth 1, the package face
                attribute = parts[depth] if depth < len(parts) else None
                if depth == 0 or (attribute and not re.search(rf"\b{re.escape(attribute)}\b", source)):
                    stale.append(f"{page.relative_to(REPO)}: {dotted}")
    assert not stale, "these pages name modules or names that do not exist:\n" + "\n".join(sorted(set(stale)))


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc extension) gives a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", page_text(path))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE)}


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_links_stay_inside_the_documentation_and_reach_their_anchor(page):
    """Links go to other pages of docs/, relatively, with anchors that exist (MkDocs' strict build
    refuses the rest); files outside docs/ are named as code spans instead."""
    problems = []
    for target in LINK.findall(FENCE.sub("", page_text(page))):
        if re.match(r"[a-z]+://", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if file.endswith(".ipynb") and linked.parent == (DOCS / "lessons").resolve():
            # scripts/docs.py puts the executed lessons there at build time, from lessons/ itself
            if not (REPO / "lessons" / linked.name).exists():
                problems.append(f"{target}: no such lesson in lessons/")
            continue
        if file.endswith((".png", ".svg")) and DOCS.resolve() in linked.parents:
            if not linked.exists():  # a picture shown on the page: MkDocs copies the images of docs/ too
                problems.append(f"{target}: no such image in docs/")
            continue
        if not file.endswith(".md") and file:
            problems.append(f"{target}: not a documentation page (name a file as a `code span`)")
        elif DOCS.resolve() not in linked.parents and linked != DOCS.resolve():
            problems.append(f"{target}: outside docs/")
        elif not linked.exists():
            problems.append(f"{target}: no such page")
        elif anchor and "." not in anchor and anchor not in anchors(linked):
            problems.append(f"{target}: no heading with that anchor")
    assert not problems, f"{page.relative_to(REPO)}:\n" + "\n".join(problems)
