"""``minidist launch -n N [--max-restarts K] [--nodes MIN:MAX --cluster NAME] -- COMMAND...``

Exit code: the command's when it succeeds; when every restart is used, the last failure's (1 if it had
none); 1 when another launch's job still uses the checkpoint folder; 2 for bad arguments; 130 after
Ctrl-C, 143 after SIGTERM (the job is ended first). If the launcher is killed outright (SIGKILL), its
reaper ends the job.
"""

from __future__ import annotations

import argparse
import sys

from minidist_tools.launch.errors import LaunchError
from minidist_tools.launch.plan import parse_node_range
from minidist_tools.launch.supervisor import launch

EPILOG = """examples:
  minidist launch -n 4 --max-restarts 3 -- \\
      python examples/train_mlp.py --checkpoint-dir ckpt --checkpoint-every 40
  minidist cluster up --nodes 3 --ranks-per-node 2 --name c3
  minidist launch --cluster c3 --nodes 2:3 -- \\
      python examples/train_mlp.py --checkpoint-dir ckpt --checkpoint-every 40

The command resumes from its --checkpoint-dir after a restart (MINIDIST_RESTART_COUNT > 0); the launcher
logs every start, checkpoint, failure, kill, verification and restart as JSON lines in --log."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="minidist launch",
        description="Run an MPI training command; after a failure end every rank and restart it from its "
        "newest checkpoint.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-n", type=int, default=None, help="ranks (on a cluster: default all nodes up to MAX)"
    )
    parser.add_argument("--max-restarts", type=int, default=3, help="restarts after failures (default: 3)")
    parser.add_argument(
        "--nodes",
        type=_node_range,
        default=None,
        metavar="MIN:MAX",
        help="with --cluster: go on with MIN..MAX healthy nodes (world shrinks)",
    )
    parser.add_argument("--cluster", default=None, metavar="NAME", help="a `minidist cluster` cluster")
    parser.add_argument(
        "--log",
        default=None,
        metavar="FILE",
        help="JSON-lines event log (default: <checkpoint dir>/launch.log or ./launch.log)",
    )
    parser.add_argument(
        "--monitor-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between two looks at the job (default: 1)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        metavar="S",
        help="no output for S seconds = a hung job: restart it (default: off)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        metavar="DIR",
        help="where the command saves (default: its own --checkpoint-dir)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, e.g. python train.py")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command to run: add `-- COMMAND`, e.g. -- python examples/train_mlp.py")
    args.parser = parser
    return args


def _node_range(text: str) -> tuple[int, int]:
    try:
        return parse_node_range(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = launch(
            args.command,
            args.n,
            args.max_restarts,
            nodes=args.nodes,
            cluster=args.cluster,
            log=args.log,
            monitor_interval=args.monitor_interval,
            stall_timeout=args.stall_timeout,
            checkpoint_dir=args.checkpoint_dir,
        )
    except ValueError as error:
        args.parser.error(str(error))  # exit 2, with the usage line
    except LaunchError as error:
        print(f"minidist launch: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
