"""Checks of the files on disk: every field of ``manifest.json``, and each shard file against it.

``manifest.json`` is plain text that a person (or a failing disk) can change while it stays valid JSON
(``tensors`` turned into a list, ``format_version`` written as ``"1"``, a shard's shape or the step
edited). Code that trusted the fields would fail far from the cause, or hand MPI a buffer of the wrong
size on one rank. So :func:`check_manifest` checks every field that ``load``, ``save`` and the CLI read
(``format.read_manifest`` calls it), raising a ``CheckpointError`` naming the field;
``load_latest(fallback=True)`` then steps back to an older checkpoint as for any other damage.

A shard file is checked by its size and sha256 against the manifest's (:func:`read_shard`, the only
way ``load`` reads one: the arrays are returned only once the checksum matched) and by the tensors it
holds (:func:`verify_file`): a damaged file is an error, never a silently different model. When a
manifest is built, :func:`check_pieces` makes sure the tp ranks' pieces are split.py's pieces.
"""

from __future__ import annotations

import hashlib
import mmap
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import safetensors

from minidist import random as md_random
from minidist.checkpoint.atomic import is_step_dirname
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.layout import piece_shape

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # a plain name in the folder: no '/', no '..'
_SAFETENSORS_KINDS = "biuf"  # the dtypes atomic.write_shard can store


def _is_int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_manifest(manifest: Any, path: Path) -> None:
    """Raise ``CheckpointError`` (naming ``path`` and the field) unless ``manifest`` is well formed: the
    types of every field the code reads, a step that matches a ``step_<n>`` folder's name, shard shapes
    that sum to the global shape along ``tp_dim`` (which piece goes where is split.py's rule, checked by
    ``layout.local_piece``), shards that name listed files, one ``ranks`` record per rank of the mesh."""

    def bad(field: str, why: str) -> CheckpointError:
        return CheckpointError(f"manifest field {field} {why} (corrupt or hand-edited manifest?)", path)

    version = manifest["format_version"]
    if not _is_int(version, 1):
        raise bad("'format_version'", f"must be an int >= 1, got {version!r}")
    if not _is_int(manifest["step"]):
        raise bad("'step'", f"must be an int >= 0, got {manifest['step']!r}")
    if is_step_dirname(folder := path.parent.name) and int(folder[5:]) != manifest["step"]:  # step_<n>
        raise bad("'step'", f"is {manifest['step']}, but the folder is {folder}")
    mesh = manifest["mesh"]
    if not isinstance(mesh, dict) or not all(
        _is_int(mesh.get(k), 1) for k in ("dp", "tp", "pp", "world_size")
    ):
        raise bad("'mesh'", f"must hold ints >= 1 dp, tp, pp, world_size, got {mesh!r}")
    if not _is_int(mesh.get("cp", 1), 1):  # format version 1 has no cp: 1
        raise bad("'mesh'['cp']", f"must be an int >= 1, got {mesh['cp']!r}")
    if mesh["dp"] * mesh["tp"] * mesh["pp"] * mesh.get("cp", 1) != mesh["world_size"]:
        raise bad("'mesh'", f"has dp*tp*pp*cp != world_size: {mesh!r}")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise bad("'files'", "must be an object {file name: {sha256, bytes}}")
    for name, f in files.items():
        if not _FILE_NAME.match(name) or name.startswith("."):
            raise bad(f"'files' key {name!r}", "must be a plain file name inside the checkpoint folder")
        if not isinstance(f, dict) or not isinstance(f.get("sha256"), str) or not _SHA256.match(f["sha256"]):
            raise bad(f"'files'[{name!r}]", "must hold 'sha256' as 64 lowercase hex digits")
        if not _is_int(f.get("bytes"), 1):
            raise bad(f"'files'[{name!r}]['bytes']", f"must be an int >= 1, got {f.get('bytes')!r}")
    tensors = manifest["tensors"]
    if not isinstance(tensors, dict):
        raise bad("'tensors'", f"must be an object {{key: tensor}}, got a {type(tensors).__name__}")
    for key, t in tensors.items():
        _check_tensor(key, t, files, bad)
    _check_ranks(manifest["ranks"], mesh, bad)
    _check_optimizer(manifest.get("optimizer"), bad)


