"""The UCI handwritten digits: a small real data set that ships inside minidist.

1,797 grey-scale images of the digits 0-9, each 8x8 pixels with integer values 0..16 (every
pixel counts how many of a 4x4 block of a 32x32 bitmap were inked). The set is small enough to
train an MLP in seconds on a laptop, yet real enough that a correct distributed run and a broken
one give visibly different accuracies.

Source and licence: E. Alpaydin and C. Kaynak, "Optical Recognition of Handwritten Digits",
UCI Machine Learning Repository (archive.ics.uci.edu), 1998, licensed CC BY 4.0. This is the same
copy that scikit-learn distributes as ``sklearn.datasets.load_digits``.

How ``digits.npz`` was made (once, by hand; minidist never imports scikit-learn)::

    raw = np.loadtxt(".../sklearn/datasets/data/digits.csv.gz", delimiter=",")  # 64 pixels, then label
    images, labels = raw[:, :64].astype(np.uint8), raw[:, 64].astype(np.uint8)
    np.savez_compressed("digits.npz", images=images, labels=labels)

The file holds ``images`` uint8 (1797, 64) and ``labels`` uint8 (1797,).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_NPZ_PATH = Path(__file__).with_name("digits.npz")
_N_SAMPLES = 1797
_N_TRAIN = 1500  # the remaining 297 samples are the test split
_SPLIT_SEED = 20240501  # any fixed constant works; changing it changes which samples are "test"
_VALID_SPLITS = ("train", "test")


def _split_indices(split: str) -> np.ndarray:
    """The sample indices of one split, identical on every machine and every run.

    One permutation of all samples is drawn from a generator with a fixed seed; its first
    1,500 entries are the training set and the rest the test set. Shuffling before cutting makes
    the test set a random sample rather than whatever happens to sit at the end of the file.
    """
    perm = np.random.default_rng(_SPLIT_SEED).permutation(_N_SAMPLES)
    return perm[:_N_TRAIN] if split == "train" else perm[_N_TRAIN:]


def load_digits(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Load the train or test split of the UCI handwritten digits.

    The split is fixed: a permutation of the 1,797 samples drawn once from
    ``np.random.default_rng(20240501)``; the first 1,500 samples are ``"train"``, the remaining
    297 are ``"test"``. The two splits are disjoint and together cover every sample.

    Args:
        split: ``"train"`` or ``"test"``.

    Returns:
        ``(x, y)``: ``x`` float32 of shape (N, 64), pixel values divided by 16 so they lie in
        [0, 1]; ``y`` int64 of shape (N,), class labels 0..9. N is 1500 for train, 297 for test.

    Raises:
        ValueError: if ``split`` is not ``"train"`` or ``"test"``.

    Source: E. Alpaydin and C. Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine
    Learning Repository, 1998, CC BY 4.0.
    """
    if split not in _VALID_SPLITS:
        raise ValueError(f"load_digits: unknown split {split!r}; use one of {_VALID_SPLITS}.")
    with np.load(_NPZ_PATH) as archive:
        images = archive["images"]
        labels = archive["labels"]
    idx = _split_indices(split)
    # Divide by 16 (the largest pixel value), not by the observed max, so train and test are scaled alike.
    x = images[idx].astype(np.float32) / np.float32(16.0)
    y = labels[idx].astype(np.int64)
    return x, y
