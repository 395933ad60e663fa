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
``schema.py`` checks every field before anything reads it.

Format version 2 added ``tp_stride``, ``mesh["cp"]`` and the 4th coordinate, and uneven pieces;
``read_manifest`` reads a version-1 manifest as version 2 with stride 1 and cp 1 (what it meant).
A version-1 reader refuses version 2, rather than concatenating strided pieces into a wrong tensor.

A shard file is safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian
header length, a JSON header ``{key: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}}``,
then the raw little-endian tensor bytes. We let the library do the encoding and decoding, which is
what the project's rule asks for: file formats come from a well-kept library, even when a
hand-written streaming writer would save a copy. What is ours is around it: the sha256 that makes a
damaged file an error instead of a silently different model, and the fsync that makes the file
durable before the checkpoint is committed (``atomic.py``).

Everything here is data: loading never runs code (JSON and safetensors only, no pickle).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from minidist.checkpoint.atomic import MANIFEST, new_file_mode
from minidist.checkpoint.errors import CheckpointError, NewerFormatError
from minidist.checkpoint.schema import validate

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
    import minidist  # noqa: PLC0415  (the version, without an import cycle at module load)

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
        t["global_shape"] = _full_shape(key, t)
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


def _full_shape(key: str, t: dict[str, Any]) -> list[int]:
    """The full shape of tensor ``t`` from its pieces: their sum along ``tp_dim`` (uneven splits).

    Raises ``CheckpointError`` unless the pieces are exactly split.py's pieces of that full shape
    (a layer that cut its weight by another rule would be resharded wrongly).
    """
    from minidist.checkpoint.layout import piece_shape  # noqa: PLC0415  (layout imports MPI lazily)

    shapes = [s["shape"] for s in t["shards"]]
    full = list(shapes[0])
    if t["tp_dim"] is not None:
        full[t["tp_dim"]] = sum(shape[t["tp_dim"]] for shape in shapes)
        try:
            expected = [
                piece_shape(full, t["tp_dim"], len(shapes), i, t["tp_stride"]) for i in range(len(shapes))
            ]
        except ValueError as err:
            expected = [str(err)]
        if expected != shapes:
            raise CheckpointError(
                f"tensor {key!r}: the tp ranks' pieces {shapes} are not the pieces that "
                f"minidist.parallel.tensor_parallel.split cuts from {full} along axis {t['tp_dim']} with "
                f"tp_stride {t['tp_stride']} ({expected}); cut sharded parameters with split.py"
            )
    return full


def dumps(manifest: dict[str, Any]) -> bytes:
    """The manifest as UTF-8 JSON bytes with sorted keys, so equal manifests give equal bytes."""
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


