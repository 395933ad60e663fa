"""``minidist checkpoint info DIR [--verify]`` and ``minidist checkpoint interval``, without MPI.

``info`` lists the checkpoints of a root (or describes one) and, with ``--verify``, checks every file's
size and sha256; ``interval`` is the checkpoint-interval calculator of ``checkpoint_interval.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minidist.checkpoint import atomic, file_checks
from minidist.checkpoint import format as fmt
from minidist.checkpoint.errors import CheckpointError
from minidist_tools import checkpoint_interval


def main(argv: list[str] | None = None) -> int:
    """``minidist checkpoint info|interval ...``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="minidist checkpoint", description="list, verify and plan checkpoints"
    )
    actions = parser.add_subparsers(dest="checkpoint_command", required=True, metavar="{info,interval}")
    listing = actions.add_parser("info", help="list a checkpoint root, or describe one checkpoint")
    listing.add_argument("directory", help="a checkpoint root (holding 'latest') or one step_<n> folder")
    listing.add_argument("--verify", action="store_true", help="also check every file's size and sha256")
    checkpoint_interval.add_parser(actions)
    args = parser.parse_args(argv)
    if args.checkpoint_command == "interval":
        return checkpoint_interval.run(args)
    return info(Path(args.directory), verify=args.verify)


def info(directory: Path, verify: bool = False) -> int:
    """Print the checkpoints under ``directory`` and their tensors (``verify``: also check each file's
    size and sha256); returns the exit code, 1 if something is missing, damaged or fails to verify."""
    status = 0
    if directory.exists() and not directory.is_dir():
        print(f"error: {directory}: this is a file; pass a checkpoint root or a step_<n> folder")
        return 1
    try:
        folders = atomic.list_checkpoints(directory)
        latest = atomic.read_latest(directory)
    except CheckpointError as err:  # an unreadable or non-UTF-8 'latest': still list what is there
        print(f"error: {err}")
        folders, latest, status = atomic.list_checkpoints(directory), None, 1
    except OSError as err:
        print(f"error: {directory}: cannot list it ({err})")
        return 1
    if folders:
        print(f"checkpoints in {directory} (latest -> {latest}):")
        for step, path in folders:
            print(
                f"  {'*' if path.name == latest else ' '} {path.name}  step {step}  {_status(path, verify)}"
            )
        print()
    try:
        folder = atomic.resolve(directory)
        manifest = fmt.read_manifest(folder)
    except CheckpointError as err:
        print(f"error: {err}")
        return 1
    print(summary(folder, manifest))
    if verify:
        problems = _problems(folder, manifest)
        print("\nverify: " + ("all files match their checksums" if not problems else "; ".join(problems)))
        status = 1 if problems else status
    return status


def _status(folder: Path, verify: bool) -> str:
    try:
        manifest = fmt.read_manifest(folder)
    except CheckpointError as err:
        return f"BROKEN ({err.problem})"
    size = sum(f["bytes"] for f in manifest["files"].values()) / 2**20
    text = f"{len(manifest['files'])} files, {size:.2f} MiB"
    if verify:
        problems = _problems(folder, manifest)
        text += ", verified" if not problems else f", BROKEN ({problems[0]})"
    return text


def _problems(folder: Path, manifest: dict) -> list[str]:
    problems = []
    for name in sorted(manifest["files"]):
        try:
            file_checks.verify_file(folder, name, manifest)
        except CheckpointError as err:
            problems.append(str(err))
    return problems


def summary(folder: Path, manifest: dict) -> str:
    """A human-readable table of a checkpoint (used by ``minidist checkpoint info``)."""
    mesh = manifest["mesh"]
    total = sum(f["bytes"] for f in manifest["files"].values())
    opt = manifest.get("optimizer") or {}
    lines = [
        f"checkpoint  {folder}",
        f"step        {manifest['step']}   (format v{manifest['format_version']}, "
        f"minidist {manifest.get('minidist_version', '?')})",
        f"mesh        dp={mesh['dp']} tp={mesh['tp']} pp={mesh['pp']} cp={mesh.get('cp', 1)} "
        f"(world size {mesh['world_size']})",
        f"files       {len(manifest['files'])} shard files, {total / 2**20:.2f} MiB",
        f"optimizer   {opt.get('class', 'none')}, step_count={opt.get('step_count', '-')}",
        f"extra       {json.dumps(manifest.get('extra'))}",
        "",
        f"{'tensor':<44} {'global shape':<16} {'dtype':<9} {'tp_dim':<6} shards (their sizes along tp_dim)",
    ]
    for key, t in sorted(manifest["tensors"].items()):
        shape = "x".join(map(str, t["global_shape"])) or "()"
        tp_dim, pieces = "-", ""
        if t["tp_dim"] is not None:
            stride = t.get("tp_stride", 1)
            tp_dim = str(t["tp_dim"]) + (f"/s{stride}" if stride > 1 else "")  # "0/s3": strided
            pieces = " (" + "+".join(str(s["shape"][t["tp_dim"]]) for s in t["shards"]) + ")"
        lines.append(f"{key:<44} {shape:<16} {t['dtype']:<9} {tp_dim:<6} {len(t['shards'])}{pieces}")
    return "\n".join(lines)


def seed_mismatch(root: str | Path, seed: int) -> str | None:
    """Why no checkpoint under ``root`` can resume a run with ``seed``, or None.

    A sampler saved with another seed would draw another order, so ``checkpoint.load_latest(fallback=True)``
    refuses each checkpoint in turn, reporting every one as "a checkpoint that does not load": a damaged
    file is not the cause, the flag is. When every readable checkpoint's sampler has one other seed (and
    none has ``seed``), this says so once, naming the flag to give. Unreadable manifests are left to
    ``load_latest``, which reports them; a root without checkpoints gives None.
    """
    seeds = set()
    try:
        folders = atomic.list_checkpoints(Path(root))
    except (CheckpointError, OSError):
        return None
    for _, folder in folders:
        try:
            ranks = fmt.read_manifest(folder).get("ranks") or []
        except (CheckpointError, OSError, ValueError):
            continue
        seeds |= {
            r["sampler"]["seed"]
            for r in ranks
            if isinstance(r.get("sampler"), dict) and "seed" in r["sampler"]
        }
    if not seeds or seed in seeds:
        return None
    saved = ", ".join(str(s) for s in sorted(seeds))
    return (
        f"the checkpoints in {root} were trained with --seed {saved}, and this run has --seed {seed}: "
        f"its data order would differ from theirs; resume with --seed {saved}, or start afresh in another "
        "--checkpoint-dir"
    )
