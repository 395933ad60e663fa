"""MPI worker: DDP's collective error checks. Every rank records what it saw in errors_rank{r}.json.

argv: out_dir bucket_cap_mb overlap(0|1) [small_bucket_bytes]
Scenarios, run one after the other on the same ranks (so they also show that DDP keeps working after an
error was raised and caught):
  unused_on_rank_1  rank 1 leaves TwoHeads.extra without a gradient, the others do not
  unused_everywhere no rank uses TwoHeads.extra
  still_works       a normal step afterwards
  zeros_if_unused   find_unused_parameters=True and no rank uses extra: its .grad must be zeros
  uneven_batches    the last rank runs one step fewer and calls join(); the others run another step
  options_differ    the ranks pass different small_bucket_bytes (they would all-reduce in different orders)
  negative_small    only rank 0 passes small_bucket_bytes=-1: every rank raises its error
  all_frozen        a model whose parameters all have requires_grad=False: nothing to average
  no_parameters     a model without parameters (nn.Tanh())
  frozen_on_rank_1  only rank 1's model is frozen: every rank raises rank 1's error
(and state_dict_names: the names of the wrapped model's state_dict)
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import ddp_common  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402

out_dir, cap, overlap = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
small = {"small_bucket_bytes": int(sys.argv[4])} if len(sys.argv) > 4 else {}
world = dist.init()
x, y = ddp_common.make_data(0, 8)
xb, yb = md.tensor(x, dtype=np.float64), y
seen: dict[str, str] = {}


def step(model, use_extra: bool) -> None:
    model.zero_grad()
    nn.functional.cross_entropy(model(xb, use_extra), yb).backward()


def expect_error(name: str, model, use_extra: bool) -> None:
    try:
        step(model, use_extra)
        seen[name] = "no error"
    except RuntimeError as error:  # CollectiveMismatchError is a RuntimeError too
        seen[name] = f"{type(error).__name__}: {error}"


def make(find_unused: bool = False):
    module = ddp_common.TwoHeads(0, np.float64)
    return DistributedDataParallel(
        module, group=world, bucket_cap_mb=cap, overlap=overlap, find_unused_parameters=find_unused, **small
    )


model = make()
seen["state_dict_names"] = json.dumps(sorted(model.state_dict()))
expect_error("unused_on_rank_1", model, use_extra=world.rank != 1)
expect_error("unused_everywhere", model, use_extra=False)
expect_error("still_works", model, use_extra=True)

lenient = make(find_unused=True)
step(lenient, use_extra=False)
seen["zeros_if_unused"] = json.dumps(
    [
        p.grad is not None and not np.any(p.grad)
        for p in (lenient.module.extra.weight, lenient.module.extra.bias)
    ]
)

for name, small in (("options_differ", world.rank), ("negative_small", -1 if world.rank == 0 else 0)):
    try:
        DistributedDataParallel(ddp_common.TwoHeads(0, np.float64), group=world, small_bucket_bytes=small)
        seen[name] = "no error"
    except ValueError as error:
        seen[name] = f"{type(error).__name__}: {error}"


def frozen(everything: bool) -> nn.Module:
    module = ddp_common.TwoHeads(0, np.float64)
    for p in module.parameters():
        p.requires_grad = not everything
    return module


for name, module in (
    ("all_frozen", frozen(True)),
    ("no_parameters", nn.Tanh()),
    ("frozen_on_rank_1", frozen(world.rank == 1)),
):
    try:
        DistributedDataParallel(module, group=world)
        seen[name] = "no error"
    except RuntimeError as error:
        seen[name] = f"{type(error).__name__}: {error}"

batches = 2 if world.rank == world.size - 1 else 3
try:
    for _ in range(batches):
        step(model, use_extra=True)
    model.join()
    seen["uneven_batches"] = "no error"
except RuntimeError as error:
    seen["uneven_batches"] = f"{type(error).__name__}: {error}"
(Path(out_dir) / f"errors_rank{world.rank}.json").write_text(json.dumps(seen))