def read_manifest(folder: Path) -> dict[str, Any]:
    """Read and check ``folder/manifest.json``.

    Raises ``CheckpointError`` naming the file if it is missing, unreadable, not UTF-8 JSON, not a
    minidist checkpoint, lacks a field or holds a malformed one (``schema.validate``), and
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
    validate(manifest, path)
    # A version-1 manifest, read as version 2: it knew no strides and no context parallelism.
    manifest["mesh"].setdefault("cp", 1)
    for t in manifest["tensors"].values():
        t.setdefault("tp_dim", None)  # as schema.validate read a missing one
        t.setdefault("tp_stride", 1)
    return manifest


def verify_file(folder: Path, name: str, manifest: dict[str, Any], keep: bool = False) -> dict[str, Any]:
    """Check shard ``name``'s size and sha256 against the manifest; with ``keep``, return its arrays.

    With ``keep`` the arrays are also checked against the manifest: every tensor the manifest places
    in this file must be there with the recorded shape and dtype (a checksum cannot catch a manifest
    edited to match, and the ranks that receive the file size their buffers from the manifest).

    Raises ``CheckpointError`` naming the file if it is not listed, missing, truncated, malformed,
    corrupt (checksum differs) or holds other shapes or dtypes than the manifest says.
    """
    expected = manifest["files"].get(name)
    if expected is None:
        raise CheckpointError("file is not listed in the manifest", folder / name)
    arrays = read_shard(folder / name, expected["sha256"], expected["bytes"], keep=keep)
    if keep:
        for key, t in manifest["tensors"].items():
            for s in t["shards"]:
                if s["file"] != name:
                    continue
                a = arrays.get(key)
                if a is None or list(a.shape) != s["shape"] or str(a.dtype) != t["dtype"]:
                    found = "missing" if a is None else f"{list(a.shape)} {a.dtype}"
                    raise CheckpointError(
                        f"tensor {key!r} is {found} in the file but {s['shape']} {t['dtype']} in the "
                        "manifest (the manifest was edited or belongs to another checkpoint)",
                        folder / name,
                    )
    return arrays


def verify_folder(folder: Path) -> str | None:
    """The problem with an existing checkpoint folder (manifest, then every file), or None if it verifies.

    ``save`` runs it on rank 0 alone, when it meets a folder of the same step (rare). Raises
    ``NewerFormatError`` for a checkpoint of a newer format (not damaged: never moved aside).
    """
    try:
        manifest = read_manifest(folder)
        for file in sorted(manifest["files"]):
            verify_file(folder, file, manifest)
    except NewerFormatError:
        raise
    except CheckpointError as err:
        return str(err)
    return None


# --- shard files ----------------------------------------------------------------------------------
def write_shard(path: Path, arrays: dict[str, np.ndarray]) -> tuple[str, int]:
    """Write ``arrays`` (NumPy, any shapes) as a safetensors file, fsynced.

    Returns ``(sha256 hex digest of the file, its size in bytes)``. The library writes the file
    (``safetensors.numpy.save_file``); then a helper thread hashes it from the page cache through a
    memory map while this thread waits for ``fsync``: the checksum costs no copy and hides behind the
    disk. The file gets the mode ``open()`` would give it (``0o644`` under umask ``022``), as the manifest
    does. Raises ``TypeError`` for a dtype safetensors cannot store (e.g. complex).
    """
    for key, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise TypeError(f"checkpoint: cannot store {key!r} of dtype {a.dtype} in safetensors")
    safetensors.numpy.save_file({key: np.ascontiguousarray(a) for key, a in arrays.items()}, str(path))
    os.chmod(path, new_file_mode())  # the library's temporary file is 0o600: give the manifest's mode
    with open(path, "rb+") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        # fsync: on disk before the manifest that vouches for it is written
        return _sha256_while(pages, lambda: os.fsync(f.fileno())), len(pages)


def _sha256_while(pages: mmap.mmap, work: Callable[[], None]) -> str:
    """The sha256 hex digest of ``pages``, computed on a helper thread (hashlib releases the GIL) while
    this thread runs ``work``.

    A plain thread rather than a ``ThreadPoolExecutor``: an asynchronous save (``background.py``) may
    still be writing while the interpreter shuts down, and executors then refuse new work ("cannot
    schedule new futures after interpreter shutdown"); a thread may still be started then.
    """
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(hashlib.sha256(pages).hexdigest())
        except BaseException as err:  # noqa: BLE001  (raised on the calling thread below)
            result.append(err)

    helper = threading.Thread(target=run, name="minidist-sha256")
    helper.start()
    try:
        work()
    finally:
        helper.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def read_shard(path: Path, sha256: str, nbytes: int, keep: bool = True) -> dict[str, np.ndarray]:
    """Read a shard into fresh arrays, checking its size and sha256 (``keep=False``: only check).

    The file is memory-mapped; a helper thread computes its sha256 while the ``safetensors`` library
    decodes the tensors from the same pages (hashlib releases the GIL), so the check costs little extra
    time. The arrays are returned only after the checksum matched. Raises ``CheckpointError`` naming
    the file if it is missing, truncated or extended (size differs from ``nbytes``), corrupt (checksum
    differs), or not a valid safetensors file.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError("shard file missing", path) from None
    # BEGIN SOLUTION A6.3: refuse a file whose size differs from the manifest's (truncated or extended)
    if size != nbytes or size == 0:
        raise CheckpointError(
            f"shard file truncated or changed: {size} bytes, the manifest says {nbytes}", path
        )
    # END SOLUTION
    arrays: dict[str, np.ndarray] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        with ThreadPoolExecutor(max_workers=1) as pool:
            digest = pool.submit(lambda: hashlib.sha256(pages).hexdigest())
            try:
                if keep:
                    with safetensors.safe_open(str(path), framework="numpy") as tensors:
                        arrays = {key: tensors.get_tensor(key) for key in tensors.keys()}  # noqa: SIM118
            except (safetensors.SafetensorError, ValueError, OSError) as err:
                if digest.result() != sha256:  # a damaged file: say so rather than "invalid format"
                    raise CheckpointError(
                        "shard file corrupt: its sha256 checksum differs from the manifest", path
                    ) from None
                raise CheckpointError(
                    f"shard file corrupt: not a valid safetensors file ({err})", path
                ) from None
            # BEGIN SOLUTION A6.3: return the arrays only if the file's sha256 matches the manifest's
            if digest.result() != sha256:
                raise CheckpointError(
                    "shard file corrupt: its sha256 checksum differs from the manifest", path
                )
            # END SOLUTION
    return arrays
