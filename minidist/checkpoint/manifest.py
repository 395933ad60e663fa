"""The manifest: one JSON file that describes a whole checkpoint.

``manifest.json`` (written by rank 0 after every rank's shard is on disk) holds::

    format, format_version        "minidist-checkpoint", FORMAT_VERSION
    step, extra, minidist_version, created (Unix time)
    mesh                          {"dp", "tp", "pp", "world_size"} of the run that saved
    files                         {file name: {"sha256": hex digest, "bytes": size}}
    tensors                       {key: {"name", "kind", "state", "global_shape", "dtype", "tp_dim",
                                         "shards": [{"file", "tp_rank", "shape"}, ...]}}
    optimizer                     {"class", "defaults", "step_count", "scalars": {name: {key: int}}}
                                  (null when no optimizer was saved)
    ranks                         per world rank: {"rank", "coords", "rng", "tp_rng", "sampler"}

A tensor key is ``model/<global name>`` or ``optim/<global name>/<state name>`` (``exp_avg``, ...);
the same key names the array inside each shard file. ``tp_dim`` says along which axis the
``tp`` shards are concatenated to give the global tensor (null: replicated, one shard). Everything
here is data: loading never runs code (JSON and safetensors only, no pickle).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from minidist.checkpoint.atomic import MANIFEST
from minidist.checkpoint.errors import CheckpointError, NewerFormatError
from minidist.checkpoint.schema import validate

FORMAT = "minidist-checkpoint"
FORMAT_VERSION = 1


def model_key(name: str) -> str:
    """The manifest and shard key of model parameter ``name`` (its full-model name)."""
    return f"model/{name}"


def optim_key(name: str, state: str) -> str:
    """The key of optimizer state ``state`` (e.g. ``"exp_avg"``) of parameter ``name``."""
    return f"optim/{name}/{state}"


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
    return manifest


def verify_file(folder: Path, name: str, manifest: dict[str, Any], keep: bool = False) -> dict[str, Any]:
    """Check shard ``name``'s size and sha256 against the manifest; with ``keep``, return its arrays.

    With ``keep`` the arrays are also checked against the manifest: every tensor the manifest places
    in this file must be there with the recorded shape and dtype (a checksum cannot catch a manifest
    edited to match, and the ranks that receive the file size their buffers from the manifest).

    Raises ``CheckpointError`` naming the file if it is not listed, missing, truncated, malformed,
    corrupt (checksum differs) or holds other shapes or dtypes than the manifest says.
    """
    from minidist.checkpoint.shardio import read_shard  # noqa: PLC0415

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


def summary(folder: Path, manifest: dict[str, Any]) -> str:
    """A human-readable table of a checkpoint (used by ``python -m minidist checkpoint info``)."""
    mesh = manifest["mesh"]
    total = sum(f["bytes"] for f in manifest["files"].values())
    opt = manifest.get("optimizer") or {}
    lines = [
        f"checkpoint  {folder}",
        f"step        {manifest['step']}   (format v{manifest['format_version']}, "
        f"minidist {manifest.get('minidist_version', '?')})",
        f"mesh        dp={mesh['dp']} tp={mesh['tp']} pp={mesh['pp']} (world size {mesh['world_size']})",
        f"files       {len(manifest['files'])} shard files, {total / 2**20:.2f} MiB",
        f"optimizer   {opt.get('class', 'none')}, step_count={opt.get('step_count', '-')}",
        f"extra       {json.dumps(manifest.get('extra'))}",
        "",
        f"{'tensor':<44} {'global shape':<16} {'dtype':<9} {'tp_dim':<6} shards",
    ]
    for key, t in sorted(manifest["tensors"].items()):
        shape = "x".join(map(str, t["global_shape"])) or "()"
        tp_dim = "-" if t["tp_dim"] is None else str(t["tp_dim"])
        lines.append(f"{key:<44} {shape:<16} {t['dtype']:<9} {tp_dim:<6} {len(t['shards'])}")
    return "\n".join(lines)
