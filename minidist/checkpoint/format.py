"""What a checkpoint is on disk: ``manifest.json``, which describes it all, and the shard files.

``manifest.json`` (written by rank 0 after every rank's shard is on disk) holds::

    format, format_version        "minidist-checkpoint", FORMAT_VERSION
    step, extra, minidist_version, created (Unix time)
    mesh                          {"dp", "tp", "pp", "cp", "world_size"} of the run that saved
    files                         {file name: {"sha256": hex digest, "bytes": size}}
    tensors                       {key: {"name", "kind", "state", "global_shape", "dtype", "tp_dim",
                                         "tp_stride", "shards": [{"file", "tp_rank", "shape"}, ...]}}
    optimizer                     {"class", "defaults", "step_count", "scalars": {name: {key: int}},
                                   "param_groups": [{hyperparameter: value}] (each group's current
                                   values, e.g. a scheduled lr; absent in older checkpoints)}
                                  (null when no optimizer was saved)
    ranks                         per world rank: {"rank", "coords" (dp, tp, pp, cp rank), "rng",
                                  "tp_rng", "sampler"}

A tensor key is ``model/<global name>`` or ``optim/<global name>/<state name>`` (``exp_avg``, ...);
the same key names the array inside each shard file. ``tp_dim`` says along which axis the ``tp``
shards are pieces of the global tensor (null: replicated, one shard), ``tp_stride`` how they were cut
(split.py's rule: shard i is piece i of each of ``tp_stride`` equal blocks; pieces may be uneven,
the first ones one longer). ``global_shape`` is the sum of the pieces, never a local shape times tp.
``file_checks.py`` checks every field before anything reads it.

Format version 2 added ``tp_stride``, ``mesh["cp"]`` and the 4th coordinate, and uneven pieces;
``read_manifest`` reads a version-1 manifest as version 2 with stride 1 and cp 1 (what it meant).
A version-1 reader refuses version 2, rather than concatenating strided pieces into a wrong tensor.

A shard file is safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian
header length, a JSON header ``{key: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}}``,
then the raw little-endian tensor bytes. We let the library do the encoding and decoding, which is
what the project's rule asks for: file formats come from a well-kept library, even when a
hand-written streaming writer would save a copy. What is ours is around it: the fsync that makes the
file durable before the checkpoint is committed (``atomic.write_shard``), and the sha256 that makes
a damaged file an error instead of a silently different model (``file_checks.read_shard``).

Everything here is data: loading never runs code (JSON and safetensors only, no pickle).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import minidist  # for its __version__ (the package is always imported before its submodules: no cycle)
from minidist.checkpoint import file_checks
from minidist.checkpoint.atomic import MANIFEST
from minidist.checkpoint.errors import CheckpointError, NewerFormatError

FORMAT = "minidist-checkpoint"
FORMAT_VERSION = 2


def model_key(name: str) -> str:
    """The manifest and shard key of model parameter ``name`` (its full-model name)."""
    return f"model/{name}"


def optim_key(name: str, state: str) -> str:
    """The key of optimizer state ``state`` (e.g. ``"exp_avg"``) of parameter ``name``."""
    return f"optim/{name}/{state}"


def build_manifest(
    records: list[dict], mesh: dict[str, int], step: int, extra: Any, header: dict[str, Any] | None
) -> dict[str, Any]:
    """The manifest of the checkpoint that the ranks' ``records`` describe (gathered by ``save``: what
    each rank wrote, its optimizer counters, generator and sampler states), for the run of ``mesh``
    (``Layout.describe()``) and the optimizer ``header`` (``optim_state.header``, or None)."""
    files, tensors = {}, {}
    for r in records:
        w = r["written"]
        if w is None:
            continue
        files[w["file"]] = {"sha256": w["sha256"], "bytes": w["bytes"]}
        for key, e in w["entries"].items():
            t = tensors.setdefault(
                key,
                {k: e[k] for k in ("name", "kind", "state", "dtype", "tp_dim", "tp_stride")} | {"shards": []},
            )
            t["shards"].append({"file": w["file"], "tp_rank": e["tp_rank"], "shape": e["shape"]})
    for key, t in tensors.items():
        t["shards"].sort(key=lambda s: -1 if s["tp_rank"] is None else s["tp_rank"])
        t["global_shape"] = _full_shape(t)
        file_checks.check_pieces(key, t)  # split.py's pieces of that shape, or reshard would go wrong
    if header is not None:
        header = dict(header, scalars={})
        for r in records:
            header["scalars"].update(r["scalars"])
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "minidist_version": minidist.__version__,
        "created": time.time(),
        "step": step,
        "extra": extra,
        "mesh": mesh,
        "files": files,
        "tensors": tensors,
        "optimizer": header,
        "ranks": [{k: r[k] for k in ("rank", "coords", "rng", "tp_rng", "sampler")} for r in records],
    }


def _full_shape(t: dict[str, Any]) -> list[int]:
    """The full shape of tensor ``t`` from its pieces: their sum along ``tp_dim`` (uneven splits)."""
    shapes = [s["shape"] for s in t["shards"]]
    full = list(shapes[0])
    if t["tp_dim"] is not None:
        full[t["tp_dim"]] = sum(shape[t["tp_dim"]] for shape in shapes)
    return full


def dumps(manifest: dict[str, Any]) -> bytes:
    """The manifest as UTF-8 JSON bytes with sorted keys, so equal manifests give equal bytes."""
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


def read_manifest(folder: Path) -> dict[str, Any]:
    """Read and check ``folder/manifest.json``.

    Raises ``CheckpointError`` naming the file if it is missing, unreadable, not UTF-8 JSON, not a
    minidist checkpoint, lacks a field or holds a malformed one (``file_checks.check_manifest``), and
    ``NewerFormatError`` (a ``CheckpointError``) if a newer format version wrote it.
    """
    path = folder / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError("manifest missing: not a committed checkpoint folder", path) from None
    except OSError as err:
        raise CheckpointError(f"manifest unreadable ({err})", path) from None
    try:
        manifest = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(f"manifest is not UTF-8 text (corrupt?): {err}", path) from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"manifest is not valid JSON (truncated or corrupt?): {err}", path) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"not a {FORMAT} manifest", path)
    for field in ("format_version", "step", "mesh", "files", "tensors", "ranks"):
        if field not in manifest:
            raise CheckpointError(f"manifest lacks the field {field!r} (corrupt?)", path)
    version = manifest["format_version"]
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise NewerFormatError(
            f"checkpoint format version {version} is newer than this minidist understands "
            f"(<= {FORMAT_VERSION}); upgrade minidist to load it",
            path,
        )
    file_checks.check_manifest(manifest, path)
    # A version-1 manifest, read as version 2: it knew no strides and no context parallelism.
    manifest["mesh"].setdefault("cp", 1)
    for t in manifest["tensors"].values():
        t.setdefault("tp_dim", None)  # as file_checks.check_manifest read a missing one
        t.setdefault("tp_stride", 1)
    return manifest


def verify_folder(folder: Path) -> str | None:
    """The problem with an existing checkpoint folder (manifest, then every file), or None if it verifies.

    ``save`` runs it on rank 0 alone, when it meets a folder of the same step (rare). Raises
    ``NewerFormatError`` for a checkpoint of a newer format (not damaged: never moved aside).
    """
    try:
        manifest = read_manifest(folder)
        for file in sorted(manifest["files"]):
            file_checks.verify_file(folder, file, manifest)
    except NewerFormatError:
        raise
    except CheckpointError as err:
        return str(err)
    return None
