"""The examples' ``--comm-hook`` and ``--powersgd-rank`` flags: a run, and the bad combinations.

One 2-rank run of ``examples/train_mlp.py`` per compressing hook would cost a launch each; one bf16 run
shows the flag reaches DDP (the bytes line) and still trains. The flags' errors are checked in this
process, on the parsers themselves (no MPI launch: they only look at the command line).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
from mpi_utils import REPO, mpi_env, run_mpi

sys.path.insert(0, str(REPO / "examples"))
import train_mlp_args  # noqa: E402

EXAMPLE = REPO / "examples" / "train_mlp.py"


@pytest.mark.mpi
def test_train_mlp_with_bf16_compression_sends_half_the_payload_and_learns_as_much():
    flags = ("--epochs", "4", "--hidden", "32")
    result = run_mpi(2, EXAMPLE, *flags, "--comm-hook", "bf16", timeout=120)
    bytes_line = r"^gradient all-reduce with --comm-hook bf16: .* \((\d+\.\d)x smaller\)$"
    line = re.search(bytes_line, result.stdout, re.M)
    assert line and line.group(1) == "2.0", result.stdout
    # The same training without compression, on one process (the example trains the same model on any
    # number of ranks): bfloat16's relative error of 2**-8 in the averaged gradient changes few of the
    # 297 test predictions in 44 steps (measured: none), so the accuracies agree to 0.02 (6 digits).
    plain = subprocess.run([sys.executable, str(EXAMPLE), *flags], capture_output=True, text=True,
                           env=mpi_env(), timeout=120)  # fmt: skip
    assert abs(accuracy(result.stdout) - accuracy(plain.stdout)) <= 0.02, (result.stdout, plain.stdout)


def accuracy(output: str) -> float:
    match = re.search(r"^final test accuracy: (\d\.\d{4})$", output, re.M)
    assert match, output
    return float(match.group(1))


@pytest.mark.parametrize(("flags", "message"), [
    (["--powersgd-rank", "2"], "--powersgd-rank only means something with --comm-hook powersgd"),
    (["--comm-hook", "powersgd", "--powersgd-rank", "0"], "--powersgd-rank must be >= 1"),
    (["--comm-hook", "fp16", "--zero", "1"], "--comm-hook fp16 is a DDP hook, and --zero replaces DDP"),
    (["--comm-hook", "int8"], "invalid choice: 'int8'"),
])  # fmt: skip
def test_train_mlp_rejects_bad_comm_hook_flags(flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        train_mlp_args.parse_args(flags)


def test_train_mlp_rejects_a_comm_hook_with_a_pipeline():
    args = train_mlp_args.parse_args(["--pp", "2", "--comm-hook", "bf16"])
    with pytest.raises(ValueError, match="cannot be combined with --comm-hook bf16"):
        train_mlp_args.check_pipeline_args(args, dp=1)


@pytest.mark.parametrize("flags", [["--zero", "1"], ["--pp", "2"]])
def test_train_gpt_rejects_a_comm_hook_without_ddp(flags, capsys):
    spec = importlib.util.spec_from_file_location("train_gpt_for_flags", REPO / "examples" / "train_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exit_info:
        module.parse_arguments(["--comm-hook", "powersgd", *flags])
    assert exit_info.value.code == 2
    assert (
        "--comm-hook powersgd is a DDP hook; --zero and --pp > 1 average without DDP"
        in capsys.readouterr().err
    )