def _check_tensor(key: str, t: Any, files: dict, bad: Any) -> None:
    where = f"'tensors'[{key!r}]"
    if not isinstance(t, dict):
        raise bad(where, "must be an object")
    if not isinstance(t.get("name"), str) or t.get("kind") not in ("model", "optim"):
        raise bad(where, "must have a string 'name' and 'kind' 'model' or 'optim'")
    if t["kind"] == "optim" and not isinstance(t.get("state"), str):
        raise bad(f"{where}['state']", f"must name the optimizer state, got {t.get('state')!r}")
    shape = t.get("global_shape")
    if not isinstance(shape, list) or not all(_is_int(n) for n in shape):
        raise bad(f"{where}['global_shape']", f"must be a list of ints >= 0, got {shape!r}")
    try:  # a string naming a NumPy int or float dtype ("float32", "int64", ...)
        dtype_ok = isinstance(t.get("dtype"), str) and np.dtype(t["dtype"]).kind in _SAFETENSORS_KINDS
    except (TypeError, ValueError):
        dtype_ok = False
    if not dtype_ok:
        raise bad(f"{where}['dtype']", f"must name an int/float dtype, got {t.get('dtype')!r}")
    tp_dim, shards, stride = t.get("tp_dim"), t.get("shards"), t.get("tp_stride", 1)
    if tp_dim is not None and not (_is_int(tp_dim) and tp_dim < len(shape)):
        raise bad(f"{where}['tp_dim']", f"must be null or an axis of {shape}, got {tp_dim!r}")
    if not _is_int(stride, 1) or (tp_dim is not None and shape[tp_dim] % stride):
        raise bad(f"{where}['tp_stride']", f"must be an int >= 1 that divides the split axis, got {stride!r}")
    if not isinstance(shards, list) or not shards:
        raise bad(f"{where}['shards']", "must be a non-empty list")
    for i, s in enumerate(shards):
        if not isinstance(s, dict) or not isinstance(s.get("file"), str) or s["file"] not in files:
            raise bad(f"{where}['shards'][{i}]", "must name a file listed in 'files'")
        wanted = None if tp_dim is None else i  # shards are stored in tp_rank order
        if s.get("tp_rank") != wanted or isinstance(s.get("tp_rank"), bool):
            raise bad(f"{where}['shards'][{i}]['tp_rank']", f"must be {wanted}, got {s.get('tp_rank')!r}")
        piece = s.get("shape")
        if not isinstance(piece, list) or not all(_is_int(n) for n in piece) or len(piece) != len(shape):
            raise bad(
                f"{where}['shards'][{i}]['shape']",
                f"must be {len(shape)} ints >= 0 (global_shape is {shape}), got {piece!r}",
            )
    # The shards must assemble to the global shape: same extent on every other axis, sum along tp_dim.
    if tp_dim is None:
        if len(shards) != 1 or shards[0]["shape"] != shape:
            raise bad(f"{where}['shards']", f"must be one shard of the global shape {shape} (tp_dim is null)")
        return
    others = [[n for a, n in enumerate(s["shape"]) if a != tp_dim] for s in shards]
    total = sum(s["shape"][tp_dim] for s in shards)
    if any(o != [n for a, n in enumerate(shape) if a != tp_dim] for o in others) or total != shape[tp_dim]:
        raise bad(f"{where}['shards']", f"shapes {[s['shape'] for s in shards]} do not assemble to {shape}")


def _check_ranks(ranks: Any, mesh: dict, bad: Any) -> None:
    if not isinstance(ranks, list) or len(ranks) != mesh["world_size"]:
        raise bad("'ranks'", f"must be a list of {mesh['world_size']} records (the saved world size)")
    for i, r in enumerate(ranks):
        if not isinstance(r, dict) or r.get("rank") != i or not {"rng", "tp_rng", "sampler"} <= r.keys():
            raise bad(f"'ranks'[{i}]", f"must be an object with 'rank' {i}, 'rng', 'tp_rng' and 'sampler'")
        coords = r.get("coords")
        if not isinstance(coords, list) or len(coords) not in (3, 4) or not all(_is_int(c) for c in coords):
            raise bad(
                f"'ranks'[{i}]['coords']", f"must be [dp_rank, tp_rank, pp_rank, cp_rank], got {coords!r}"
            )  # 3 of them in format version 1
        for field in ("tp_rng", "sampler"):
            if r.get(field) is not None and not isinstance(r[field], dict):
                raise bad(f"'ranks'[{i}][{field!r}]", "must be null or an object")
        # Tried on throw-away generators, so that load finds a bad state before it changes anything.
        for state in [r.get("rng"), *(r.get("tp_rng") or {}).values()]:
            try:
                type(md_random.generator().bit_generator)().state = state
            except (TypeError, ValueError, KeyError, OverflowError) as err:
                raise bad(f"'ranks'[{i}]", f"holds a malformed random-generator state ({err!r})") from None


def _check_optimizer(header: Any, bad: Any) -> None:
    if header is None:
        return
    if not isinstance(header, dict) or not isinstance(header.get("class"), str):
        raise bad("'optimizer'", "must be null or an object with a string 'class'")
    if not _is_int(header.get("step_count")):
        raise bad("'optimizer'['step_count']", f"must be an int >= 0, got {header.get('step_count')!r}")
    defaults = header.get("defaults")
    number = (int, float, bool, type(None))
    if not isinstance(defaults, dict) or not all(
        isinstance(v, number) or (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v))
        for v in defaults.values()
    ):
        raise bad("'optimizer'['defaults']", "must map hyperparameter names to numbers or lists of numbers")
    scalars = header.get("scalars")
    if not isinstance(scalars, dict) or not all(
        isinstance(c, dict) and all(_is_int(v) for v in c.values()) for c in scalars.values()
    ):
        raise bad("'optimizer'['scalars']", "must map parameter names to {counter: int >= 0}")


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


def check_pieces(key: str, t: dict[str, Any]) -> None:
    """Raise ``CheckpointError`` unless the shards of tensor ``t``, being saved, are exactly split.py's
    pieces of its ``global_shape`` (their sum along ``tp_dim``, ``format.build_manifest``): a layer that
    cut its weight by another rule would be resharded wrongly."""
    if t["tp_dim"] is None:
        return
    shapes, full = [s["shape"] for s in t["shards"]], t["global_shape"]
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


def check_listed(folder: Path, manifest: dict[str, Any]) -> None:
    """Raise ``CheckpointError`` if a shard of the manifest names a file it lists no checksum for."""
    for s in (s for t in manifest["tensors"].values() for s in t["shards"]):
        if s["file"] not in manifest["files"]:
            raise CheckpointError(
                f"the manifest refers to {s['file']!r} but lists no checksum for it", folder
            )


def check_found(key: str, pieces: list[Any], shards: list[dict[str, Any]], folder: Path) -> None:
    """Raise ``CheckpointError`` unless each of ``pieces`` (tensor ``key`` as read from the file of the
    shard record in ``shards`` at the same place, or None) is there with the recorded shape."""
    for array, s in zip(pieces, shards):
        if array is None or list(array.shape) != list(s["shape"]):
            raise CheckpointError(f"tensor {key!r} missing or misshapen in the file", folder / s["file"])
