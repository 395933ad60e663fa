"""``minidist``: one command for every tool around the framework, as ``torchrun`` or ``accelerate`` are.

    minidist info                                 versions, MPI library, array backend, CUDA-aware MPI
    minidist checkpoint info DIR [--verify]       list and verify checkpoints, without MPI
    minidist checkpoint interval --node-mtbf ...  how often to checkpoint (Young, Daly, exact)
    minidist cluster up|run|status|down           a cluster of network namespaces on this machine (root)
    minidist launch -n N -- COMMAND               run COMMAND on N ranks; restart it after a failure
    minidist plot RUN.jsonl ... --out plot.png    loss and throughput of runs recorded with --metrics
    minidist assignments list|release|grade|...   the graded coursework of lessons/assignments/

Each subcommand is a module of ``minidist_tools`` or ``minidist_course`` with its own ``main(argv)`` and
``--help``; this file only picks the module and hands it the rest of the command line. It sits above
both packages (the framework, ``minidist``, imports neither) and imports a tool only when it is called,
so ``minidist --help`` starts no MPI. ``python -m minidist_cli`` is the same command.
"""

from __future__ import annotations

import importlib
import os
import sys

# name -> (module whose main(argv) runs it, what it does)
COMMANDS = {
    "info": ("minidist_tools.info", "print the versions, the MPI library, the backend and CUDA-awareness"),
    "checkpoint": ("minidist_tools.checkpoint_info", "list and verify checkpoints; how often to save"),
    "cluster": ("minidist_tools.cluster.__main__", "a cluster of network namespaces over TCP (root)"),
    "launch": ("minidist_tools.launch.__main__", "run a job on N ranks and restart it after a failure"),
    "plot": ("minidist_tools.plot", "draw the loss and throughput of runs recorded with --metrics FILE"),
    "assignments": ("minidist_course.assignments.__main__", "release, grade and batch-grade assignments"),
}


# The tools used from Python, named in the help so that one finds them too.
LIBRARIES = {
    "minidist_tools.straggler": "find the rank that makes every step wait (StragglerMonitor)",
    "minidist_tools.perfmodel": "models of a step's time, memory, network traffic and failures",
    "minidist_tools.timeline": "every rank's trace spans in one Perfetto file; communication hidden",
    "minidist_tools.gantt": "a pipeline step as a text grid or a Gantt chart, simulated or measured",
    "minidist_tools.header": "modes(args, world_size): every non-default mode, for a run's header",
    "minidist_tools.progress": "progress(...): a tqdm bar on a terminal, plain lines in a log file",
    "minidist_tools.metrics": "MetricsLog and read_run: a run's metrics as JSON lines (--metrics FILE)",
    "minidist_tools.report": "exit_with_error: a training script's error printed once, for all ranks",
    "minidist_tools.cluster": "Cluster: the namespace cluster from Python (cluster_available, up, down)",
    "minidist_tools.launch": "launch(...) and read_log(...): the elastic launcher from Python",
}


def usage() -> str:
    """The text of ``minidist --help``: every command, every library tool, and where the lessons are."""
    rows = "\n".join(f"  {name:<12} {text}" for name, (_, text) in COMMANDS.items())
    libraries = "\n".join(f"  {name:<25} {text}" for name, text in LIBRARIES.items())
    return (
        "usage: minidist COMMAND [ARGS...]\n\nthe tools around the minidist framework:\n"
        f"{rows}\n\n`minidist COMMAND --help` describes one. In Python:\n{libraries}\n\n"
        "Your own copy of the lesson notebooks: python lessons/copy_lessons.py DIR"
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``minidist COMMAND ARGS...``; returns the command's exit status (2 for an unknown command)."""
    try:
        return _run(sys.argv[1:] if argv is None else list(argv))
    except BrokenPipeError:  # `minidist ... | head`: the reader left early; not an error of the command
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (Python flushes stdout once more at exit)
        return 0


def _run(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv and argv[0] == "--version":
        print(f"minidist {importlib.import_module('minidist').__version__}")
        return 0
    if not argv or argv[0] not in COMMANDS:  # as argparse does: the usage on stderr, exit status 2
        problem = f"unknown command {argv[0]!r}" if argv else "a command is required"
        print(f"{usage()}\n\nminidist: error: {problem}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])
