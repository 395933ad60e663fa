"""MPI worker (8 ranks): 4-D ProcessMesh layouts (dp x tp x pp x cp), one launch for all of them.

argv: out_dir. Writes rank{r}.json with, per layout "dp,tp,pp,cp": this rank's coords4, coords,
rank_of of its coordinates, and the world ranks of its dp/tp/pp/cp/dp_cp groups (in group-rank order);
and str(mesh) of each layout. Also the error of a mesh whose product is not the world size.
"""

import json
import sys
from pathlib import Path

import minidist.distributed as dist
from minidist.parallel import ProcessMesh

AXES = ("dp", "tp", "pp", "cp", "dp_cp")
out_dir = Path(sys.argv[1])
world = dist.init()
record = {"layouts": {}, "drawings": {}}
for dp, tp, pp, cp in [(2, 2, 1, 2), (1, 2, 2, 2), (2, 1, 2, 2), (1, 1, 1, 8), (1, 2, 1, 4), (2, 2, 2, 1)]:
    mesh = ProcessMesh(dp, tp, pp, cp)  # cp as the 4th positional argument
    groups = {axis: getattr(mesh, f"{axis}_group").mpi.allgather(world.rank) for axis in AXES}
    record["layouts"][f"{dp},{tp},{pp},{cp}"] = {
        "coords4": list(mesh.coords4),
        "coords": list(mesh.coords),
        "rank_of": mesh.rank_of(*mesh.coords4),
        "sizes": [mesh.dp, mesh.tp, mesh.pp, mesh.cp, mesh.world_size],
        **groups,
    }
    record["drawings"][f"{dp},{tp},{pp},{cp}"] = str(mesh)
try:
    ProcessMesh(dp=2, tp=2, pp=1, cp=4)
except ValueError as error:
    record["product_error"] = str(error)
(out_dir / f"rank{world.rank}.json").write_text(json.dumps(record))
