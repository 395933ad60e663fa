"""``minidist cluster``: up, run, status, down (package docstring; docs/many-machines.md).

Exit status: 0 on success; ``run`` returns its command's status; 2 for bad input, a missing cluster or
missing privileges (the message says which and what to do).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from minidist_tools.cluster.cluster import Cluster
from minidist_tools.cluster.errors import ClusterError, cluster_available


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minidist cluster",
        description="A cluster in a box: nodes as network namespaces on this machine, linked over TCP.",
    )
    commands = parser.add_subparsers(dest="action", required=True)
    up = commands.add_parser("up", help="make the nodes and their links")
    up.add_argument("--nodes", type=int, default=2, help="number of nodes, namespaces (default 2)")
    up.add_argument("--ranks-per-node", type=int, default=2, help="MPI ranks per node (default 2)")
    up.add_argument("--bandwidth", default=None, help='link rate in tc syntax ("100mbit", "1gbit") or "none"')
    up.add_argument("--name", default=None, help="cluster name (1-8 of a-z0-9; default md<subnet>)")
    up.add_argument(
        "--scheduler",
        choices=["none", "slurm"],
        default="none",
        help="slurm: also run Slurm on the nodes (munged, slurmctld, a slurmd per node) for sbatch/srun",
    )
    up.add_argument("--subnet", type=int, default=None, help="K of 198.18.K.0/24 (default: the first free)")
    run = commands.add_parser("run", help="run COMMAND on every rank: run [--name NAME] -- COMMAND...")
    run.add_argument("--name", default=None, help="the cluster (default: the only one that is up)")
    run.add_argument("-n", type=int, default=None, help="number of ranks (default nodes x ranks per node)")
    run.add_argument("--timeout", type=float, default=None, help="seconds before the run is killed")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    status = commands.add_parser("status", help="nodes, addresses, shaping and link byte counters")
    status.add_argument("--name", default=None, help="one cluster (default: all)")
    down = commands.add_parser("down", help="remove a cluster (its processes, namespaces, links)")
    which = down.add_mutually_exclusive_group()
    which.add_argument("--name", default=None, help="the cluster (default: the only one that is up)")
    which.add_argument("--all", action="store_true", help="every minidist cluster on this machine")
    return parser


def _the_only_cluster(name: str | None) -> Cluster:
    if name is not None:
        return Cluster.load(name)
    names = Cluster.names()
    if not names:
        raise ClusterError("no cluster is up: start one with `minidist cluster up --nodes 2`")
    if len(names) > 1:
        raise ClusterError(f"several clusters are up ({', '.join(names)}): choose one with --name")
    return Cluster.load(names[0])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ok, reason = cluster_available()
    if not ok:
        print(f"minidist cluster: {reason}", file=sys.stderr)
        return 2
    try:
        if args.action == "up":
            cluster = Cluster.up(
                args.nodes, args.ranks_per_node, args.bandwidth, args.name, args.subnet, args.scheduler
            )
            print(cluster.status())
            print(f"run a job: minidist cluster run --name {cluster.name} -- python script.py")
            if cluster.scheduler == "slurm":
                print(f"or with Slurm: export SLURM_CONF={cluster.slurm_env()['SLURM_CONF']}; "
                      "sbatch examples/slurm/train_gpt.sbatch")  # fmt: skip
        elif args.action == "run":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                raise ClusterError("run needs a command after --, e.g. `run -- python examples/train_mlp.py`")
            cluster = _the_only_cluster(args.name)
            try:
                return cluster.run(command, timeout=args.timeout, capture=False, n=args.n).returncode
            except subprocess.TimeoutExpired:
                print(f"minidist cluster: run killed after --timeout {args.timeout:g} s", file=sys.stderr)
                return 124  # as timeout(1)
        elif args.action == "status":
            names = [args.name] if args.name else Cluster.names()
            print("\n".join(Cluster.load(n).status() for n in names) or "no cluster is up")
        elif args.action == "down":
            names = Cluster.names() if args.all else [_the_only_cluster(args.name).name]
            for name in names:
                Cluster.load(name).down()
                print(f"removed cluster {name}")
    except ClusterError as error:
        print(f"minidist cluster: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
