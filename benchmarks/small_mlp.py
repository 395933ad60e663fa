"""The small-MLP workload of ``peer.py``: one definition of the model, the data, the mesh and the
training step, for minidist, the NumPy reference and PyTorch.

MLP 64-256-256-10 (Linear, ReLU, Linear, ReLU, Linear), float32, softmax cross-entropy (mean), plain
SGD, a global batch of 128 split evenly over the dp ranks (ShallowSpeed's convention), and with
``--pp`` > 1 a GPipe schedule of ``--microbatches`` microbatches whose stages hold whole Linear layers
(pp=2: [Linear 64-256, ReLU] | [Linear 256-256, ReLU, Linear 256-10], which is also the cut minidist's
parameter balancing picks). Every rank runs this: ``mpiexec -n N`` with N = dp x pp.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank: the ranks share the cores

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402
from numpy_reference import ReferenceStage, dp_step, gpipe_step  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.models import MLP  # noqa: E402
from minidist.parallel import DistributedDataParallel, ProcessMesh  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel  # noqa: E402

SIZES = (64, 256, 256, 10)  # features in, two hidden layers, classes
N_LINEAR = len(SIZES) - 1

Step = Callable[[], object]
RESULTS = Path(__file__).parent / "results"


def write_csv(stem: str, mesh: ProcessMesh, lines: list[str]) -> None:
    """Write ``lines`` (a header and rows) to ``benchmarks/results/{stem}_dp{dp}_pp{pp}.csv`` and say so."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{stem}_dp{mesh.dp}_pp{mesh.pp}.csv"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dp", type=int, default=None, help="data-parallel ranks (default: world / pp)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (GPipe), 1 to 3")
    parser.add_argument("--microbatches", type=int, default=4, help="GPipe microbatches (with --pp > 1)")
    parser.add_argument("--batch", type=int, default=128, help="global batch, split over the dp ranks")
    parser.add_argument("--lr", type=float, default=0.05)


@dataclass
class Workload:
    """Everything one rank needs: its mesh, its share of the batch and the stage's initial weights."""

    mesh: ProcessMesh
    args: argparse.Namespace
    x: np.ndarray  # this dp rank's share of the batch, (batch / dp, 64) float32
    y: np.ndarray  # its targets, (batch / dp,) int64
    init: list[np.ndarray]  # the WHOLE model's initial parameters [W0, b0, W1, b1, W2, b2]
    # Private copies of the mesh's pp and dp communicators for the bare mpi4py messages: minidist's
    # own channels (and its liveness watchdog, which probes them) never see a message they did not send.
    pp_comm: MPI.Comm
    dp_comm: MPI.Comm
    sizes: tuple[int, ...] = SIZES  # the MLP's widths

    def new_model(self) -> MLP:
        """A fresh MLP of these widths from seed 0: the same initial weights as ``init``."""
        md.manual_seed(0)
        return MLP(self.sizes[0], list(self.sizes[1:-1]), self.sizes[-1])

    @property
    def stage_linears(self) -> range:
        """Which Linear layers (0..2) this rank's pipeline stage holds."""
        chunks = np.array_split(np.arange(N_LINEAR), self.mesh.pp)
        mine = chunks[self.mesh.pp_rank]
        return range(int(mine[0]), int(mine[-1]) + 1)

    @property
    def cuts(self) -> list[int]:
        """The stage boundaries as indices into the Sequential [Linear, ReLU, Linear, ReLU, Linear]."""
        chunks = np.array_split(np.arange(N_LINEAR), self.mesh.pp)
        return [2 * int(c[0]) for c in chunks[1:]]


