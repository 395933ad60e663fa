"""minidist/host_memory.py: the glibc malloc settings that keep a step's freed memory for the next step.

Each case runs in a fresh interpreter, because the settings are per process and made at import.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="needs glibc malloc"
)

# Ten steps of the small MLP of benchmarks/small_mlp.py after a warm-up, then the minor page faults
# (a page touched for the first time since the OS handed it over) per step.
STEPS = """
import resource, numpy as np, minidist as md
from minidist import host_memory, nn, optim
from minidist.models import MLP
md.manual_seed(0)
model = MLP(64, [256, 256], 10)
opt = optim.SGD(model.parameters(), lr=0.05)
x, y = md.tensor(np.ones((128, 64), np.float32)), np.zeros(128, np.int64)
def step():
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
for _ in range(5): step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10): step()
print(host_memory.applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _run(**env: str) -> tuple[bool, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    clean.update(env, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", STEPS], env=clean, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    applied, faults = out.stdout.split()
    return applied == "True", float(faults)


@glibc_only
def test_a_step_of_the_small_mlp_does_not_page_fault_its_arrays_in_again():
    applied, faults = _run()
    assert applied
    # Without the settings: ~270 faults per step here (docs/performance.md, "The operating system: page
    # faults"); a few stray ones are allowed (the interpreter's own allocations), a step's worth of
    # activations is not.
    assert faults < 20, f"{faults} page faults per step"


@glibc_only
def test_the_settings_are_left_alone_when_switched_off_or_set_by_the_user():
    assert _run(MINIDIST_KEEP_FREED_MEMORY="0")[0] is False
    assert _run(MALLOC_TRIM_THRESHOLD_="1000000")[0] is False  # glibc's own variable: the user's choice
