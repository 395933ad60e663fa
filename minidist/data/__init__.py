"""Data: two digit data sets, a DataLoader, and the DistributedSampler that shards them across ranks;
text for language models and its random-window batches.

Reading order: ``digits.py`` (the bundled data set) -> ``mnist.py`` (the IDX file format) ->
``loader.py`` (batching) -> ``sampler.py`` (which rank reads which samples); for text, ``text.py``
(the bundled Shakespeare, the character tokenizer, the train/validation split) -> ``windows.py``
(random-window batches, the same global batch on every rank).
"""

from __future__ import annotations

import os

import numpy as np

from minidist.data.digits import load_digits
from minidist.data.loader import DataLoader
from minidist.data.mnist import load_mnist
from minidist.data.sampler import DistributedSampler
from minidist.data.text import CharTokenizer, load_shakespeare, load_text, train_val_split
from minidist.data.windows import RandomWindows

__all__ = [
    "CharTokenizer",
    "DataLoader",
    "DistributedSampler",
    "RandomWindows",
    "load_dataset",
    "load_digits",
    "load_mnist",
    "load_shakespeare",
    "load_text",
    "train_val_split",
]

_DATASETS = ("digits", "mnist")


def load_dataset(
    name: str, split: str = "train", data_dir: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load a data set by name, as the example scripts' ``--dataset`` and ``--data-dir`` flags do.

    Args:
        name: ``"digits"`` (bundled, 64 features; ``data_dir`` is ignored) or ``"mnist"`` (784
            features, read from the IDX files in ``data_dir``).
        split: ``"train"`` or ``"test"``.
        data_dir: the folder holding the MNIST files; required for ``"mnist"``.

    Returns:
        ``(x, y)``: ``x`` float32 of shape (N, features) in [0, 1], ``y`` int64 of shape (N,).

    Raises:
        ValueError: unknown ``name`` or ``split``; ``"mnist"`` without ``data_dir``; a corrupt MNIST file.
        FileNotFoundError: MNIST files missing from ``data_dir``.
    """
    if name == "digits":
        return load_digits(split)
    if name == "mnist":
        if data_dir is None:
            raise ValueError(
                "the mnist data set is read from local files and minidist never downloads it; "
                "pass --data-dir (data_dir=) pointing to the folder with the four MNIST IDX files."
            )
        return load_mnist(data_dir, split)
    raise ValueError(f"unknown data set {name!r}; use one of {_DATASETS}.")
