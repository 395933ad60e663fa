"""benchmarks/gpu_check.py's summary: ``summary.json`` (everything) and ``summary.md`` (the tables that go
into benchmarks/README.md, "GPU")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _step_table(step: dict[str, Any]) -> list[str]:
    cfg = step.get("config", {})
    lines = [
        f"GPT step on {step.get('device')}: {cfg.get('n_layer')} layers x {cfg.get('n_embd')} wide, "
        f"{cfg.get('n_head')} heads, block {cfg.get('block_size')}, batch {cfg.get('batch_size')}, AdamW "
        "(median of the timed steps after warm-up, each ended by a device synchronisation)",
        "",
        "| precision | minidist ms/step | torch ms/step | minidist / torch time | minidist tokens/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    precisions = sorted({key.split("_", 1)[1] for key in step if key.startswith(("minidist_", "torch_"))})
    for precision in precisions:
        ours, theirs = step.get(f"minidist_{precision}", {}), step.get(f"torch_{precision}", {})

        def cell(result: dict[str, Any]) -> str:
            return f"{result['median_s'] * 1e3:.2f}" if "median_s" in result else "n/a"

        both = "median_s" in ours and "median_s" in theirs
        ratio = f"{ours['median_s'] / theirs['median_s']:.2f}" if both else "n/a"
        tokens = f"{ours['tokens_per_s']:,.0f}" if "tokens_per_s" in ours else "n/a"
        lines.append(f"| {precision} | {cell(ours)} | {cell(theirs)} | {ratio} | {tokens} |")
    for key, result in sorted(step.items()):
        if isinstance(result, dict) and "error" in result:
            lines.append(f"\n{key}: not measured ({result['error']})")
    return lines


def _comm_table(comm: dict[str, Any]) -> list[str]:
    aware = "yes" if comm.get("cuda_aware") else f"not available: {comm.get('cuda_aware_reason')}"
    lines = [
        f"all_reduce (sum, float32) on {comm.get('ranks')} ranks, {comm.get('device')}, median us (slowest "
        f"rank); CUDA-aware MPI: {aware}",
        "",
        "| size | staged through host (minidist) | host arrays (MPI alone) | staging overhead | CUDA-aware |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in comm.get("rows", []):
        staged, host = row["staged_s"] * 1e6, row["host_s"] * 1e6
        aware_cell = f"{row['cuda_aware_s'] * 1e6:.0f}" if "cuda_aware_s" in row else "n/a"
        cells = [_size(row["bytes"]), f"{staged:.0f}", f"{host:.0f}", f"{staged - host:+.0f}", aware_cell]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_markdown(summary: dict[str, Any]) -> str:
    env = summary.get("environment", {})
    verdict = "ALL CHECKS PASSED" if summary["passed"] else "A CHECK FAILED"
    kind = "dry run on the CPU (tiny sizes; not a GPU result)" if summary["dry_run"] else "GPU run"
    lines = [
        f"# gpu_check: {verdict}",
        "",
        f"{summary['date_utc']} UTC, {kind}, {summary['seconds']} s. The 2-rank runs put both ranks on "
        "GPU rank mod n_gpus (one GPU: both share it).",
        "",
        "| item | value |",
        "| --- | --- |",
        *(f"| {key} | {value} |" for key, value in env.items()),
        "",
        "| check | result | seconds | detail |",
        "| --- | --- | ---: | --- |",
        *(
            f"| {c['name']} | {c['status']} | {c['seconds']} | {c['detail'].replace('|', '/')[:300]} |"
            for c in summary["checks"]
        ),
    ]
    figures = summary.get("figures", {})
    if "gpt-step" in figures:
        lines += ["", *_step_table(figures["gpt-step"])]
    if "all-reduce" in figures:
        lines += ["", *_comm_table(figures["all-reduce"])]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    """``out/summary.json`` and ``out/summary.md`` from the script's summary dict."""
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "summary.md").write_text(render_markdown(summary))