def make_workload(args: argparse.Namespace, sizes: tuple[int, ...] = SIZES) -> Workload:
    """Build the mesh (raising ValueError on every rank alike if dp x pp != world size) and the data
    for an MLP of widths ``sizes`` (``len(sizes) - 1`` Linear layers)."""
    world = dist.init()
    pp = args.pp
    dp = args.dp if args.dp is not None else world.size // max(pp, 1)
    if (
        not 1 <= pp <= N_LINEAR
        or dp * pp != world.size
        or args.batch % dp
        or (args.batch // dp) % (args.microbatches if pp > 1 else 1)
    ):
        raise SystemExit(
            f"need 1 <= pp <= {N_LINEAR}, dp x pp = world size ({world.size}) and a batch divisible by dp "
            f"x microbatches; got dp={dp}, pp={pp}, batch={args.batch}, microbatches={args.microbatches}"
        )  # the same arguments on every rank: every rank exits with this message
    mesh = ProcessMesh(dp=dp, tp=1, pp=pp)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, sizes[0]), dtype=np.float32)
    y = rng.integers(0, sizes[-1], args.batch)
    share = np.array_split(np.arange(args.batch), dp)[mesh.dp_rank]
    x_mine = np.ascontiguousarray(x[share])
    pp_comm, dp_comm = mesh.pp_group.mpi.Dup(), mesh.dp_group.mpi.Dup()
    w = Workload(mesh, args, x_mine, y[share], [], pp_comm, dp_comm, tuple(sizes))
    w.init = [p.data.copy() for p in w.new_model().parameters()]
    return w


def minidist_step(w: Workload) -> tuple[Step, list]:
    """(one training step through minidist's public API, this stage's parameters as Tensors)."""
    mlp = w.new_model()
    mesh, lr = w.mesh, w.args.lr
    xt = md.tensor(w.x)
    if mesh.pp > 1:
        pipe = PipelineParallel(mlp, mesh, microbatches=w.args.microbatches, schedule="gpipe", cuts=w.cuts)
        params = list(pipe.parameters())
        opt = optim.SGD(params, lr=lr)

        def pipeline_step() -> None:
            opt.zero_grad()
            pipe.train_step(xt, w.y, nn.functional.cross_entropy)
            opt.step()

        return pipeline_step, params
    model = DistributedDataParallel(mlp, group=mesh.dp_group) if mesh.dp > 1 else mlp
    params = list(model.parameters())
    opt = optim.SGD(params, lr=lr)

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xt), w.y).backward()
        opt.step()

    return step, params


def reference_stage(w: Workload) -> ReferenceStage:
    """This rank's pipeline stage of the reference (the whole model without stages), from the initial
    weights."""
    layers = w.stage_linears
    return ReferenceStage(w.init[2 * layers.start : 2 * layers.stop], head=layers.stop == N_LINEAR)


def reference_step(w: Workload) -> tuple[Step, list[np.ndarray]]:
    """(one step of the hand-written NumPy reference, this stage's parameter arrays)."""
    stage = reference_stage(w)
    dp = w.dp_comm
    if w.mesh.pp == 1:
        return (lambda: dp_step(stage, w.x, w.y, w.args.lr, dp)), stage.params
    pp, m = w.pp_comm, w.args.microbatches
    return (lambda: gpipe_step(stage, w.x, w.y, w.args.lr, m, pp, dp)), stage.params


def torch_step(w: Workload) -> tuple[Step, list[np.ndarray]] | None:
    """PyTorch eager (1 thread) on this rank's batch, gradients averaged with mpi4py's Allreduce; None
    if torch is missing or with pipeline stages (no PyTorch pipeline here)."""
    try:
        import torch  # noqa: PLC0415  (optional: the "bench" extra)
    except ImportError:
        return None
    if w.mesh.pp > 1:
        return None
    torch.set_num_threads(1)
    layers: list = []
    for k in range(N_LINEAR):
        layers += [torch.nn.Linear(w.sizes[k], w.sizes[k + 1])] + (
            [torch.nn.ReLU()] if k < N_LINEAR - 1 else []
        )
    model = torch.nn.Sequential(*layers)
    with torch.no_grad():
        for p, value in zip(model.parameters(), w.init):
            p.copy_(torch.from_numpy(value))
    opt = torch.optim.SGD(model.parameters(), lr=w.args.lr)
    x, y = torch.from_numpy(w.x), torch.from_numpy(w.y)
    dp, n = w.dp_comm, w.mesh.dp

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if n > 1:
            for p in model.parameters():  # .numpy() shares the gradient's memory: averaged in place
                g = p.grad.numpy()
                dp.Allreduce(MPI.IN_PLACE, g)
                g /= n
        opt.step()

    return step, [p.detach().numpy() for p in model.parameters()]
