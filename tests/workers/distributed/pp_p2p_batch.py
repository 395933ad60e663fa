"""Non-blocking point-to-point batches (``minidist.distributed.p2p_batch``) on 2 ranks.

    mpiexec -n 2 python pp_p2p_batch.py OUT_DIR [timeout]

Writes OUT_DIR/rank{r}.json: {case: [exception type or null, message or result]}. Cases:

* ``crossed``: each rank starts two sends and two receives of 64 KiB (above MPI's eager limit, so a
  blocking send would wait for its receive) in opposite orders; the data must arrive by tag;
* ``short`` / ``long``: rank 0 sends 3 / 5 elements where rank 1 expects 4, next to a correct message;
* ``timeout`` (last, only with the ``timeout`` argument and ``MINIDIST_TIMEOUT`` set): rank 1 waits for
  a message rank 0 never sends.
"""

import json
import sys
from pathlib import Path

import numpy as np

import minidist.distributed as dist
from minidist.distributed.p2p_batch import batch_send_recv, irecv, isend, wait_all

out, timed = Path(sys.argv[1]), sys.argv[2:] == ["timeout"]
world = dist.init()
rank, peer = world.rank, 1 - world.rank
N = 8192  # float64: 64 KiB per message


def crossed():
    a, b = np.full(N, 10.0 * rank + 1), np.full(N, 10.0 * rank + 2)
    got_a, got_b = np.empty(N), np.empty(N)
    if rank == 0:  # rank 0 starts its sends first, rank 1 its receives, in the other tag order
        requests = [isend(world, a, peer, 1), isend(world, b, peer, 2)]
        requests += [irecv(world, got_b, peer, 2), irecv(world, got_a, peer, 1)]
    else:
        requests = [irecv(world, got_b, peer, 2), irecv(world, got_a, peer, 1)]
        requests += [isend(world, b, peer, 2), isend(world, a, peer, 1)]
    wait_all(world, requests)
    wait_all(world, requests)  # a second wait on finished requests returns at once
    assert all(r.done for r in requests)
    return [float(got_a.min()), float(got_a.max()), float(got_b.min()), float(got_b.max())]


def mismatch(n_sent):
    if rank == 0:
        batch_send_recv(world, sends=[(np.ones(n_sent), 1, 7), (np.ones(2), 1, 8)])
    else:
        batch_send_recv(world, recvs=[(np.empty(2), 0, 8), (np.empty(4), 0, 7)])
    return "no error"


def timeout():
    if rank == 1:
        wait_all(world, [irecv(world, np.empty(3), 0, 9)])
    return "no error"


cases = {"crossed": crossed, "short": lambda: mismatch(3), "long": lambda: mismatch(5)}
if timed:
    cases["timeout"] = timeout
results = {}
for name, case in cases.items():
    try:
        results[name] = [None, case()]
    except dist.CollectiveTimeoutError as error:  # caught by the name a user catches it by
        results[name] = ["CollectiveTimeoutError", str(error)]
    except dist.DistributedError as error:
        results[name] = [type(error).__name__, str(error)]
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    if name != "timeout":
        world.barrier()
