"""DDP's documented errors are raised on every rank, with the same message, and nobody hangs
(docs/design.md, property 5).

The ddp_errors worker runs every scenario in one mpiexec launch and records what each rank caught; the
run itself is under a timeout, so a hang fails the test instead of freezing the suite.
"""

from __future__ import annotations

import json

import pytest
from mpi_utils import run_mpi

NOT_NEEDED = (  # torch's words for a module without a parameter that requires a gradient
    "DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient."
)


def caught(tmp_path, world_size: int) -> list[dict[str, str]]:
    return [json.loads((tmp_path / f"errors_rank{r}.json").read_text()) for r in range(world_size)]


# One bucket per parameter with overlap (the ranks that have every gradient start all buckets during
# backward while rank 1 cannot start the first one), and one single bucket without overlap. A third run
# splits the buckets between the thread and the lean path (small_bucket_bytes=100: the two 256-byte
# weights go to the thread), so join() must follow the same launch order, not index order.
@pytest.mark.mpi
@pytest.mark.parametrize(
    "world_size, cap, overlap, small", [(3, "1e-6", 1, "0"), (2, "25", 0, "0"), (2, "1e-6", 1, "100")]
)
def test_errors_are_raised_on_every_rank_with_the_same_message(tmp_path, world_size, cap, overlap, small):
    run_mpi(world_size, "ddp/ddp_errors.py", tmp_path, cap, overlap, small, timeout=60)
    seen = caught(tmp_path, world_size)
    for scenario in seen[0]:
        assert len({s[scenario] for s in seen}) == 1, f"ranks disagree on {scenario}: {seen}"
    first = seen[0]
    # Only rank 1 lacked the gradients, but every rank raises, naming both parameters.
    assert first["unused_on_rank_1"].startswith("RuntimeError: DistributedDataParallel: parameters ")
    assert f"'extra.weight' (missing on 1 of {world_size} ranks)" in first["unused_on_rank_1"]
    assert f"'extra.bias' (missing on 1 of {world_size} ranks)" in first["unused_on_rank_1"]
    assert "find_unused_parameters=True" in first["unused_on_rank_1"]
    assert f"'extra.weight' (missing on {world_size} of {world_size} ranks)" in first["unused_everywhere"]
    assert first["still_works"] == "no error"
    assert first["options_differ"].startswith("ValueError: DistributedDataParallel: the ranks of the group")
    assert "small_bucket_bytes" in first["options_differ"]
    assert (
        first["negative_small"] == "ValueError: rank 0 of the group: small_bucket_bytes must be >= 0, got -1"
    )
    # Nothing to average: torch's message, on every rank; one rank's frozen model stops them all.
    assert first["all_frozen"] == first["no_parameters"] == f"RuntimeError: rank 0 of the group: {NOT_NEEDED}"
    assert first["frozen_on_rank_1"] == f"RuntimeError: rank 1 of the group: {NOT_NEEDED}"
    names = json.loads(first["state_dict_names"])  # DDP is a Module wrapping ddp.module, as in PyTorch
    assert names == sorted(f"module.{m}.{p}" for m in ("trunk", "head", "extra") for p in ("weight", "bias"))
    assert first["zeros_if_unused"] == "[true, true]"  # find_unused_parameters=True: zeros, not None
    assert first["uneven_batches"].startswith(
        f"CollectiveMismatchError: DistributedDataParallel: the ranks ran different numbers of batches: 1 of "
        f"{world_size} ranks had called join()"
    )


@pytest.mark.mpi
def test_one_rank_checks_unused_parameters_too(tmp_path):
    # A group of one communicates nothing, but keeps the same rules: the error, and zeros with
    # find_unused_parameters=True (so 1 rank trains like N ranks). "unused_on_rank_1" has no rank 1.
    run_mpi(1, "ddp/ddp_errors.py", tmp_path, "25", 1, timeout=60)
    (seen,) = caught(tmp_path, 1)
    assert "'extra.weight' (missing on 1 of 1 ranks)" in seen["unused_everywhere"]
    assert seen["unused_on_rank_1"] == seen["still_works"] == seen["uneven_batches"] == "no error"
    assert seen["zeros_if_unused"] == "[true, true]"
    assert seen["all_frozen"] == seen["no_parameters"] == f"RuntimeError: {NOT_NEEDED}"
    assert seen["frozen_on_rank_1"] == "no error"
