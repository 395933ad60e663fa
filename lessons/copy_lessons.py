"""Copy the lessons to a folder of your own, and work through them there.

    python lessons/copy_lessons.py ~/my-lessons           # then: jupyter lab ~/my-lessons
    python lessons/copy_lessons.py ~/my-lessons --force   # refresh a copy you already have

It ends by printing the command that starts JupyterLab on the copy: as root that command carries
``--allow-root`` (JupyterLab refuses to start as root without it). Root is what lessons 12 and 13 need
for their cluster parts (network namespaces, a Linux feature only root may create); every other cell,
and those two lessons without root, run as any user.

Why a copy: the notebooks in ``lessons/`` are generated from ``lessons/src/`` by ``build.py`` and
committed. Running and saving one in place changes a file the repository tracks (the test suite then
reports it out of date), and a rebuild would replace it. Your copy is yours: nothing in the repository
ever writes to it.

What is copied: the notebooks ``lessons/NN_*.ipynb`` as they are now (so work already saved in
``lessons/`` comes along) and ``scripts/`` (the programs the notebooks start with ``mpiexec``): what a
notebook needs to run from its own folder (lesson 09 also runs ``examples/`` and ``benchmarks/``, which
it finds in the clone that minidist is installed from). Never the reference answers
(``lessons/.solutions/``), the sources or the coursework, and no exercise checks: the notebooks import
those from the installed package (``from minidist_course.notebook import checks``), so nothing in the
student's folder computes an exercise's answer.

Rules: the folder must be new or empty, unless ``--force``. With ``--force`` a file that is already there
and differs is first renamed (``01_autograd.old-1.ipynb``, then ``.old-2``, ...) and the fresh copy is
written beside it: nothing in your folder is ever overwritten or deleted.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

LESSONS = Path(__file__).resolve().parent


def lesson_files(lessons: Path = LESSONS) -> list[Path]:
    """The files a student's copy holds, as paths relative to ``lessons``: the notebooks and every file
    under ``scripts/`` (caches and hidden files left out)."""
    notebooks = sorted(lessons.glob("[0-9][0-9]_*.ipynb"))
    folder = lessons / "scripts"
    scripts = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not any(part.startswith((".", "__pycache__")) for part in p.relative_to(folder).parts)
    )
    return [p.relative_to(lessons) for p in [*notebooks, *scripts]]


def copy_lessons(dest: Path, force: bool = False, lessons: Path = LESSONS) -> list[str]:
    """Copy the lessons into ``dest`` (created if missing); return one line per file for the user.

    Raises ``ValueError`` when ``dest`` is a file, lies inside ``lessons`` (a copy there would be
    tracked, or copied into itself), or is a folder that is not empty and ``force`` is false. With
    ``force``, an existing file that differs from the lesson's is renamed to ``NAME.old-K.SUFFIX`` (the
    first free K) before the copy is written; an identical one is left as it is.
    """
    dest = dest.expanduser().resolve()
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} is a file; give a folder for your copy of the lessons, e.g. ~/my-lessons")
    if dest == lessons or lessons in dest.parents:
        raise ValueError(
            f"{dest} is inside {lessons}, the repository's own lessons; give a folder outside it, "
            "e.g. ~/my-lessons"
        )
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise ValueError(
            f"{dest} is not empty. To refresh a copy you already have, add --force: files you changed "
            "are kept under a new name (NAME.old-1.ipynb), never overwritten. Or choose a new folder."
        )
    report = []
    for rel in lesson_files(lessons):
        source, target = lessons / rel, dest / rel
        if target.exists() and target.read_bytes() == source.read_bytes():
            report.append(f"unchanged  {rel}")
            continue
        if target.exists():
            kept = _free_name(target)
            target.rename(kept)
            report.append(f"yours kept {kept.relative_to(dest)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        # copyfile, not copy2: the copy gets the student's default permissions, so it can be saved even
        # when the lessons come from a read-only install.
        shutil.copyfile(source, target)
        report.append(f"copied     {rel}")
    return report


def _free_name(path: Path) -> Path:
    """``dir/stem.old-K.suffix`` for the smallest K >= 1 that does not exist yet."""
    k = 1
    while (candidate := path.with_name(f"{path.stem}.old-{k}{path.suffix}")).exists():
        k += 1
    return candidate


def jupyter_command(folder: Path, as_root: bool | None = None) -> str:
    """The command that starts JupyterLab on ``folder``: with ``--allow-root`` when run as root (default:
    whether this process is), since JupyterLab refuses to start as root without it."""
    as_root = (os.geteuid() == 0) if as_root is None else as_root
    return f"jupyter lab {shlex.quote(str(folder))}" + (" --allow-root" if as_root else "")


def root_note(as_root: bool | None = None) -> str:
    """What running as root (or not) means for the lessons, in two lines."""
    as_root = (os.geteuid() == 0) if as_root is None else as_root
    if as_root:
        return (
            "You are root: lessons 12 and 13 build a cluster of network namespaces (real links between\n"
            "nodes), and JupyterLab needs --allow-root to start."
        )
    return (
        "Not root: everything runs, but lessons 12 and 13 simulate their nodes on this machine (a cluster\n"
        "of network namespaces needs root: sudo, or a container run as root; see lessons/README.md)."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="your folder for the lessons, e.g. ~/my-lessons")
    p.add_argument(
        "--force", action="store_true", help="copy into a non-empty folder; changed files are kept renamed"
    )
    args = p.parse_args(argv)
    try:
        report = copy_lessons(args.folder, force=args.force)
    except ValueError as e:
        print(f"copy_lessons.py: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(report))
    print(f"\nYour lessons are in {args.folder.expanduser().resolve()}. Start with:")
    print(f"    {jupyter_command(args.folder)}")
    print(root_note())
    return 0


if __name__ == "__main__":
    sys.exit(main())
