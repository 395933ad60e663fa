"""The tools around a run's output, without MPI: the header's modes (``minidist_tools.header``), progress
that suits its stream (``minidist_tools.progress``), the run record (``minidist_tools.metrics``) and
``minidist plot`` (``minidist_tools.plot``)."""

from __future__ import annotations

import argparse
import io
import json

import pytest

from minidist_tools.header import environment_modes, header_lines, modes, plural
from minidist_tools.metrics import HEADER_KEYS, MetricsLog, max_rss_mib, read_run
from minidist_tools.progress import PlainProgress, progress


def flags(**given) -> argparse.Namespace:
    defaults = dict(tp=1, pp=1, cp=1, dp=4, fsdp=False, zero=0, comm_hook="none", autocast=None,
                    dtype="float32", recompute=False, grad_accum=1, sequence_parallel=False)  # fmt: skip
    return argparse.Namespace(**{**defaults, **given})


@pytest.fixture(autouse=True)
def quiet_environment(monkeypatch):
    for name in ("MINIDIST_DEBUG", "MINIDIST_TIMEOUT", "MINIDIST_WATCHDOG"):
        monkeypatch.delenv(name, raising=False)


def test_the_defaults_name_no_mode():
    assert modes(flags(), 4) == []
    assert header_lines("GPT: 10 parameters", []) == ["GPT: 10 parameters"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"fsdp": True}, "FSDP (5 units over 4 ranks)"),
        ({"fsdp": True, "tp": 2}, "FSDP (5 units over 2 ranks)"),
        ({"zero": 2}, "ZeRO stage 2"),
        ({"comm_hook": "bf16"}, "comm hook bf16"),
        ({"comm_hook": "powersgd", "powersgd_rank": 2}, "comm hook powersgd (rank 2)"),
        ({"autocast": "bfloat16", "dtype": "bfloat16"}, "mixed precision (bfloat16, float32 master weights)"),
        ({"dtype": "float64"}, "parameters in float64"),
        ({"recompute": True}, "recompute"),
        ({"tp": 2, "pp": 2}, "tp 2 x pp 2"),
        ({"pp": 2, "schedule": "1f1b", "microbatches": 4}, "pipeline 1f1b with 4 microbatches"),
        ({"tp": 2, "sequence_parallel": True}, "sequence parallel"),
        ({"grad_accum": 2}, "gradient accumulation 2"),
    ],
)
def test_every_non_default_mode_names_itself(given, expected):
    assert expected in modes(flags(**given), 4, fsdp_units=5 if given.get("fsdp") else None)


def test_the_safety_net_settings_name_themselves_when_not_default(monkeypatch):
    assert environment_modes({"MINIDIST_DEBUG": "0", "MINIDIST_WATCHDOG": "300"}) == []
    monkeypatch.setenv("MINIDIST_DEBUG", "1")
    monkeypatch.setenv("MINIDIST_TIMEOUT", "30")
    monkeypatch.setenv("MINIDIST_WATCHDOG", "0")
    found = modes(flags(fsdp=True), 4)
    assert found[-3:] == [
        "debug mode (MINIDIST_DEBUG=1)",
        "collective deadline 30 s (MINIDIST_TIMEOUT)",
        "watchdog deadline off (MINIDIST_WATCHDOG)",
    ]
    assert found[0] == "FSDP (over 4 ranks)"  # (units unknown: not named)
    assert header_lines("GPT", found)[1].startswith("modes: FSDP (over 4 ranks), debug mode")


def test_a_missing_flag_counts_as_off():
    assert modes(argparse.Namespace(recompute=True), 1) == ["recompute"]


def test_counts_take_the_right_number():
    assert [plural(1, "rank"), plural(4, "rank"), plural(2, "microbatch", "microbatches")] == [
        "1 rank",
        "4 ranks",
        "2 microbatches",
    ]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_file_gets_plain_lines_every_tenth_and_the_end():
    out = io.StringIO()
    bar = progress(total=25, enabled=True, desc="train", file=out)
    assert isinstance(bar, PlainProgress)
    for step in range(1, 26):
        bar.update()
        if step == 10:
            bar.write("step 10: loss 1.0")
    bar.close()
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    steps = [line.split()[2] for line in text.splitlines() if line.startswith("train: step")]
    assert steps == ["2/25", "4/25", "6/25", "8/25", "10/25", "12/25", "14/25", "16/25", "18/25", "20/25",
                     "22/25", "24/25", "25/25"]  # fmt: skip
    assert "step 10: loss 1.0" in text.splitlines()
    assert "train: step 10/25 (40%)" in text


