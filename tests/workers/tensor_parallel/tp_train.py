"""MPI worker: train tp_common's MLP on a dp x tp mesh (DDP over the dp group) for a few steps.

argv: out_dir seed steps dp tp [--clip MAX_NORM] [--dropout P]
Every rank writes rank{r}.npz ("param/<name>" after training, "grad/<name>" of the last step) and
rank{r}.json (losses, clip norms, mesh coordinates, tp_dim per parameter name). Each step's global
batch is split over the dp replicas (numpy.array_split); a replica's loss is its summed loss times
dp / batch, so DDP's average is the gradient of the mean loss over the global batch.
--dropout P (dp = 1 only) also trains tp_common's dropout model: ParallelMLP with dropout P on its
sharded hidden activations, then nn.Dropout(P) on the replicated output, then a Linear head; its
results are saved under "drop/param/<name>" and "drop_losses".
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import tp_common  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.models import MLP  # noqa: E402
from minidist.parallel import DistributedDataParallel, ParallelMLP, ProcessMesh, clip_grad_norm_  # noqa: E402
from minidist.parallel.tensor_parallel import model_parallel_manual_seed  # noqa: E402

parser = argparse.ArgumentParser()
for name in ("out_dir", "seed", "steps", "dp", "tp"):
    parser.add_argument(name, type=str if name == "out_dir" else int)
parser.add_argument("--clip", type=float, default=None)
parser.add_argument("--dropout", type=float, default=None)
args = parser.parse_args()
F64, BATCH = np.float64, 16

mesh = ProcessMesh(dp=args.dp, tp=args.tp)
x, y = tp_common.make_data(args.seed)
results, record = {}, {"coords": list(mesh.coords)}

# --- the MLP, DDP over the dp group ----------------------------------------------------------------
model_parallel_manual_seed(args.seed, group=mesh.tp_group)
model = MLP(tp_common.N_IN, tp_common.HIDDEN, tp_common.N_CLASSES, mesh=mesh, dtype=F64)
ddp = DistributedDataParallel(model, group=mesh.dp_group)
opt = optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
losses, norms = [], []
for step in range(args.steps):
    xb, yb = tp_common.global_batch(x, y, step, BATCH)
    mine = np.array_split(np.arange(BATCH), mesh.dp)[mesh.dp_rank]
    local = nn.functional.cross_entropy(ddp(md.tensor(xb[mine], dtype=F64)), yb[mine], reduction="sum")
    opt.zero_grad()
    (local * (mesh.dp / BATCH)).backward()
    if args.clip is not None:
        norms.append(clip_grad_norm_(model.parameters(), args.clip))
    opt.step()
    losses.append(float(dist.all_reduce(np.array([local.item()]), group=mesh.dp_group)[0]) / BATCH)
for name, p in model.named_parameters():
    results[f"param/{name}"], results[f"grad/{name}"] = p.numpy(), p.grad.copy()
record.update(losses=losses, norms=norms, tp_dims={n: p.tp_dim for n, p in model.named_parameters()})

# --- dropout on sharded (tracker) and replicated (default generator) activations -------------------
if args.dropout is not None:
    assert mesh.dp == 1, "the dropout model is trained on tensor parallelism only"
    model_parallel_manual_seed(args.seed + 1, group=mesh.tp_group)
    drop = nn.Sequential(
        ParallelMLP(tp_common.N_IN, 8, 6, dropout=args.dropout, group=mesh.tp_group, dtype=F64),
        nn.Dropout(args.dropout), nn.Linear(6, tp_common.N_CLASSES, dtype=F64),
    )  # fmt: skip
    opt = optim.SGD(drop.parameters(), lr=0.1)
    record["drop_losses"] = []
    for step in range(args.steps):
        xb, yb = tp_common.global_batch(x, y, step, BATCH)
        loss = nn.functional.cross_entropy(drop(md.tensor(xb, dtype=F64)), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        record["drop_losses"].append(loss.item())
    for name, p in drop.named_parameters():
        results[f"drop/param/{name}"] = p.numpy()
    record["drop_tp_dims"] = {n: p.tp_dim for n, p in drop.named_parameters()}

out = Path(args.out_dir)
np.savez(out / f"rank{mesh.rank}.npz", **results)
(out / f"rank{mesh.rank}.json").write_text(json.dumps(record))
