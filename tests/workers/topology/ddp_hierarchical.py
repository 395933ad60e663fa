"""MPI worker: ``ddp/ddp_equivalence.py`` with DDP's gradient all-reduces run hierarchically.

Usage: as ``ddp_equivalence.py`` (``OUT_DIR SEED STEPS BATCH OPT DTYPE ...``), on ranks that span nodes.
DDP calls ``all_reduce(algorithm="auto")``; the test model's buckets are far below
``tuning.HIERARCHICAL_FROM``, where ``auto`` keeps the flat pick, so this sets the threshold to 0 (every
all-reduce of a group that spans nodes becomes hierarchical, as a large model's buckets would) and
counts the hierarchical calls, written to ``OUT_DIR/hierarchical_rank<r>.json`` for the test.
"""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

from minidist.distributed import collectives, comm, tuning, world

tuning.ACROSS_NODES_TABLE[:] = [(tuning.ANY, [(math.inf, "hierarchical")])]
tuning.choose_across_nodes.cache_clear()
hierarchical = collectives._ALL_REDUCE["hierarchical"]
calls = 0


def counted(group: comm.Communicator, flat, op: str) -> None:
    global calls
    calls += 1
    hierarchical(group, flat, op)


collectives._ALL_REDUCE["hierarchical"] = counted
script = Path(__file__).parents[1] / "ddp" / "ddp_equivalence.py"
sys.argv = [str(script), *sys.argv[1:]]
runpy.run_path(str(script), run_name="__main__")
(Path(sys.argv[1]) / f"hierarchical_rank{world.get_rank()}.json").write_text(json.dumps(calls))
