"""A6.3 public tests: read_shard returns the arrays of an intact file and refuses a damaged one."""

from __future__ import annotations

import numpy as np


def write(tmp_path, seed: int = 0):
    from minidist.checkpoint.atomic import write_shard

    rng = np.random.default_rng(seed)
    arrays = {"model/0.weight": rng.standard_normal((5, 3)), "model/0.bias": rng.standard_normal(5)}
    path = tmp_path / "rank00000.safetensors"
    sha, nbytes = write_shard(path, arrays)
    return path, sha, nbytes, arrays


def expect_refusal(path, sha, nbytes, damage: str) -> None:
    from minidist.checkpoint.errors import CheckpointError
    from minidist.checkpoint.file_checks import read_shard

    try:
        read_shard(path, sha, nbytes)
    except CheckpointError:
        return
    raise AssertionError(
        f"read_shard returned arrays from a shard file that was {damage}: it must raise "
        "CheckpointError, or a damaged checkpoint loads as a silently different model"
    )


def test_intact_and_corrupt_shards(tmp_path):
    from minidist.checkpoint.file_checks import read_shard

    path, sha, nbytes, arrays = write(tmp_path)
    got = read_shard(path, sha, nbytes)
    for key, a in arrays.items():
        if key not in got or not np.array_equal(got[key], a):
            raise AssertionError(f"read_shard of an intact file: {key!r} is missing or differs")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # one bit of tensor data: still a valid safetensors file, another model
    path.write_bytes(bytes(data))
    expect_refusal(path, sha, nbytes, "corrupted (one bit of a weight flipped; its sha256 differs)")


def test_truncated_and_extended_shards(tmp_path):
    path, sha, nbytes, _ = write(tmp_path, seed=1)
    original = path.read_bytes()
    path.write_bytes(original + b"\0" * 8)
    expect_refusal(path, sha, nbytes, f"extended ({nbytes + 8} bytes, the manifest says {nbytes})")
    path.write_bytes(original[:-8])
    expect_refusal(path, sha, nbytes, f"truncated ({nbytes - 8} bytes, the manifest says {nbytes})")


def test_check_only_still_verifies(tmp_path):
    keep = False
    from minidist.checkpoint.errors import CheckpointError
    from minidist.checkpoint.file_checks import read_shard

    path, sha, nbytes, _ = write(tmp_path, seed=2)
    if read_shard(path, sha, nbytes, keep=keep) != {}:
        raise AssertionError("read_shard(..., keep=False) only checks the file and returns {}")
    bad = "0" * 64
    try:
        read_shard(path, bad, nbytes, keep=keep)
    except CheckpointError:
        return
    raise AssertionError(
        "read_shard(..., keep=False) accepted a file whose sha256 differs from the manifest's: "
        "verify the checksum even when the arrays are not kept"
    )
