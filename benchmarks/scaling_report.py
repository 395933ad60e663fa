"""The scaling study's model, table and plot: ``scaling.py`` measures, this file predicts and reports.

    python benchmarks/scaling_report.py benchmarks/scaling.json     # table again, and the plot

**Predictions** (``minidist_tools.perfmodel.network``). For each link speed the link's alpha and beta are
fitted to the ring all-reduces measured between 2 nodes (``calibrate_link``); the same fit then
predicts the 4-node all-reduces (out of sample) and every DDP step: ``predict_nodes`` with

* the compute measured in the same job without DDP (all ranks at once, so the sharing of the cores
  is in it; the model's compute term is that time, not a FLOP count),
* the buckets DDP builds (``plan_buckets``), all-reduced after backward or during it,
* the algorithm ``dist.all_reduce(algorithm="auto")`` runs for each bucket's size and layout
  (``tuning.py``; Rabenseifner is priced as the ring, whose bytes it sends),
* fp16: half the bytes, two casts and float16 additions at the speeds measured in the job (NumPy
  does float16 in software, orders of magnitude slower per value than float32: that decides the
  variant on a CPU); PowerSGD: the factors' bytes, its rounds, its matmuls at the FLOP rate measured
  for their thin shapes and its error-feedback passes at gamma (``powersgd_compression``).

The error is ``predicted / measured - 1`` per point. The dashed curves of the plot extrapolate to 16
nodes with one core per node (the 1-rank compute divided by the nodes): what a real cluster would do.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

from minidist.distributed import tuning
from minidist.parallel.data_parallel.buckets import plan_buckets
from minidist_tools.perfmodel import network as pn
from minidist_tools.perfmodel import step as pm

VARIANT_ALGORITHM = {"ring": "ring", "hierarchical": "hierarchical"}
MODEL_ALGORITHMS = {"ring": "ring", "rabenseifner": "ring", "recursive_doubling": "recursive_doubling",
                    "hierarchical": "hierarchical"}  # fmt: skip


def _rows(study: dict, nodes: int, per_node: int) -> list[dict]:
    return [r for r in study["rows"] if r["nodes"] == nodes and r["ranks_per_node"] == per_node]


def calibrations(study: dict) -> dict[str, dict]:
    """Link name -> the 2-node fit (``alpha``, ``beta``, ``errors``) and its errors on 4 nodes."""
    out = {}
    for row in _rows(study, 2, 1):
        sizes, seconds = np.array(row["sweep"]).T
        cal = pn.calibrate_link(sizes, seconds, nodes=2, gamma=row["gamma"])
        entry = {"alpha": cal.alpha, "beta": cal.beta, "errors": list(cal.errors), "errors_4": []}
        for four in _rows(study, 4, 1):
            if four["link"] == row["link"]:
                net = pn.Network(0.0, 0.0, cal.alpha, cal.beta, four["gamma"])
                sizes4, seconds4 = np.array(four["sweep"]).T
                predicted = [pn.flat_all_reduce_time(s, 4, 1, net) for s in sizes4]
                entry["errors_4"] = pn.relative_errors(predicted, list(seconds4))
        out[row["link"]] = entry
    return out


def auto_algorithm(nbytes: float, nodes: int, per_node: int) -> str:
    """The name of what ``dist.all_reduce(algorithm="auto")`` runs, as the model knows it."""
    n = nodes * per_node
    if n == 1:
        return "ring"
    if nodes > 1 and per_node > 1:
        chosen = tuning.choose_across_nodes(int(nbytes), nodes, n)
    else:
        chosen = tuning.choose("all_reduce", int(nbytes), n)
    return MODEL_ALGORITHMS.get(chosen, "ring")


def predict_row(row: dict, variant: str, cal: dict | None, config: dict, compute_s: float | None = None):
    """``perfmodel_network.predict_nodes`` for one measured (row, variant), or None without a link fit."""
    nodes, per_node = row["nodes"], row["ranks_per_node"]
    if nodes > 1 and cal is None:
        return None
    shapes = [tuple(s) for s in row["shapes"]]
    sizes = [4 * math.prod(s) for s in shapes]
    params = sum(sizes) / 4
    plan = plan_buckets(sizes, [np.float32] * len(sizes), config["bucket_mb"] * 2**20)
    buckets = [sum(sizes[i] for i in idx) for idx in plan]
    work = pm.Workload(params=params, global_batch=config["batch"])
    compute = row["compute_s"] if compute_s is None else compute_s
    flops = work.flops_per_step / row["ranks"] / compute  # so that the model's compute is the measured one
    net = pn.Network(
        row.get("intra_alpha", 0.0), row.get("intra_beta", 0.0),
        cal["alpha"] if cal else 0.0, cal["beta"] if cal else 0.0, row["gamma"],
    )  # fmt: skip
    compression = None
    if variant == "fp16":  # NumPy's float16 casts and additions (measured) are the hook's compute
        compression = pn.fp16_compression(sum(buckets), row.get("fp16_cast_s_per_byte", row["gamma"]))
        net = dataclasses.replace(net, gamma=row.get("gamma_fp16", row["gamma"]))
    elif variant == "powersgd":
        thin = row.get("powersgd_flops", flops)
        compression = pn.powersgd_compression(
            shapes, config["powersgd_rank"], thin, seconds_per_byte=row["gamma"]
        )
    ratio = compression.ratio * compression.rounds if compression else 1.0
    algorithm = VARIANT_ALGORITHM.get(variant) or auto_algorithm(max(buckets) / ratio, nodes, per_node)
    overlap = variant != "after"
    return pn.predict_nodes(work, flops, net, nodes, per_node, overlap, buckets, algorithm, compression)


def predict_all(study: dict) -> list[dict]:
    """One entry per measured (row, variant): measured and predicted step, throughput, efficiency, error."""
    cals = calibrations(study)
    base = _rows(study, 1, 1)[0]["steps"]["after"]  # one rank, no communication
    out = []
    for row in study["rows"]:
        for variant, measured in row["steps"].items():
            pred = predict_row(row, variant, cals.get(row["link"]), study["config"])
            throughput = study["config"]["batch"] / measured
            out.append({
                "nodes": row["nodes"], "ranks_per_node": row["ranks_per_node"], "link": row["link"],
                "variant": variant, "measured_s": measured, "samples_per_s": throughput,
                "efficiency": throughput / (row["ranks"] * study["config"]["batch"] / base),
                "predicted_s": pred.step if pred else None,
                "error": pred.step / measured - 1 if pred else None,
            })  # fmt: skip
    return out


def extrapolate(study: dict, link: str, nodes: list[int]) -> list[float]:
    """Predicted samples/s of DDP with overlap on ``nodes`` nodes of one core each on ``link``."""
    cal = calibrations(study).get(link)
    one = _rows(study, 1, 1)[0]
    template = next(r for r in study["rows"] if r["nodes"] == 2 and r["ranks_per_node"] == 1)
    out = []
    for k in nodes:
        row = dict(template, nodes=k, ranks=k, gamma=one["gamma"])
        if k == 1:
            row = dict(one)
        pred = predict_row(row, "overlap", cal, study["config"], compute_s=one["compute_s"] / k)
        out.append(study["config"]["batch"] / pred.step)
    return out


def markdown(study: dict) -> str:
    lines = ["| link | alpha | fitted bandwidth | fit error, 2 nodes | predicted 4-node all-reduce error |",
             "|---|---:|---:|---|---|"]  # fmt: skip
    for link, cal in calibrations(study).items():
        errs = ", ".join(f"{e:+.0%}" for e in cal["errors"])
        errs4 = ", ".join(f"{e:+.0%}" for e in cal["errors_4"]) or "-"
        rate = f"{8 / cal['beta'] / 1e6:,.0f} Mbit/s"
        lines.append(f"| {link} | {cal['alpha'] * 1e6:.0f} us | {rate} | {errs} | {errs4} |")
    lines += ["", "| nodes x ranks | link | variant | step | samples/s | efficiency | predicted | error |",
              "|---|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for p in study["predictions"]:
        pred = f"{p['predicted_s'] * 1e3:.0f} ms" if p["predicted_s"] else "-"
        err = f"{p['error']:+.0%}" if p["error"] is not None else "-"
        where = f"{p['nodes']} x {p['ranks_per_node']} | {p['link']} | {p['variant']}"
        lines.append(
            f"| {where} | {p['measured_s'] * 1e3:.0f} ms | {p['samples_per_s']:.0f} | {p['efficiency']:.0%}"
            f" | {pred} | {err} |"
        )
    errors = [abs(p["error"]) for p in study["predictions"] if p["error"] is not None]
    load = f"load average {study['load_before'][0]:.1f} before, {study['load_after'][0]:.1f} after"
    lines += ["", f"Model error over {len(errors)} steps: median {np.median(errors):.0%}, max "
              f"{max(errors):.0%}. {study['cores']} cores; {load}; {study['seconds']:.0f} s."]  # fmt: skip
    return "\n".join(lines)


def _key(p: dict) -> tuple:
    return p["nodes"], p["ranks_per_node"], p["link"], p["variant"]


def plot(study: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    links = [link for link in ("100mbit", "1gbit", "10gbit", "unshaped") if link in calibrations(study)]
    far = [1, 2, 4, 8, 16]
    for i, link in enumerate(links):
        color = f"C{i}"
        left.plot(far, extrapolate(study, link, far), "--", color=color, label=f"{link}: model, 1 core/node")
        points = [p for p in study["predictions"] if p["variant"] == "overlap" and p["ranks_per_node"] == 1
                  and (p["link"] == link or p["nodes"] == 1)]  # fmt: skip
        points.sort(key=lambda p: p["nodes"])
        left.plot([p["nodes"] for p in points], [p["samples_per_s"] for p in points], "o-", color=color,
                  label=f"{link}: measured")  # fmt: skip
    base = next(p for p in study["predictions"] if p["nodes"] == 1 and p["ranks_per_node"] == 1)
    left.plot(far, [base["samples_per_s"] * k for k in far], ":", color="grey", label="perfect scaling")
    left.set(xscale="log", yscale="log", xlabel="nodes (1 rank each)", ylabel="samples/s",
             title="DDP with overlap: where adding nodes stops paying off")  # fmt: skip
    left.set_xticks(far, [str(k) for k in far])
    left.legend(fontsize=7)
    variants = ["after", "overlap", "fp16", "powersgd", "ring", "hierarchical"]
    groups = [(k, r) for k, r in ((2, 1), (4, 1), (2, 2))]
    width = 0.8 / len(variants)
    for j, variant in enumerate(variants):
        xs, ys = [], []
        for g, (k, r) in enumerate(groups):
            for i, link in enumerate(links):
                key = (k, r, link, variant)
                hit = [p for p in study["predictions"] if _key(p) == key]
                if hit:
                    xs.append(g * (len(links) + 1) + i + j * width)
                    ys.append(hit[0]["samples_per_s"])
        if xs:
            right.bar(xs, ys, width=width, label=variant)
    ticks = [g * (len(links) + 1) + i + 0.4 for g in range(len(groups)) for i in range(len(links))]
    right.set_xticks(ticks, [f"{k}x{r} {link}" for k, r in groups for link in links], fontsize=7, rotation=45)
    right.set(ylabel="samples/s (measured)", title="what overlap, compression and hierarchy buy")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    data = json.loads(Path(sys.argv[1]).read_text())
    print(markdown(data))
    plot(data, Path(sys.argv[1]).with_suffix(".png"))
