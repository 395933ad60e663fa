"""What a student opens per concept stays within the house plan's figures (``scripts/reading_cost.py``).

The lines of the mechanism files the reading order sends a reader to, for DDP, the tensor-parallel
linear layers, the 1F1B schedule and its executor, and checkpoint save/load; and the ring all-reduce's
whole import closure, in files: the collective a student reads first must not pull in the safety net.
"""

from __future__ import annotations

import sys

import pytest
from mpi_utils import REPO

sys.path.insert(0, str(REPO / "scripts"))
import reading_cost  # noqa: E402


@pytest.mark.parametrize("concept", [c for c, (_, most) in reading_cost.CONCEPTS.items() if most is not None])
def test_a_concept_reads_in_at_most_its_lines(concept):
    files, most = reading_cost.CONCEPTS[concept]
    total = sum(reading_cost.lines(f) for f in files)
    assert 0 < total <= most, f"{concept}: {total} lines in {files} (at most {most})"


def test_the_ring_all_reduce_imports_little_and_no_safety_net():
    closure = reading_cost.import_closure(reading_cost.RING)
    assert reading_cost.RING in closure
    assert len(closure) <= reading_cost.RING_MAX_FILES, closure
    assert not [f for f in closure if "/safety/" in f], closure
