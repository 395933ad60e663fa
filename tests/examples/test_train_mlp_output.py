"""What examples/train_mlp.py prints under mpirun: one progress stream in order, each error once.

Under ``mpirun`` a rank's stdout and stderr reach the terminal through
separate pipes, so anything printed to both arrives in any order; and every rank that prints an error
prints its own copy. These tests read the output as a user's terminal shows it (stdout and stderr
merged, Python's default buffering, i.e. without PYTHONUNBUFFERED).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from mpi_utils import REPO, mpi_env, mpiexec_path, run_mpi

from minidist_tools.report import describe, rank_ranges

EXAMPLE = REPO / "examples" / "train_mlp.py"


def terminal(n: int, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``mpiexec -n n python train_mlp.py args`` with stdout and stderr in one pipe, as in a terminal."""
    # MINIDIST_ERROR_WAIT: how long rank 0 waits for the other failing ranks (default 5 s). An error on
    # every rank is reported as soon as the last one arrives, so a generous wait costs nothing, and a
    # loaded machine (ranks seconds apart before their first collective) cannot make the test flaky.
    env = mpi_env({"MINIDIST_ERROR_WAIT": "60", **(extra_env or {})})
    env.pop("PYTHONUNBUFFERED", None)  # a user's shell does not set it: stdout is block-buffered in a pipe
    return subprocess.run(
        [mpiexec_path(), "-n", str(n), sys.executable, str(EXAMPLE), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=120,
    )  # fmt: skip


@pytest.mark.mpi
def test_epoch_lines_the_progress_and_the_final_line_come_in_order():
    # 3 epochs of 11 steps. Before: the epoch lines (stdout) reached the terminal after the whole bar
    # (stderr), and the final line could come before the bar's last update. A pipe is not a terminal:
    # the progress is whole lines (every 3 steps here, a tenth of 33), with no \r redraws to pile up in a log.
    result = terminal(2, "--epochs", "3", "--hidden", "32")
    assert result.returncode == 0, result.stdout
    assert "\r" not in result.stdout, result.stdout
    shown = result.stdout.splitlines()
    progress = [
        (i, int(m.group(1))) for i, s in enumerate(shown) if (m := re.match(r"train: step (\d+)/33", s))
    ]
    epochs = [i for i, s in enumerate(shown) if "epoch" in s and "train loss" in s]
    assert len(epochs) == 3 and [step for _, step in progress] == list(range(3, 34, 3)), result.stdout
    for k, i in enumerate(epochs, start=1):
        # A whole line of its own, after the progress reached the last multiple of 3 before step 11k, and
        # before the next one.
        assert re.fullmatch(rf"epoch +{k}  train loss \d\.\d{{4}}  test accuracy \d\.\d{{4}}", shown[i]), (
            shown
        )
        before = [step for j, step in progress if j < i]
        assert before[-1] == 11 * k // 3 * 3, shown
    assert re.fullmatch(r"final test accuracy: \d\.\d{4}", shown[-1]), shown


@pytest.mark.mpi
def test_an_error_every_rank_raises_is_printed_once_with_the_ranks(tmp_path):
    # Before: each of the 3 ranks printed "[rank r] error: MNIST folder ..." and "aborting", and a rank
    # whose MPI_Abort returned printed it once more under "[rank 0]".
    result = terminal(3, "--dataset", "mnist", "--data-dir", str(tmp_path / "missing"))
    assert result.returncode == 2, result.stdout
    lines = result.stdout.splitlines()
    assert len([line for line in lines if "MNIST folder" in line]) == 1, result.stdout
    assert lines[0].startswith(f"error on ranks 0-2: MNIST folder '{tmp_path / 'missing'}' does not exist")
    assert "[rank" not in result.stdout and "Traceback" not in result.stdout, result.stdout


@pytest.mark.mpi
def test_a_failed_dist_init_is_printed_once_for_all_ranks():
    result = terminal(2, extra_env={"MINIDIST_DEVICE": "gpu"})  # dist.init() raises on every rank
    assert result.returncode == 2, result.stdout
    assert result.stdout.startswith("error on ranks 0-1: MINIDIST_DEVICE='gpu' is not one of"), result.stdout
    assert result.stdout.count("MINIDIST_DEVICE") == 1, result.stdout


@pytest.mark.mpi
def test_a_bad_flag_is_printed_once_for_all_ranks():
    # Before: argparse printed its usage and error on every rank.
    result = terminal(2, "--epochs", "many")
    assert result.returncode == 2, result.stdout
    assert (
        result.stdout
        == "error on ranks 0-1: argument --epochs: invalid int value: 'many' (see train_mlp.py --help)\n"
    )


@pytest.mark.mpi
def test_help_is_printed_once():
    result = terminal(2, "--help")
    assert result.returncode == 0 and result.stdout.count("usage:") == 1, result.stdout


@pytest.mark.mpi
def test_an_error_on_some_ranks_is_printed_once_by_each_with_its_true_rank():
    # Ranks 1 and 2 raise; 0 and 3 wait in a barrier, so the job must end through MPI_Abort.
    result = run_mpi(
        4,
        "training/error_on_some_ranks.py",
        "1",
        "2",
        timeout=60,
        check=False,
        env={"MINIDIST_ERROR_WAIT": "0.5"},
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "bad input" in line]
    assert sorted(errors) == ["[rank 1] error: bad input on rank 1", "[rank 2] error: bad input on rank 2"], (
        result.stderr
    )


def test_describe_lists_each_message_once_with_rank_ranges():
    assert rank_ranges([3]) == "rank 3"
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"
    texts = {0: "no folder", 1: "no folder", 2: None, 3: "no folder", 4: "bad file"}
    assert describe(texts) == "error on ranks 0-1, 3: no folder\nerror on rank 4: bad file\n"


# --- what a run says about itself --------------------------------------------------------------------
def run_one(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=mpi_env(), timeout=60
    )


def test_max_steps_says_what_it_measured(tmp_path):
    result = run_one("--epochs", "1", "--hidden", "8", "--max-steps", "2")
    assert result.returncode == 0, result.stderr
    assert "final test accuracy" not in result.stdout
    assert re.search(r"^test accuracy after 2 steps: \d\.\d{4}$", result.stdout, re.MULTILINE), result.stdout
    # No --checkpoint-dir: nothing was saved, so the run must not tell the user to --resume it.
    assert "continue with --resume" not in result.stdout
    assert "stopped at step 2 of 11 (--max-steps); nothing saved (no --checkpoint-dir)" in result.stdout


def test_resuming_a_finished_run_says_so_and_trains_nothing(tmp_path):
    args = ("--epochs", "1", "--hidden", "8", "--checkpoint-dir", str(tmp_path))
    first = run_one(*args)
    again = run_one(*args, "--resume")
    assert again.returncode == 0, again.stderr
    assert "the run is already complete (11 of 11 steps); raise --epochs to train further" in again.stdout
    assert "train:" not in again.stdout + again.stderr and "epoch   1" not in again.stdout  # no bar, no epoch
    assert again.stdout.splitlines()[-1] == first.stdout.splitlines()[-1]  # "final test accuracy: ..."
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000000011"]  # nothing saved again


def test_help_states_each_default_once():
    result = run_one("--help")
    assert result.returncode == 0, result.stderr
    entries: list[str] = []  # one option's invocation and help, joined over its wrapped lines
    for line in result.stdout.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line.strip()
    by_name = {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries}
    for entry in by_name.values():
        assert entry.count("(default") <= 1, entry  # ArgumentDefaultsHelpFormatter plus a hand-written one
        assert "(default: None)" not in entry and "(default: False)" not in entry, entry
    assert "(default: world/(tp*pp))" in by_name["--dp"] and "(default: 4)" in by_name["--microbatches"]
    assert "(default: 30)" in by_name["--epochs"] and "(default" not in by_name["--resume"]
    assert "(default: 0)" in by_name["--seed"] and "(default: 0)" in by_name["--zero"]  # 0 is not False


def test_resuming_with_another_seed_is_one_message_naming_the_flag(tmp_path):
    # Before: "skipping a checkpoint that does not load" for each checkpoint (its sampler has another
    # seed), as if the files were damaged, then "no checkpoint loads".
    args = ("--epochs", "1", "--hidden", "8", "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "5")
    assert run_one(*args).returncode == 0  # steps 5, 10 and 11 saved, with --seed 0
    again = run_one(*args, "--resume", "--seed", "3")
    shown = again.stdout + again.stderr
    assert again.returncode == 2, shown
    assert "skipping" not in shown and "Traceback" not in shown, shown
    assert f"the checkpoints in {tmp_path} were trained with --seed 0, and this run has --seed 3" in shown
    assert shown.count("--seed 0") == 2, shown  # one message: "trained with" and "resume with"