def test_a_resumed_run_counts_on_and_a_disabled_one_prints_nothing():
    out = io.StringIO()
    bar = progress(total=10, initial=6, enabled=True, every=2, file=out)
    for _ in range(4):
        bar.update()
    bar.close()
    assert [line.split()[2] for line in out.getvalue().splitlines()] == ["8/10", "10/10"]
    silent = io.StringIO()
    bar = progress(total=10, enabled=False, file=silent)
    bar.update(10)
    bar.write("x")
    bar.close()
    assert silent.getvalue() == ""


def test_a_terminal_gets_the_live_bar():
    out = Terminal()
    bar = progress(total=3, enabled=True, file=out)
    assert not isinstance(bar, PlainProgress)
    bar.update(3)
    bar.close()
    assert "\r" in out.getvalue() and "3/3" in out.getvalue()


def test_the_record_is_a_header_then_steps_without_nulls(tmp_path):
    path = tmp_path / "runs" / "run.jsonl"
    log = MetricsLog(path)
    args = argparse.Namespace(fsdp=True, hidden=[32, 32], data=None)
    log.header("train_gpt.py", args, 4, {"dp": 4, "tp": 1}, ["FSDP (5 units over 4 ranks)"])
    log.step(10, loss=2.5, lr=1e-3, tokens_per_s=1200.0, max_rss_mib=max_rss_mib(), val_loss=None)
    log.step(20, loss=2.1, val_loss=2.3)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert tuple(records[0]) == HEADER_KEYS
    assert records[0]["kind"] == "header" and records[0]["label"] == "FSDP (5 units over 4 ranks)"
    assert records[0]["flags"] == {"data": None, "fsdp": True, "hidden": [32, 32]}
    assert records[0]["layout"] == {"dp": 4, "tp": 1} and records[0]["world_size"] == 4
    first, second = records[1:]
    assert first["kind"] == "step" and first["step"] == 10 and "val_loss" not in first
    assert set(first) == {"kind", "step", "wall_time", "loss", "lr", "tokens_per_s", "max_rss_mib"}
    assert first["max_rss_mib"] > 0  # (Linux reports it)
    assert second["val_loss"] == 2.3 and second["wall_time"] >= first["wall_time"] >= 0


def test_no_path_writes_nothing(tmp_path):
    log = MetricsLog(None)
    log.header("train_mlp.py", argparse.Namespace(), 1, {"dp": 1}, [])
    log.step(1, loss=1.0)
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_record_continues_its_time(tmp_path):
    path = tmp_path / "run.jsonl"
    lines = [
        {"kind": "header", "label": "a"},
        {"kind": "step", "step": 10, "wall_time": 5.0, "loss": 2.0},
        {"kind": "header", "label": "a (resumed)"},
        {"kind": "step", "step": 20, "wall_time": 4.0, "loss": 1.5},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    header, steps = read_run(path)
    assert header["label"] == "a"
    assert [(s["step"], s["wall_time"]) for s in steps] == [(10, 5.0), (20, 9.0)]


def test_a_file_that_is_not_a_record_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "header"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        read_run(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"kind": "step", "step": 1}\n')
    with pytest.raises(ValueError, match="no header"):
        read_run(empty)


def write_run(path, label, rate_key, scale):
    log = MetricsLog(path)
    log.header("train_gpt.py", argparse.Namespace(), 2, {"dp": 2}, [], label=label)
    for step in range(10, 60, 10):
        log.step(step, loss=3.0 - step / 50 * scale, **{rate_key: 1000.0 * scale})
    log.step(50, val_loss=2.2)
    return path


def test_plot_writes_a_png_of_the_runs(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from minidist_tools.plot import main

    runs = [write_run(tmp_path / "a.jsonl", "DDP", "tokens_per_s", 1.0),
            write_run(tmp_path / "b.jsonl", "FSDP", "tokens_per_s", 0.8)]  # fmt: skip
    out = tmp_path / "plots" / "cmp.png"
    assert main([str(p) for p in runs] + ["--out", str(out), "--title", "two runs"]) == 0
    assert out.stat().st_size > 0
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1100, 700)


def test_plot_refuses_a_missing_file_and_mismatched_labels(tmp_path, capsys):
    from minidist_tools.plot import main

    run = write_run(tmp_path / "a.jsonl", "MLP", "samples_per_s", 1.0)
    with pytest.raises(SystemExit) as missing:
        main([str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x.png")])
    assert missing.value.code == 2 and "nope.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit) as labels:
        main([str(run), "--label", "a", "--label", "b"])
    assert labels.value.code == 2 and "2 --label for 1 runs" in capsys.readouterr().err
