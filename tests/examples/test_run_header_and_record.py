"""What the examples say about a run, on real ranks: a header that names every mode that is on, progress
without ``\\r`` frames when stdout is a file, and the run record of ``--metrics FILE``."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest
from mpi_utils import REPO, mpi_env, mpiexec_path

from minidist_tools.metrics import HEADER_KEYS

GPT = REPO / "examples" / "train_gpt.py"
MLP = REPO / "examples" / "train_mlp.py"
TINY_GPT = (
    "--n-layer", "2", "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--batch-size", "8",
    "--eval-iters", "1", "--sample-tokens", "5", "--log-interval", "5", "--eval-interval", "10",
)  # fmt: skip


def to_file(
    n: int, script, *args: str, log, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``mpiexec -n n python script args > log 2>&1``: stdout is a file, as in a user's log."""
    with open(log, "w") as out:
        result = subprocess.run(
            [mpiexec_path(), "-n", str(n), sys.executable, str(script), *args],
            stdout=out, stderr=subprocess.STDOUT, env=mpi_env(env), cwd=REPO, timeout=240,
        )  # fmt: skip
    return result


def records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.mpi
def test_gpt_fsdp_in_debug_mode_names_both_logs_without_carriage_returns_and_records_the_run(tmp_path):
    log, metrics = tmp_path / "log.txt", tmp_path / "run.jsonl"
    result = to_file(4, GPT, *TINY_GPT, "--fsdp", "--max-iters", "20", "--metrics", str(metrics), log=log,
                     env={"MINIDIST_DEBUG": "1"})  # fmt: skip
    text = log.read_text()
    assert result.returncode == 0, text
    assert "\r" not in text and "\x1b" not in text, text[:2000]
    lines = text.splitlines()
    # 2 Blocks and the root unit; over the 4 ranks. Before: the same banner as DDP, and debug mode silent.
    assert re.fullmatch(r"GPT: [1-9][\d,]* parameters, \d+ characters, 4 ranks \(dp 4\)", lines[0]), lines[:3]
    assert lines[1] == "modes: FSDP (3 units over 4 ranks), debug mode (MINIDIST_DEBUG=1)", lines[:3]
    progress = [line for line in lines if line.startswith("train: step")]
    assert [line.split()[2] for line in progress] == ["2/20", "4/20", "6/20", "8/20", "10/20", "12/20",
                                                       "14/20", "16/20", "18/20", "20/20"], text  # fmt: skip
    header, *steps = records(metrics)
    assert tuple(header) == HEADER_KEYS and header["kind"] == "header" and header["script"] == "train_gpt.py"
    assert header["layout"] == {"dp": 4, "tp": 1, "pp": 1, "cp": 1} and header["world_size"] == 4
    assert header["modes"] == ["FSDP (3 units over 4 ranks)", "debug mode (MINIDIST_DEBUG=1)"]
    assert header["flags"]["fsdp"] is True and header["flags"]["max_iters"] == 20
    logged = [s for s in steps if "loss" in s]
    evaluated = [s for s in steps if "val_loss" in s]
    assert [s["step"] for s in logged] == [5, 10, 15, 20] and [s["step"] for s in evaluated] == [10, 20]
    for s in logged:
        assert {"kind", "step", "wall_time", "loss", "lr", "tokens_per_s", "mfu", "max_rss_mib"} <= set(s)
        assert s["tokens_per_s"] > 0 and s["max_rss_mib"] > 0 and 0 < s["lr"] <= 2e-3
    assert all(b["wall_time"] >= a["wall_time"] for a, b in zip(steps, steps[1:]))
    # The log's own lines agree with the record.
    assert (
        f"step    20: train loss {evaluated[-1]['train_loss']:.4f}, val loss {evaluated[-1]['val_loss']:.4f}"
        in text
    )


@pytest.mark.mpi
def test_mlp_names_its_modes_and_records_each_epoch(tmp_path):
    log, metrics = tmp_path / "log.txt", tmp_path / "run.jsonl"
    flags = ("--epochs", "2", "--hidden", "32", "--zero", "1", "--recompute", "--metrics", str(metrics))
    result = to_file(2, MLP, *flags, log=log, env={"MINIDIST_WATCHDOG": "60"})
    text = log.read_text()
    assert result.returncode == 0, text
    assert "\r" not in text, text[:2000]
    lines = text.splitlines()
    assert re.fullmatch(r"MLP 64-32-10 on digits \([\d,]+ training samples\), 2 ranks \(dp 2 x tp 1 x pp 1\)",
                        lines[0]), lines[:3]  # fmt: skip
    assert lines[1] == "modes: ZeRO stage 1, recompute, watchdog deadline 60 s (MINIDIST_WATCHDOG)", lines[:3]
    header, *epochs = records(metrics)
    assert header["script"] == "train_mlp.py" and header["layout"] == {"dp": 2, "tp": 1, "pp": 1}
    assert len(epochs) == 2 and epochs[1]["step"] == 2 * epochs[0]["step"]
    for epoch in epochs:
        assert {"step", "wall_time", "loss", "accuracy", "lr", "samples_per_s", "max_rss_mib"} <= set(epoch)
        assert 0 < epoch["accuracy"] <= 1 and epoch["samples_per_s"] > 0


@pytest.mark.mpi
def test_minidist_plot_draws_two_recorded_runs(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    runs = []
    for name, flags in (("ddp", ()), ("zero", ("--zero", "1"))):
        path = tmp_path / f"{name}.jsonl"
        to_file(
            2, MLP, "--epochs", "2", "--hidden", "32", "--metrics", str(path), *flags, log=tmp_path / "log"
        )
        runs.append(str(path))
    out = tmp_path / "cmp.png"
    done = subprocess.run([sys.executable, "-m", "minidist_cli", "plot", *runs, "--out", str(out)],
                          capture_output=True, text=True, env=mpi_env(), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {out} (2 runs)"
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1100, 700)


def test_a_terminal_gets_the_live_bar_and_no_plain_lines(tmp_path):
    """The same example on a terminal (a pseudo-terminal here, as a user's shell gives it): tqdm's bar
    redraws itself with ``\\r`` in place, and no plain ``train: step`` line is printed."""
    main, sub = pty.openpty()
    # A new pseudo-terminal is 0 x 0 characters, and tqdm draws a bar of width 0 (nothing): give it a
    # terminal's usual 24 rows of 80 columns.
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with subprocess.Popen(
        [sys.executable, str(MLP), "--epochs", "1", "--hidden", "32"],
        stdout=sub, stderr=sub, env=mpi_env(), cwd=REPO,
    ) as proc:  # fmt: skip
        os.close(sub)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the terminal closed: the run ended (Linux raises EIO here)
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=120) == 0
    os.close(main)
    text = b"".join(chunks).decode()
    assert "\r" in text and re.search(r"\| \d+/\d+ ", text), text[:2000]
    assert "train: step" not in text, text[:2000]
