"""MNIST read from the four IDX files in a local folder (minidist never downloads anything).

MNIST (Y. LeCun, C. Cortes and C. J. C. Burges, "The MNIST database of handwritten digits") is
distributed as four files in the IDX format, each optionally gzipped:

    train-images-idx3-ubyte   train-labels-idx1-ubyte   (60,000 samples)
    t10k-images-idx3-ubyte    t10k-labels-idx1-ubyte    (10,000 samples)

An IDX file is a tiny header followed by raw bytes:

    bytes 0-3   magic number, big-endian: 0x00 0x00, then a type code (0x08 = unsigned byte),
                then the number of dimensions d. Images: 0x00000803 (d=3), labels: 0x00000801 (d=1).
    bytes 4-..  d sizes, each a big-endian uint32 (images: count, rows, cols; labels: count)
    then        prod(sizes) unsigned bytes in C (row-major) order

We parse it by hand because it is short and shows how little a binary data format needs; every
check below turns a confusing reshape error later into a message that names the broken file.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_ALL_NAMES = " ".join(file_name for pair in _FILES.values() for file_name in pair)
_WHERE_TO_GET = (
    "Download the four MNIST files yourself (for example from the mirror "
    "https://ossci-datasets.s3.amazonaws.com/mnist/; the original yann.lecun.com page is often "
    "unavailable) into that folder, plain or .gz; "
    "minidist never downloads anything at run time."
)


def _find(folder: Path, name: str) -> Path:
    """The path of ``name`` or ``name.gz`` in ``folder`` (the plain file wins if both exist)."""
    for candidate in (folder / name, folder / (name + ".gz")):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"MNIST file {name!r} (or {name + '.gz'!r}) not found in {str(folder)!r}. "
        f"Expected the files: {_ALL_NAMES} (each plain or with a .gz suffix). {_WHERE_TO_GET}"
    )


def _read_bytes(path: Path) -> bytes:
    """The file's contents, decompressed if its name ends in ``.gz``."""
    if path.suffix != ".gz":
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as err:  # bad gzip header, or a gzip stream cut short
        raise ValueError(f"{str(path)!r} is not a valid gzip file ({err}); download it again.") from err


def _parse_idx(data: bytes, expected_magic: int, path: Path) -> np.ndarray:
    """Decode one IDX file of unsigned bytes into a uint8 array of the shape its header declares.

    Raises ValueError (naming ``path``) on a wrong magic number, a short header, or a payload
    whose length differs from the product of the declared sizes.
    """
    if len(data) < 4:
        raise ValueError(f"{str(path)!r} is truncated: {len(data)} bytes, too short for an IDX header.")
    magic = int.from_bytes(data[:4], "big")
    if magic != expected_magic:
        raise ValueError(
            f"{str(path)!r} has IDX magic number 0x{magic:08x}, expected 0x{expected_magic:08x}; "
            "is it the right file (images vs labels), or a corrupt download?"
        )
    ndim = magic & 0xFF  # the low byte of the magic number is the number of dimensions
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise ValueError(f"{str(path)!r} is truncated inside its header ({len(data)} of {header_len} bytes).")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected_len = header_len + int(np.prod(shape))
    if len(data) != expected_len:
        problem = "truncated" if len(data) < expected_len else "longer than its header says"
        raise ValueError(
            f"{str(path)!r} is {problem}: the header declares shape {shape} ({expected_len} bytes in all) "
            f"but the file has {len(data)} bytes; download it again."
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header_len).reshape(shape)


def load_mnist(path: str | os.PathLike, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Load the MNIST train or test split from IDX files in the local folder ``path``.

    Expects ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``
    and ``t10k-labels-idx1-ubyte`` in ``path``, each either plain or gzipped with a ``.gz`` suffix
    (only the two files of the requested split are read).

    Args:
        path: the folder holding the files.
        split: ``"train"`` (60,000 samples) or ``"test"`` (the 10,000 ``t10k`` samples).

    Returns:
        ``(x, y)``: ``x`` float32 of shape (N, rows * cols) = (N, 784) for MNIST, pixel values
        divided by 255 so they lie in [0, 1]; ``y`` int64 of shape (N,), labels 0..9.

    Raises:
        ValueError: unknown ``split``; a file with the wrong magic number, truncated (or too long),
            not valid gzip; or image and label files holding different numbers of samples.
        FileNotFoundError: ``path`` is not a folder or a needed file is missing; the message lists
            the expected file names and where to obtain them.

    Source: Y. LeCun, C. Cortes and C. J. C. Burges, "The MNIST database of handwritten digits".
    """
    if split not in _FILES:
        raise ValueError(f"load_mnist: unknown split {split!r}; use one of {tuple(_FILES)}.")
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"MNIST folder {str(folder)!r} does not exist or is not a folder. "
            f"It should hold the files: {_ALL_NAMES} (each plain or with a .gz suffix). {_WHERE_TO_GET}"
        )
    images_name, labels_name = _FILES[split]
    images_path = _find(folder, images_name)
    labels_path = _find(folder, labels_name)
    images = _parse_idx(_read_bytes(images_path), _IMAGES_MAGIC, images_path)
    labels = _parse_idx(_read_bytes(labels_path), _LABELS_MAGIC, labels_path)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{str(images_path)!r} holds {images.shape[0]} images but {str(labels_path)!r} holds "
            f"{labels.shape[0]} labels; the two files must come from the same split and download."
        )
    # Flatten each rows x cols image into one row vector: the MLPs in minidist take (N, features).
    x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
    y = labels.astype(np.int64)
    return x, y
