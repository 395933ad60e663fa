"""Shared test configuration: where the helpers are, hypothesis profiles, the order of the test files.

The tests mirror the tree (``tests/<package>/...``, ``tests/tools/``, ``tests/course/``). Every test
finds the shared helpers (``tests/helpers/``: ``mpi_utils``, ``strategies``, ``fake_group``, ...) and the
modules its MPI workers share (``tests/workers/``: ``ddp_common``, ``tp_common``, ...) by plain name:
both folders are put on ``sys.path`` here, before any test module is imported.

``ci`` (the default hypothesis profile) keeps the whole suite under 15 minutes on 2 cores; ``dev``
explores more. Choose with ``HYPOTHESIS_PROFILE=dev python -m pytest``.
"""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(_TESTS / "helpers"), str(_TESTS / "workers")]

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def same_arguments_everywhere(monkeypatch):
    """Stand-in for the construction-time exchange (``minidist/distributed/safety/agreement.py``): every rank
    of a
    ``fake_group`` (tests/helpers/fake_group.py) sent this rank's record, i.e. all ranks passed the same
    arguments (tests/workers/tensor_parallel/tp_errors.py and tp_gpt_errors.py run the real collective with
    arguments that differ)."""
    from minidist.distributed.safety import agreement

    monkeypatch.setattr(agreement, "all_gather_json", lambda obj, group: [obj] * group.size)


# -- the order in which `-n 2 --dist loadfile` hands out the test files ------------------------------------
# Each worker takes the next file when it finishes one, so the suite ends when the last file does: a long
# file handed out last leaves the other core idle for its length. Longest first (the LPT rule) avoids that.
# By default pytest-xdist hands out the files with the most tests first (--loadscope-reorder), which put
# long files of few tests (the examples' runs, the checkpoint kills) at the end. The list: the longest
# files (CPU seconds of the file and its ranks, from a full run at a load average of 3-18 and per-file
# runs at 14-24): assignments 256, lessons 252 (and more asleep: kernels,
# engines), train_gpt_layouts 121, train_mlp_example 107, checkpoint_mpi 77, train_gpt_example 61,
# collectives 49. Files not listed follow in collection order.
SLOWEST_FIRST = [
    "test_assignments.py",
    "test_lessons.py",
    "test_train_gpt_layouts.py",
    "test_train_mlp_example.py",
    "test_checkpoint_mpi.py",
    "test_train_gpt_example.py",
    "test_collectives.py",
]


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order made below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep order
