"""Shared test configuration: hypothesis profiles.

``ci`` (the default) keeps the whole suite under 15 minutes on 2 cores; ``dev`` explores more.
Choose with ``HYPOTHESIS_PROFILE=dev python -m pytest``.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def same_arguments_everywhere(monkeypatch):
    """Stand-in for the construction-time exchange (``minidist/distributed/agreement.py``): every rank of a
    ``fake_group`` (tests/fake_group.py) sent this rank's record, i.e. all ranks passed the same arguments
    (tests/workers/tensor_parallel/tp_errors.py and tp_gpt_errors.py run the real collective with
    arguments that differ)."""
    from minidist.distributed import agreement

    monkeypatch.setattr(agreement, "all_gather_json", lambda obj, group: [obj] * group.size)
