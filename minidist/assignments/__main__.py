"""``python -m minidist.assignments {list,release,grade}``: see ``lessons/assignments/INSTRUCTORS.md``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minidist.assignments import layout
from minidist.assignments.grade import grade
from minidist.assignments.markers import regions_in
from minidist.assignments.release import release


def _list() -> str:
    regions = regions_in(layout.marked_files(layout.PACKAGE_DIR), layout.REPO_ROOT)
    lines = []
    for a in layout.available():
        lines.append(a)
        for r in (r for r in regions if r.assignment == a):
            lines.append(f"  {r.task:<6} {r.path}:{r.begin + 1}  {r.description}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m minidist.assignments list|release|grade ...``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m minidist.assignments", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the assignments and their solution regions")
    rel = sub.add_parser("release", help="write a student copy with this assignment's solutions as stubs")
    rel.add_argument("assignment", help="e.g. A2")
    rel.add_argument("--out", required=True, type=Path, help="folder to create")
    rel.add_argument("--force", action="store_true", help="replace a non-empty --out")
    gr = sub.add_parser("grade", help="run an assignment's tests against a minidist and score them")
    gr.add_argument("assignment", help="e.g. A2")
    gr.add_argument("--path", type=Path, default=None, help="the submission (folder containing minidist/)")
    gr.add_argument("--task", action="append", default=None, help="grade only this task (repeatable)")
    gr.add_argument("--public-only", action="store_true", help="skip the hidden tests")
    gr.add_argument("--timeout", type=float, default=None, help="seconds before a test counts as a hang")
    gr.add_argument("--results", type=Path, default=None, help="write Gradescope's results.json here")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print(_list())
        elif args.command == "release":
            print(release(args.assignment, args.out, force=args.force).summary())
        else:
            report = grade(args.assignment, args.path, args.task, not args.public_only, args.timeout)
            print(report.table())
            if args.results is not None:
                report.write_results(args.results)
                print(f"wrote {args.results}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
