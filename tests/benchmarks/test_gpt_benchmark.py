"""benchmarks/gpt.py and gpt_profile.py run, and the comparison they print means something (issue 17, item 6).

The figures themselves are in benchmarks/README.md, "GPT (issue 17)"; here a tiny GPT trains a few steps
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


def test_gpt_profile_accounts_for_the_ops_of_a_step(torch_threads, capsys, monkeypatch):
    import gpt_profile  # noqa: PLC0415  (benchmarks/gpt_profile.py)

    monkeypatch.setattr(sys, "argv", ["gpt_profile.py", "--steps", "1"])
    gpt_profile.main()
    text = capsys.readouterr().out
    for op in ("Linear", "GELU", "ScaledDotProductAttention", "LayerNorm", "Embedding", "CrossEntropy"):
        assert f"  {op} " in text, f"{op} missing:\n{text}"
    nodes = int(text.split("graph nodes per step: ")[1].split(";")[0])
    assert nodes == 75, text  # 4 blocks x 17 ops; 2 embeddings, their sum, ln_f, head, a reshape, the loss
    assert "other than float32 in this float32 model: none" in text, text
