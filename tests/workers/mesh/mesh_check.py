"""MPI worker (4 ranks): ProcessMesh layouts and errors.

argv: out_dir. Writes rank{r}.json with, per valid layout "dp,tp,pp": this rank's coords, rank_of of
them, and the world ranks of its dp/tp/pp groups (in group-rank order); str(mesh) of each layout; and,
per misuse case, the exception type and message this rank raised (every rank must raise).
"""

import json
import sys
from pathlib import Path

import numpy as np

import minidist.distributed as dist
from minidist.parallel import ProcessMesh

out_dir = Path(sys.argv[1])
world = dist.init()
record = {"layouts": {}, "drawings": {}, "errors": {}}
for dp, tp, pp in [(4, 1, 1), (1, 4, 1), (1, 1, 4), (2, 2, 1), (2, 1, 2), (1, 2, 2)]:
    mesh = ProcessMesh(dp, tp, pp)
    groups = {axis: getattr(mesh, f"{axis}_group").mpi.allgather(world.rank) for axis in ("dp", "tp", "pp")}
    record["layouts"][f"{dp},{tp},{pp}"] = {
        "coords": list(mesh.coords),
        "rank_of": mesh.rank_of(*mesh.coords),
        "sizes": [mesh.dp_group.size, mesh.tp_group.size, mesh.pp_group.size, mesh.world_size],
        **groups,
    }
    record["drawings"][f"{dp},{tp},{pp}"] = str(mesh)

cases = {
    "product": dict(dp=3, tp=1, pp=1),
    "zero": dict(dp=4, tp=0, pp=1),
    "not_int": dict(dp=2, tp=2.0, pp=1),
    # Only rank 2 passes other sizes (each valid on its own): everyone must still fail, not hang.
    "differ": dict(dp=4, tp=1, pp=1) if world.rank == 2 else dict(dp=2, tp=2, pp=1),
    # Only rank 3 passes a bad type: the others must not wait for it in the communicator splits.
    "one_bad": dict(dp=2, tp="2", pp=1) if world.rank == 3 else dict(dp=2, tp=2, pp=1),
    # NumPy integers on one rank: the same sizes as the others' ints, so a valid mesh
    "numpy_on_rank_1": dict(dp=np.int64(2), tp=np.int32(2), pp=1)
    if world.rank == 1
    else dict(dp=2, tp=2, pp=1),
}
for name, sizes in cases.items():
    try:
        built = ProcessMesh(**sizes)
        record["errors"][name] = ["ok", repr(built)] if name == "numpy_on_rank_1" else None
    except (TypeError, ValueError) as error:
        record["errors"][name] = [type(error).__name__, str(error)]
mesh = ProcessMesh(2, 2, 1)
try:
    mesh.rank_of(0, 2, 0)
except ValueError as error:
    record["errors"]["rank_of"] = ["ValueError", str(error)]
(out_dir / f"rank{world.rank}.json").write_text(json.dumps(record))
