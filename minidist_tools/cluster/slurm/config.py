"""Where a Slurm cluster in a box keeps its files, and the ``slurm.conf`` that describes it.

Everything lives in one folder beside the cluster's state file, ``<state dir>/<name>.slurm/``, so that
``down`` removes it with one ``rmtree`` and two clusters never share a file::

    slurm.conf              the configuration every daemon and command reads (SLURM_CONF points here)
    munge.key, munge.sock   the cluster's own munge key and socket (munged signs every Slurm message)
    munged.log, *.pid       the daemons' logs and pid files; slurmd's are per node (%n: the node name)
    slurmctld.log, slurmd.<node>.log
    task_prolog.sh          what every task and job script finds in its environment (TASK_PROLOG)
    ctld/, spool/<node>/    slurmctld's saved state, each slurmd's spool (job scripts, step sockets)

The configuration is the smallest that runs jobs on one machine without cgroups or accounting: Linux's
process list tracks a job's processes (``proctrack/linuxproc``), tasks are not bound to CPUs
(``task/none``), no accounting daemon. Each node claims ``ranks_per_node`` CPUs whatever the machine has
(``config_overrides``): Slurm then places ``ranks_per_node`` tasks on each node, as on a real cluster
whose nodes have that many cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# slurmctld listens in the host's network namespace, where two clusters' controllers would share ports:
# cluster K (its subnet) gets port BASE_PORT + K. Every slurmd has a namespace of its own: one port.
BASE_PORT = 16817
SLURMD_PORT = 6818
PARTITION = "box"

# Slurm runs the TaskProlog before every task (and every job script) and adds the variables its "export"
# lines name to the task's environment. In the box the nodes share one kernel, so UCX (MPICH's network
# layer) would pass messages between two nodes through shared memory; tcp,self makes them cross the links,
# as everything `minidist cluster run` starts does (launch.run_env). UCX_NET_DEVICES=eth0: the node's
# link only, not lo too. Each rank publishes its UCX address through Slurm's PMI-2, and with both
# interfaces the address is long enough that slurmstepd 22.05 at times reads a request in two pieces
# ("mpi/pmi2: invalid client request", then MPI_Init fails): 2 srun launches in 8 failed so, 0 in 24
# with eth0 alone (a GPT's larger requests still fail at times: the job script uses mpiexec).
# HYDRA_IFACE=eth0: mpiexec inside a job calls its helpers back on the node's address (as `-iface eth0`;
# the nodes' names are in no host table). One BLAS thread per rank, as everywhere in minidist.
TASK_PROLOG = """#!/bin/sh
# Written by `minidist cluster up --scheduler slurm`: every task's environment gets these (TaskProlog).
echo export UCX_TLS=tcp,self
echo export UCX_NET_DEVICES=eth0
echo export HYDRA_IFACE=eth0
echo export OMP_NUM_THREADS=1
echo export OPENBLAS_NUM_THREADS=1
echo export MKL_NUM_THREADS=1
"""


def plan(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The Slurm part of a cluster's state: its folder, controller name and port, and the pids of the
    daemons started so far (filled in as each starts, so that ``down`` finds every one)."""
    return {
        "folder": str(folder),
        "controller": f"{record['name']}ctl",
        "port": BASE_PORT + record["subnet"],
        "partition": PARTITION,
        "pids": {},
    }


def conf_path(slurm: dict[str, Any]) -> Path:
    return Path(slurm["folder"]) / "slurm.conf"


def munge_socket(slurm: dict[str, Any]) -> Path:
    return Path(slurm["folder"]) / "munge.sock"


def slurm_conf(record: dict[str, Any]) -> str:
    """The text of ``slurm.conf`` for the cluster ``record`` (its nodes, addresses, ranks per node)."""
    slurm, folder = record["slurm"], record["slurm"]["folder"]
    ranks = record["ranks_per_node"]
    lines = [
        "# Written by `minidist cluster up --scheduler slurm`; removed by `minidist cluster down`.",
        f"ClusterName={record['name']}",
        # The controller runs in the host's namespace under its own hostname, on the bridge's address:
        # the one address every node's namespace reaches.
        f"SlurmctldHost={slurm['controller']}({record['bridge_ip']})",
        f"SlurmctldPort={slurm['port']}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire: how long a job's credentials live, and so how long a requeued job waits before it
        # may start again (default 120 s); short, so that a test's requeued job restarts at once.
        f"AuthInfo=socket={munge_socket(slurm)},cred_expire=10",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={folder}/ctld",
        f"SlurmdSpoolDir={folder}/spool/%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd.%n.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd.%n.log",
        f"TaskProlog={folder}/task_prolog.sh",
        # No cgroups (a container often has none to give) and no accounting database.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "MailProg=/bin/true",
        # A node that stopped answering returns to service when its slurmd answers again; a node set DOWN
        # by hand (scontrol) stays DOWN until `scontrol update nodename=... state=resume`. A job on a
        # failed node is requeued when it asked for it (sbatch --requeue).
        "ReturnToService=1",
        "JobRequeue=0",
        # Short timeouts: a test waits for them. A real cluster uses minutes.
        "SlurmdTimeout=30",
        "SlurmctldTimeout=30",
        "MessageTimeout=10",
        "KillWait=5",
        "MinJobAge=30",
        "InactiveLimit=0",
        "Waittime=0",
        # Look at the queue every second (defaults: 60 s, backfill 30 s): a requeued job starts as soon as
        # it may.
        "SchedulerParameters=sched_interval=1,bf_interval=1",
    ]
    for node, address in zip(record["nodes"], record["addresses"]):
        lines.append(f"NodeName={node} NodeAddr={address} CPUs={ranks} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def write(record: dict[str, Any]) -> None:
    """Make the folder (munged wants it readable by all), its subfolders and ``slurm.conf``."""
    folder = Path(record["slurm"]["folder"])
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    (folder / "ctld").mkdir(exist_ok=True)
    for node in record["nodes"]:
        (folder / "spool" / node).mkdir(parents=True, exist_ok=True)
    prolog = folder / "task_prolog.sh"
    prolog.write_text(TASK_PROLOG)
    prolog.chmod(0o755)
    conf_path(record["slurm"]).write_text(slurm_conf(record))
