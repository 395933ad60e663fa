"""Shared test configuration: hypothesis profiles.

``ci`` (the default) keeps the whole suite under 15 minutes on 2 cores; ``dev`` explores more.
Choose with ``HYPOTHESIS_PROFILE=dev python -m pytest``.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
