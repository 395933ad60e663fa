"""benchmarks/gpt.py runs, and the comparison it prints means something.

The figures themselves are in benchmarks/README.md, "GPT"; here a tiny GPT trains a few steps
side by side with its PyTorch twin (skipped without torch), and the two must agree: same weights, same
windows and the same optimizer give the same losses, so the speed ratio compares the same work. Run in
this process (not as scripts) so that torch is imported once for the whole suite.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpi_utils import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
TINY = ["--steps", "4", "--block", "2", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
        "--block-size", "8", "--batch-size", "2", "--eval-iters", "1"]  # fmt: skip


@pytest.fixture
def torch_threads():
    """The benchmark sets torch to one thread; give the rest of the suite its setting back."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_gpt_benchmark_trains_both_models_alike_and_reports_the_ratio(torch_threads, capsys):
    import gpt  # noqa: PLC0415  (benchmarks/gpt.py; imports torch)

    args = gpt.parser.parse_args(TINY)
    result = gpt.run(args)
    ours, theirs = result["losses"]["minidist"], result["losses"]["torch"]
    assert len(ours) == len(theirs) == 4
    assert ours[0] == pytest.approx(theirs[0], abs=1e-6)  # the same initial weights and windows
    np.testing.assert_allclose(ours, theirs, atol=1e-4)  # float32 on both sides, 4 steps of AdamW
    assert result["val_loss"]["minidist"] == pytest.approx(result["val_loss"]["torch"], abs=1e-4)
    assert all((t > 0).all() for t in result["tokens_per_s"].values())
    gpt.report(result, args)
    text = capsys.readouterr().out
    assert "minidist / torch tokens/s: " in text and "MFU" in text and "val loss difference" in text
