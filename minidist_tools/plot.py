"""``minidist plot RUN.jsonl [RUN2.jsonl ...] --out plot.png``: runs' loss and throughput, side by side.

Reads the records the examples write with ``--metrics FILE`` (``minidist_tools.metrics``) and draws four
panels: the training loss (and the validation loss, as markers) against the step and against the wall
time, and the throughput (tokens/s or samples/s) against both. Each run is one colour, labelled with its
header's label (``--label`` overrides them, in order). Against the step, runs of the same model and data
should lie on one curve; against the time, the faster layout reaches a loss first.

matplotlib is imported only when a plot is drawn, with the Agg backend (a file, no window): it is an
optional dependency (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minidist_tools.metrics import read_run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minidist plot", description="Plot the loss and throughput of runs recorded with --metrics FILE."
    )
    parser.add_argument(
        "runs", nargs="+", metavar="RUN.jsonl", help="record files of the examples' --metrics"
    )
    parser.add_argument("--out", default="plot.png", help="the image to write (PNG; default: plot.png)")
    parser.add_argument(
        "--label", action="append", default=None, help="a run's name (once per run, in order)"
    )
    parser.add_argument("--title", default=None, help="a title above the panels")
    return parser


def throughput_key(steps: list[dict]) -> str | None:
    """``tokens_per_s`` or ``samples_per_s``, whichever the run recorded (None: neither)."""
    for key in ("tokens_per_s", "samples_per_s"):
        if any(key in s for s in steps):
            return key
    return None


def draw(runs: list[tuple[str, list[dict]]], out: str | Path, title: str | None = None) -> Path:
    """Write the four panels of ``runs`` (``[(label, step records)]``) to ``out``; returns its path."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError('minidist plot needs matplotlib: pip install -e ".[bench]"') from error
    matplotlib.use("Agg")  # a file, no window: works without a display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    rate_names = set()
    for index, (label, steps) in enumerate(runs):
        colour = f"C{index % 10}"
        for column, x_key in enumerate(("step", "wall_time")):
            train = [(s[x_key], s["loss"]) for s in steps if "loss" in s]
            val = [(s[x_key], s["val_loss"]) for s in steps if "val_loss" in s]
            if train:
                axes[0, column].plot(*zip(*train), color=colour, label=f"{label} (train)")
            if val:
                axes[0, column].plot(*zip(*val), "o--", color=colour, label=f"{label} (val)", markersize=4)
            key = throughput_key(steps)
            rates = [(s[x_key], s[key]) for s in steps if key and key in s]
            if rates:
                rate_names.add(key.replace("_per_s", "/s"))
                axes[1, column].plot(*zip(*rates), color=colour, label=label)
    axes[0, 0].set_ylabel("loss")
    axes[1, 0].set_ylabel(" or ".join(sorted(rate_names)) or "throughput")
    for column, name in enumerate(("step", "wall time (s)")):
        axes[1, column].set_xlabel(name)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0, 1].legend(fontsize=8)
    axes[1, 1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """The command: 0 after writing the image, 2 for a missing or unreadable record file."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.label is not None and len(args.label) != len(args.runs):
        parser.error(f"{len(args.label)} --label for {len(args.runs)} runs: give one per run, or none")
    runs = []
    for index, path in enumerate(args.runs):
        try:
            header, steps = read_run(path)
        except (OSError, ValueError) as error:
            parser.exit(2, f"minidist plot: error: {error}\n")
        label = args.label[index] if args.label else header.get("label") or Path(path).stem
        runs.append((label, steps))
    out = draw(runs, args.out, args.title)
    print(f"wrote {out} ({len(runs)} run{'s' if len(runs) != 1 else ''})")
    return 0
