"""minidist assignments list|release|grade|summary: see lessons/assignments/INSTRUCTORS.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minidist_course.assignments import batch, instructor, layout
from minidist_course.assignments.environment import install_command
from minidist_course.assignments.grade import grade
from minidist_course.assignments.markers import regions_in
from minidist_course.assignments.release import release
from minidist_course.assignments.report import EXIT_USAGE

EXIT_CODES = """exit codes of grade:
  0  graded: full marks
  1  graded: points lost (as pytest exits 1 when a test fails)
  2  usage error (unknown assignment or task, bad options, a --path that does not exist, a
     --batch --out folder that holds an earlier run's results): nothing graded
  3  setup problem: the grading environment lacks something (e.g. pytest); the message and
     results.json name the install command; nothing graded
  4  the submission could not be graded as handed in (e.g. an uploaded file that is not one of the
     assignment's files); results.json says why
with --batch: the largest code of the submissions (it stops at the first setup problem)"""


def _list() -> str:
    regions = regions_in(layout.marked_files(layout.PACKAGE_DIR), layout.REPO_ROOT)
    lines = []
    for a in layout.available():
        lines.append(a)
        for r in (r for r in regions if r.assignment == a):
            lines.append(f"  {r.task:<6} {r.path}:{r.begin + 1}  {r.description}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minidist assignments",
        description=__doc__,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the assignments and their solution regions")
    rel = sub.add_parser("release", help="write a student copy with this assignment's solutions as stubs")
    rel.add_argument("assignment", help="e.g. A2")
    rel.add_argument("--out", required=True, type=Path, help="folder to create")
    rel.add_argument("--force", action="store_true", help="replace a non-empty --out")
    rel.add_argument(
        "--gradescope",
        type=Path,
        default=None,
        metavar="OUT",
        help="also write Gradescope's autograder (setup.sh, run_autograder, the grader's tree) into OUT: "
        "it holds the solutions; upload it, never hand it out",
    )
    rel.add_argument(
        "--hidden",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --gradescope: your own hidden tests (laid out as A2/hidden/), instead of the repository's",
    )
    gr = sub.add_parser(
        "grade",
        help="run an assignment's tests against a minidist and score them",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gr.add_argument("assignment", help="e.g. A2")
    gr.add_argument(
        "--path",
        type=Path,
        default=None,
        help="the submission: a folder containing minidist/, or the files changed (e.g. ring.py), "
        "alone or in a folder; with --batch a folder holding one such folder per student",
    )
    gr.add_argument("--task", action="append", default=None, help="grade only this task (repeatable)")
    gr.add_argument("--public-only", action="store_true", help="skip the hidden tests")
    gr.add_argument(
        "--hidden",
        type=Path,
        default=None,
        metavar="DIR",
        help="your own hidden tests, kept outside the repository (laid out as A2/hidden/): graded instead "
        "of the repository's, which students can read",
    )
    gr.add_argument("--timeout", type=float, default=None, help="seconds before a test counts as a hang")
    gr.add_argument("--results", type=Path, default=None, help="write Gradescope's results.json here")
    gr.add_argument("--batch", action="store_true", help="grade every submission in --path (one per student)")
    gr.add_argument("--out", type=Path, default=None, help="with --batch: the folder for the results")
    summ = sub.add_parser("summary", help="write the class summary CSV (points per task) of a results folder")
    summ.add_argument("results", type=Path, help="a folder of results.json files, one per student")
    summ.add_argument("--out", type=Path, default=None, help="the CSV to write (default RESULTS/summary.csv)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``minidist assignments list|release|grade|summary ...``; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            print(_list())
        elif args.command == "release":
            if args.hidden is not None and args.gradescope is None:
                raise ValueError("--hidden is for --gradescope (or for grade)")
            if args.hidden is not None:
                instructor.check_hidden_dir(args.hidden)
            report = release(args.assignment, args.out, force=args.force)
            print(report.summary())
            command = install_command(report.out, pip="pip")
            print(f"students install it with ONE command (also the first lines of its README): {command}")
            if args.gradescope is not None:
                written = instructor.write_gradescope(args.assignment, args.gradescope, args.hidden)
                print(
                    f"wrote Gradescope's autograder in {args.gradescope} "
                    f"({', '.join(p.name for p in written)}, grader/): zip that folder's contents and "
                    "upload them; it holds the solutions and any hidden tests, so never hand it to students"
                )
        elif args.command == "summary":
            out = args.out if args.out is not None else args.results / batch.SUMMARY
            print(f"wrote {out} ({len(batch.write_summary(args.results, out))} students)")
        else:
            return _grade(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _grade(args: argparse.Namespace) -> int:
    def one(path: Path | None):
        return grade(args.assignment, path, args.task, not args.public_only, args.timeout, hidden=args.hidden)

    if args.hidden is not None:
        if args.public_only:
            raise ValueError("--hidden and --public-only contradict each other")
        instructor.check_hidden_dir(args.hidden)
    if args.path is not None and not args.path.exists():  # a typo: a usage error, not an ungradable upload
        raise ValueError(f"--path {args.path} does not exist")
    if args.batch:
        if args.path is None or args.out is None or args.results is not None:
            raise ValueError("--batch needs --path SUBMISSIONS and --out RESULTS (and no --results)")
        return batch.grade_all(args.path, args.out, one)
    if args.out is not None:
        raise ValueError("--out is for --batch; for one submission write results.json with --results")
    report = one(args.path)
    print(report.table())
    if args.results is not None:
        report.write_results(args.results)
        print(f"wrote {args.results}")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
