"""Build, serve and look at the documentation site (MkDocs + Material + mkdocstrings + mkdocs-jupyter).

    python scripts/docs.py build          # run the lessons, then `mkdocs build --strict` into build/site/
    python scripts/docs.py serve          # the same site at http://127.0.0.1:8000, rebuilt on every edit
    python scripts/docs.py build --no-execute   # the lessons as committed, without outputs (seconds)
    python scripts/docs.py screenshots OUT      # headless Chromium takes PNGs of three built pages

The site is the guides in ``docs/``, an API reference generated from the docstrings (``docs/api/``, one
``::: module`` line per page: mkdocstrings reads the package, so a docstring that does not parse fails the
strict build), and the lessons rendered with their outputs. The lessons start their own MPI engines, which
mkdocs-jupyter cannot do, so this script runs them first, exactly as a student's copy runs them (the
placeholders, never the reference answers: the site gives no exercise away), and writes the executed
notebooks to ``docs/lessons/`` (ignored by git). A notebook is run again only when its committed version
changed (its SHA-256 is kept in the executed copy's metadata).

Needs the ``docs`` extra (``pip install -e ".[docs]"``; ``dev`` includes it). ``screenshots`` needs a
Chromium: ``scripts/install_chromium.sh`` installs the distribution's package (root, apt-get).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LESSONS = REPO / "lessons"
RENDERED = REPO / "docs" / "lessons"  # where mkdocs-jupyter finds the notebooks (mkdocs.yml's nav)
SITE = REPO / "build" / "site"
KEY = "minidist_docs_source_sha256"  # notebook metadata: which committed notebook this run came from
# The time budget lets MathJax and the notebook's plots finish before the picture is taken.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
CHROMIUM_FLAGS.append("--virtual-time-budget=10000")
PAGES = {  # screenshot name -> (page of the built site, height of the picture in px; the width is 1280)
    "home": ("index.html", 2000),
    "api-parallel": ("api/parallel/index.html", 2000),  # opens at DistributedDataParallel, its signature
    # The whole lesson: its plots come after the text that explains them (headless Chromium draws a
    # page from its top, so an anchor cannot bring a plot into a short picture).
    "lesson-07": ("lessons/07_pipeline_parallel/index.html", 24000),
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fold_answers(nb):
    """The notebook with each answer cell (tag ``reveal``, collapsed in JupyterLab until the student
    opens it) folded into an HTML ``<details>`` block, so the site keeps the answer closed until the
    reader clicks its first line, which gives nothing away."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and "reveal" in cell.metadata.get("tags", []):
            first, _, rest = cell.source.partition("\n")
            summary = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", first)
            cell.source = f"<details><summary>{summary}</summary>\n\n{rest}\n\n</details>"
    return nb


def render_lessons(execute: bool = True, timeout: int = 300) -> None:
    """Write every lesson notebook to ``docs/lessons/``, executed in a student's copy unless ``execute``
    is False. Raises ``nbclient.exceptions.CellExecutionError`` at a failing cell (the build stops)."""
    import nbformat

    sys.path.insert(0, str(LESSONS))
    import build  # lessons/build.py: the executor the lesson tests use

    RENDERED.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="minidist-docs-") as tmp:
        copy = None  # the student's copy, made once and only if a lesson must run
        for notebook in sorted(LESSONS.glob("[0-9][0-9]_*.ipynb")):
            target, sha = RENDERED / notebook.name, _sha(notebook)
            if not execute:
                nbformat.write(fold_answers(nbformat.read(notebook, as_version=4)), target)
                continue
            if target.exists() and nbformat.read(target, as_version=4).metadata.get(KEY) == sha:
                print(f"{notebook.name}: up to date")
                continue
            if copy is None:
                copy = Path(tmp) / "lessons"
                subprocess.run([sys.executable, str(LESSONS / "copy_lessons.py"), str(copy)], check=True)
                # The kernel and its MPI engines import this checkout's minidist, whatever is installed.
                paths = [str(REPO), os.environ.get("PYTHONPATH")]
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
            start = time.perf_counter()
            nb = nbformat.read(copy / notebook.name, as_version=4)
            build.execute(nb, timeout=timeout, cwd=copy)
            nb.metadata[KEY] = sha
            nbformat.write(fold_answers(nb), target)
            print(f"{notebook.name}: executed in {time.perf_counter() - start:.0f} s")


def mkdocs(*args: str) -> None:
    config = str(REPO / "mkdocs.yml")
    subprocess.run([sys.executable, "-m", "mkdocs", *args, "-f", config], check=True, cwd=REPO)


def screenshots(out: Path) -> list[Path]:
    """PNGs of ``PAGES`` of the built site, taken by headless Chromium. Raises
    ``FileNotFoundError`` when the site is not built or no Chromium is installed, and ``RuntimeError``
    for a page that came out blank (one colour: the browser drew nothing)."""
    from PIL import Image  # Pillow comes with matplotlib

    if not (SITE / "index.html").exists():
        raise FileNotFoundError(f"no site in {SITE}: run python scripts/docs.py build first")
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        raise FileNotFoundError("no Chromium found: run scripts/install_chromium.sh (root) first")
    out.mkdir(parents=True, exist_ok=True)
    taken = []
    for name, (page, height) in PAGES.items():
        png = out / f"{name}.png"
        if not (SITE / page).exists():  # Chromium would draw its own "file not found" page
            raise FileNotFoundError(f"the built site has no {page}")
        size = f"--window-size=1280,{height}"
        cmd = [browser, *CHROMIUM_FLAGS, size, f"--screenshot={png}", (SITE / page).as_uri()]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        colours = Image.open(png).convert("RGB").getcolors(maxcolors=1 << 16)
        if colours is not None and len(colours) < 2:
            raise RuntimeError(f"{png}: the page {page} came out blank")
        taken.append(png)
    return taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "serve", "screenshots"])
    parser.add_argument("out", nargs="?", type=Path, help="screenshots: the folder for the PNGs")
    parser.add_argument("--no-execute", action="store_true", help="render the lessons without outputs")
    args = parser.parse_args(argv)
    if args.command == "screenshots":
        if args.out is None:
            parser.error("screenshots needs a folder: python scripts/docs.py screenshots OUT")
        for png in screenshots(args.out):
            print(f"screenshot: {png}")
        return 0
    render_lessons(execute=not args.no_execute)
    if args.command == "serve":
        mkdocs("serve")
        return 0
    mkdocs("build", "--strict")
    print(f"site: {SITE / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
