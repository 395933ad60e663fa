"""Tests for minidist.data: the digits and MNIST loaders, DataLoader batching, DistributedSampler sharding.

The sampler tests check the property data parallelism rests on: the ranks together read exactly the
samples one process would, in the same global batches, without talking to each other.
"""

from __future__ import annotations

import gzip
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import strategies as S
from hypothesis import given
from hypothesis import strategies as st

import minidist.data
from minidist.data import DataLoader, DistributedSampler, load_dataset, load_digits, load_mnist

# ---------------------------------------------------------------------------------------------- digits


@pytest.mark.parametrize(("split", "n"), [("train", 1500), ("test", 297)])
def test_digits_split_sizes_and_dtypes(split, n):
    x, y = load_digits(split)
    assert x.shape == (n, 64) and x.dtype == np.float32
    assert y.shape == (n,) and y.dtype == np.int64


def test_digits_pixels_are_sixteenths_in_unit_interval():
    x, _ = load_digits("train")
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_array_equal(x * 16, np.round(x * 16))  # raw values were the integers 0..16


@pytest.mark.parametrize("split", ["train", "test"])
def test_digits_every_class_present(split):
    _, y = load_digits(split)
    assert set(y.tolist()) == set(range(10))


def test_digits_splits_are_disjoint_and_cover_the_file():
    # Compare multisets of (pixels, label) rows: train + test must be exactly the 1,797 rows of the file.
    with np.load(Path(minidist.data.__file__).with_name("digits.npz")) as archive:
        file_rows = np.column_stack([archive["images"], archive["labels"]]).astype(np.int64)
    parts = [load_digits(split) for split in ("train", "test")]
    split_rows = np.concatenate([np.column_stack([np.rint(x * 16), y]).astype(np.int64) for x, y in parts])
    assert file_rows.shape == split_rows.shape == (1797, 65)
    file_unique, file_counts = np.unique(file_rows, axis=0, return_counts=True)
    split_unique, split_counts = np.unique(split_rows, axis=0, return_counts=True)
    np.testing.assert_array_equal(file_unique, split_unique)
    np.testing.assert_array_equal(file_counts, split_counts)


def test_digits_split_is_deterministic():
    x1, y1 = load_digits("test")
    x2, y2 = load_digits("test")
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)


def test_digits_unknown_split_lists_valid_splits():
    with pytest.raises(ValueError, match=r"'validation'.*'train', 'test'"):
        load_digits("validation")


# ----------------------------------------------------------------------------------------------- MNIST

_MNIST_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _idx_bytes(array: np.ndarray) -> bytes:
    """Encode a uint8 array as an IDX file: bytes 0, 0, 0x08, d; d big-endian uint32 sizes; the pixels."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def _write(path: Path, data: bytes, gz: bool) -> None:
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def _write_mnist(folder: Path, split: str, n: int, gz: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Write a tiny random MNIST split of n 28x28 images into folder; return (images, labels) as uint8."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    images_name, labels_name = _MNIST_NAMES[split]
    _write(folder / images_name, _idx_bytes(images), gz)
    _write(folder / labels_name, _idx_bytes(labels), gz)
    return images, labels


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("split", ["train", "test"])
def test_mnist_reads_synthetic_idx_files_exactly(tmp_path, split, gz):
    images, labels = _write_mnist(tmp_path, split, n=7, gz=gz)
    x, y = load_mnist(tmp_path, split)
    assert x.shape == (7, 784) and x.dtype == np.float32
    assert y.shape == (7,) and y.dtype == np.int64
    np.testing.assert_array_equal(x, images.reshape(7, 784).astype(np.float32) / 255)
    np.testing.assert_array_equal(y, labels)


def test_load_dataset_mnist_reads_from_data_dir(tmp_path):
    _, labels = _write_mnist(tmp_path, "test", n=3, gz=True)
    _, y = load_dataset("mnist", "test", data_dir=tmp_path)
    np.testing.assert_array_equal(y, labels)


def test_mnist_missing_file_error_names_expected_files(tmp_path):
    _write_mnist(tmp_path, "test", n=3, gz=False)  # only the test split is present
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte") as info:
        load_mnist(tmp_path, "train")
    message = str(info.value)
    for name in (*_MNIST_NAMES["train"], *_MNIST_NAMES["test"]):
        assert name in message
    assert "never downloads" in message


def test_mnist_missing_folder_error_names_expected_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist.*t10k-labels-idx1-ubyte.*never downloads"):
        load_mnist(tmp_path / "nowhere", "test")


def test_mnist_wrong_magic_number_names_file(tmp_path):
    _write_mnist(tmp_path, "train", n=3, gz=False)
    # A label file where the image file should be: magic 0x00000801 instead of 0x00000803.
    (tmp_path / "train-images-idx3-ubyte").write_bytes(_idx_bytes(np.zeros(3, dtype=np.uint8)))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.*0x00000801.*0x00000803"):
        load_mnist(tmp_path, "train")


@pytest.mark.parametrize("keep", [2, 10, 100])  # inside the magic, inside the sizes, inside the pixels
def test_mnist_truncated_file_names_file(tmp_path, keep):
    _write_mnist(tmp_path, "train", n=3, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.*truncated"):
        load_mnist(tmp_path, "train")


def test_mnist_truncated_gzip_stream_names_file(tmp_path):
    _write_mnist(tmp_path, "train", n=3, gz=True)
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-12])  # cut the end of the deflate stream and its trailer
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.gz"):
        load_mnist(tmp_path, "train")


def test_mnist_image_label_count_mismatch_names_both_files(tmp_path):
    _write_mnist(tmp_path, "test", n=4, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx_bytes(np.zeros(5, dtype=np.uint8)))
    with pytest.raises(
        ValueError, match=r"t10k-images-idx3-ubyte.*4 images.*t10k-labels-idx1-ubyte.*5 labels"
    ):
        load_mnist(tmp_path, "test")


def test_mnist_unknown_split_lists_valid_splits(tmp_path):
    with pytest.raises(ValueError, match=r"'t10k'.*'train', 'test'"):
        load_mnist(tmp_path, "t10k")


# ------------------------------------------------------------------------------------------ load_dataset


def test_load_dataset_digits_equals_load_digits():
    x, y = load_dataset("digits", "test")
    x_ref, y_ref = load_digits("test")
    np.testing.assert_array_equal(x, x_ref)
    np.testing.assert_array_equal(y, y_ref)


def test_load_dataset_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"'cifar10'.*'digits', 'mnist'"):
        load_dataset("cifar10", "train")


def test_load_dataset_mnist_without_data_dir_asks_for_it():
    with pytest.raises(ValueError, match="--data-dir"):
        load_dataset("mnist", "train")


# -------------------------------------------------------------------------------------------- DataLoader


def _tiny_dataset(n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """x row i is [2i, 2i+1] and y[i] = i, so every batch reveals which samples it holds."""
    return np.arange(2 * n).reshape(n, 2), np.arange(n)


def test_loader_batches_in_order_hand_checked():
    batches = list(DataLoader(_tiny_dataset(), batch_size=2))
    assert len(batches) == 3
    (x0, y0), (x1, y1), (x2, y2) = batches
    np.testing.assert_array_equal(x0, [[0, 1], [2, 3]])
    np.testing.assert_array_equal(y0, [0, 1])
    np.testing.assert_array_equal(x1, [[4, 5], [6, 7]])
    np.testing.assert_array_equal(y1, [2, 3])
    np.testing.assert_array_equal(x2, [[8, 9]])  # the partial last batch is kept by default
    np.testing.assert_array_equal(y2, [4])


def test_loader_drop_last_skips_partial_batch():
    loader = DataLoader(_tiny_dataset(), batch_size=2, drop_last=True)
    assert len(loader) == 2
    assert [y.tolist() for _, y in loader] == [[0, 1], [2, 3]]


@given(n=st.integers(0, 40), batch_size=st.integers(1, 12), drop_last=st.booleans(), shuffle=st.booleans())
def test_loader_len_equals_number_of_batches_and_samples_are_each_seen_once(
    n, batch_size, drop_last, shuffle
):
    loader = DataLoader(_tiny_dataset(n), batch_size=batch_size, drop_last=drop_last, shuffle=shuffle)
    ys = [y for _, y in loader]
    assert len(ys) == len(loader)
    assert all(len(y) == batch_size for y in ys[:-1])
    seen = np.concatenate(ys) if ys else np.array([], dtype=np.int64)
    expected = n - n % batch_size if drop_last else n
    assert len(seen) == expected == len(set(seen.tolist()))


def test_loader_shuffle_depends_only_on_seed_and_epoch():
    data = _tiny_dataset(50)

    def order(seed: int, epoch: int) -> list[int]:
        loader = DataLoader(data, batch_size=8, shuffle=True, seed=seed)
        loader.set_epoch(epoch)
        return [i for _, y in loader for i in y.tolist()]

    assert order(3, 1) == order(3, 1)  # reproducible, e.g. after resuming from a checkpoint
    assert order(3, 1) == np.random.default_rng((3, 1)).permutation(50).tolist()
    assert order(3, 1) != order(3, 2)  # a new epoch reshuffles
    assert order(3, 1) != order(4, 1)  # a new seed reshuffles
    assert sorted(order(3, 1)) == list(range(50))


def test_loader_uses_sampler_order_and_forwards_set_epoch():
    sampler = DistributedSampler(5, num_replicas=1, rank=0, shuffle=True, seed=7)
    loader = DataLoader(_tiny_dataset(), batch_size=2, sampler=sampler)
    loader.set_epoch(3)
    assert sampler.epoch == 3
    assert [i for _, y in loader for i in y.tolist()] == list(sampler)
    plain = DataLoader(_tiny_dataset(), batch_size=2, sampler=[4, 0, 3])  # any sized iterable of ints
    assert len(plain) == 2
    assert [y.tolist() for _, y in plain] == [[4, 0], [3]]


def test_loader_rejects_arrays_of_different_lengths():
    with pytest.raises(ValueError, match=r"same number of samples.*\[5, 4\]"):
        DataLoader((np.zeros((5, 2)), np.zeros(4)))


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be an int"),
        ({"shuffle": True, "sampler": [0, 1]}, ValueError, "mutually exclusive"),
        ({"seed": -1}, ValueError, "seed must be >= 0"),
    ],
)
def test_loader_rejects_bad_arguments(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        DataLoader(_tiny_dataset(), **kwargs)


def test_loader_rejects_non_tuple_dataset():
    with pytest.raises(TypeError, match=r"tuple of NumPy arrays.*\(x,\)"):
        DataLoader(np.zeros((5, 2)))
    with pytest.raises(TypeError, match=r"dataset\[1\] is a list"):
        DataLoader((np.zeros(3), [0, 1, 2]))


# ------------------------------------------------------------------------------------ DistributedSampler


def _all_ranks(n: int, num_replicas: int, epoch: int, **kwargs) -> list[DistributedSampler]:
    """One sampler per rank at ``epoch``, built as each rank of a real run would build its own."""
    samplers = [
        DistributedSampler(n, num_replicas=num_replicas, rank=r, **kwargs) for r in range(num_replicas)
    ]
    for sampler in samplers:
        sampler.set_epoch(epoch)  # every rank must use the same epoch
    return samplers


def _reference_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The documented order, written out independently of the sampler's code."""
    return np.random.default_rng((seed, epoch)).permutation(n) if shuffle else np.arange(n)


sampler_configs = st.fixed_dictionaries(
    {
        "n": st.integers(0, 120),
        "num_replicas": S.world_sizes(),
        "seed": S.seeds,
        "epoch": st.integers(0, 1000),
        "shuffle": st.booleans(),
        "drop_last": st.booleans(),
    }
)


@given(config=sampler_configs)
def test_strided_ranks_take_every_rth_index_of_the_shared_permutation(config):
    n, num_replicas, seed, epoch = config["n"], config["num_replicas"], config["seed"], config["epoch"]
    samplers = _all_ranks(
        n, num_replicas, epoch, seed=seed, shuffle=config["shuffle"], drop_last=config["drop_last"]
    )
    perm = _reference_permutation(n, seed, epoch, config["shuffle"])
    if config["drop_last"]:
        perm = perm[: n - n % num_replicas]
    for r, sampler in enumerate(samplers):
        indices = list(sampler)
        assert indices == perm[r::num_replicas].tolist()
        assert len(sampler) == len(indices)
        assert all(type(i) is int for i in indices)


@given(config=sampler_configs)
def test_strided_ranks_use_each_sample_once_without_padding(config):
    n, num_replicas, drop_last = config["n"], config["num_replicas"], config["drop_last"]
    samplers = _all_ranks(n, num_replicas, config["epoch"], seed=config["seed"], drop_last=drop_last)
    used = [i for sampler in samplers for i in sampler]
    lengths = {len(sampler) for sampler in samplers}
    assert len(used) == len(set(used))  # no sample twice: unlike PyTorch, no padding
    if drop_last:
        assert lengths == {n // num_replicas}  # equal lengths; at most num_replicas - 1 samples unused
        assert set(used) <= set(range(n)) and len(used) == n - n % num_replicas
    else:
        assert sorted(used) == list(range(n))  # every sample exactly once
        assert max(lengths) - min(lengths) <= 1


global_batch_configs = sampler_configs.flatmap(
    lambda c: st.integers(c["num_replicas"], 3 * c["num_replicas"] + 5).map(lambda b: {**c, "batch_size": b})
)


def _local_batches(sampler: DistributedSampler, n: int) -> list[list[int]]:
    """This rank's batches as the documented DataLoader recipe yields them."""
    loader = DataLoader((np.arange(n),), batch_size=sampler.local_batch_size, sampler=sampler)
    return [batch.tolist() for (batch,) in loader]


@given(config=global_batch_configs)
def test_global_batch_mode_reproduces_single_process_batches(config):
    n, num_replicas, batch_size = config["n"], config["num_replicas"], config["batch_size"]
    seed, epoch, shuffle, drop_last = config["seed"], config["epoch"], config["shuffle"], config["drop_last"]
    samplers = _all_ranks(
        n, num_replicas, epoch, seed=seed, shuffle=shuffle, drop_last=drop_last, batch_size=batch_size
    )
    per_rank = [_local_batches(sampler, n) for sampler in samplers]
    # What one process with the same seed, epoch and global batch size would see:
    one_process = DataLoader(
        (np.arange(n),), batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    one_process.set_epoch(epoch)
    global_batches = [batch.tolist() for (batch,) in one_process]
    assert max((len(b) for b in per_rank), default=0) <= len(global_batches)
    for k, expected in enumerate(global_batches):
        pieces = [batches[k] if k < len(batches) else [] for batches in per_rank]
        assert sum(pieces, []) == expected
        # array_split order: piece sizes never increase with the rank and differ by at most one
        sizes = [len(p) for p in pieces]
        assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1
    if drop_last:
        assert {len(b) for b in per_rank} == {n // batch_size}  # every rank takes the same number of steps
    for sampler in samplers:
        assert len(sampler) == len(list(sampler))


@pytest.mark.parametrize(
    ("batch_size", "num_replicas", "expected"), [(8, 4, [2, 2, 2, 2]), (10, 4, [3, 3, 2, 2])]
)
def test_local_batch_size_follows_array_split(batch_size, num_replicas, expected):
    sizes = [
        DistributedSampler(100, num_replicas=num_replicas, rank=r, batch_size=batch_size).local_batch_size
        for r in range(num_replicas)
    ]
    assert sizes == expected == [len(p) for p in np.array_split(np.arange(batch_size), num_replicas)]


@pytest.mark.parametrize("batch_size", [None, 6])
def test_set_epoch_changes_the_order_and_is_reproducible(batch_size):
    sampler = DistributedSampler(100, num_replicas=2, rank=1, seed=5, batch_size=batch_size)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch0 != epoch1
    sampler.set_epoch(0)
    assert list(sampler) == epoch0


def test_sampler_accepts_int_tuple_or_sized_dataset():
    x, y = np.zeros((12, 3)), np.zeros(12)
    for dataset in (12, (x, y), x, list(range(12))):
        assert DistributedSampler(dataset, num_replicas=3, rank=0).dataset_len == 12


def test_sampler_defaults_come_from_minidist_distributed(monkeypatch):
    fake_dist = types.SimpleNamespace(get_world_size=lambda: 4, get_rank=lambda: 2)
    monkeypatch.setitem(sys.modules, "minidist.distributed", fake_dist)
    monkeypatch.setattr(sys.modules["minidist"], "distributed", fake_dist, raising=False)
    sampler = DistributedSampler(10)
    assert (sampler.num_replicas, sampler.rank) == (4, 2)


def test_sampler_without_dist_requires_explicit_world(monkeypatch):
    monkeypatch.setitem(sys.modules, "minidist.distributed", None)  # makes `import minidist.distributed` fail
    monkeypatch.delattr(sys.modules["minidist"], "distributed", raising=False)
    with pytest.raises(ValueError, match="pass num_replicas= and rank= explicitly"):
        DistributedSampler(10)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"num_replicas": 0, "rank": 0}, ValueError, "num_replicas must be >= 1"),
        ({"num_replicas": 2, "rank": 2}, ValueError, r"rank must be in \[0, num_replicas\) = \[0, 2\)"),
        ({"num_replicas": 2, "rank": -1}, ValueError, "rank must be >= 0"),
        ({"num_replicas": 2.0, "rank": 0}, TypeError, "num_replicas must be an int"),
        ({"num_replicas": 2, "rank": 0, "seed": -3}, ValueError, "seed must be >= 0"),
        ({"num_replicas": 4, "rank": 0, "batch_size": 3}, ValueError, "some ranks would get empty batches"),
        ({"num_replicas": 1, "rank": 0, "batch_size": 0}, ValueError, "batch_size must be >= 1"),
    ],
)
def test_sampler_rejects_bad_arguments(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        DistributedSampler(10, **kwargs)


def test_sampler_rejects_bad_dataset_and_epoch():
    with pytest.raises(TypeError, match="cannot tell how many samples"):
        DistributedSampler(object(), num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="must be >= 0"):
        DistributedSampler(-5, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        DistributedSampler(5, num_replicas=1, rank=0).set_epoch(-1)


def test_local_batch_size_undefined_in_strided_mode():
    with pytest.raises(ValueError, match="only defined in global-batch mode"):
        _ = DistributedSampler(10, num_replicas=2, rank=0).local_batch_size


# ------------------------------------------------------------------- the loader's progress is saved
def test_loader_progress_is_the_samplers_position_batch_by_batch():
    """Inside ``for x, y in loader`` the sampler's position counts the batches yielded so far (the
    DataLoader once drew the whole epoch up front, leaving 0 there for a checkpoint to save)."""
    sampler = DistributedSampler(20, num_replicas=2, rank=1, batch_size=4, seed=3)
    loader = DataLoader((np.arange(20),), batch_size=sampler.local_batch_size, sampler=sampler)
    seen = []
    for k, (xb,) in enumerate(loader):
        assert sampler.position == (k + 1) * 2
        seen.append(xb)
    assert sampler.position == len(sampler) == 10  # the epoch is done, not restarted
    np.testing.assert_array_equal(np.concatenate(seen), sampler.indices())
    # Without set_epoch the same epoch runs again from its start (as in PyTorch) ...
    assert len(list(loader)) == 5
    # ... but a restored finished epoch yields nothing: the resumed loop moves on to the next one.
    resumed = DistributedSampler(20, num_replicas=2, rank=1, batch_size=4, seed=3)
    resumed.load_state_dict(sampler.state_dict())
    assert list(DataLoader((np.arange(20),), batch_size=2, sampler=resumed)) == []
    resumed.set_epoch(1)
    assert (
        resumed.position == 0 and len(list(DataLoader((np.arange(20),), batch_size=2, sampler=resumed))) == 5
    )


def test_loader_resumes_at_the_next_batch_and_hands_over_its_state():
    sampler = DistributedSampler(20, num_replicas=1, rank=0, batch_size=4, seed=3)
    loader = DataLoader((np.arange(20),), batch_size=4, sampler=sampler)
    batches = iter(loader)
    first = [next(batches)[0] for _ in range(2)]
    state = loader.state_dict()  # the loader hands over its sampler's state: checkpoint.save(sampler=loader)
    assert state == sampler.state_dict() and state["position"] == 8
    rest = [b for (b,) in batches]
    again = DataLoader(
        (np.arange(20),), batch_size=4, sampler=DistributedSampler(20, 1, 0, batch_size=4, seed=3)
    )
    again.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate([*first, *(b for (b,) in again)]), sampler.indices())
    assert len(rest) == 3
    with pytest.raises(TypeError, match="no sampler that records its progress"):
        DataLoader((np.arange(20),), batch_size=4, shuffle=True).state_dict()


def test_a_new_iteration_after_a_break_starts_the_epoch_over_as_in_pytorch():
    """``for x in loader: ... break`` (a few evaluation batches, a step limit), then the same loop again
    in the same epoch: PyTorch starts the epoch over, and so does a loader over a DistributedSampler (it
    went on after the batches broken off). Only a position restored from a checkpoint is resumed."""
    sampler = DistributedSampler(24, num_replicas=2, rank=1, batch_size=6, seed=3)
    loader = DataLoader((np.arange(24),), batch_size=sampler.local_batch_size, sampler=sampler)
    whole = [b.tolist() for (b,) in loader]
    for i, _ in enumerate(loader):
        if i == 1:
            break
    state = sampler.state_dict()
    assert state["position"] == 2 * sampler.local_batch_size  # what a save inside the loop records
    assert [b.tolist() for (b,) in loader] == whole
    assert [b.tolist() for (b,) in loader] == whole  # and again
    resumed = DistributedSampler(24, num_replicas=2, rank=1, batch_size=6, seed=3)
    resumed.load_state_dict(state)
    again = DataLoader((np.arange(24),), batch_size=resumed.local_batch_size, sampler=resumed)
    assert [b.tolist() for (b,) in again] == whole[2:]
    assert [b.tolist() for (b,) in again] == whole  # a second pass in the resumed process: from the start


def test_a_finished_epoch_stays_finished_on_another_number_of_ranks():
    """Saved after the last (partial) global batch on 2 ranks, resumed on 3: nothing of the epoch is left
    (rounding the position down to whole global batches would redo the partial one)."""
    saved = DistributedSampler(20, num_replicas=2, rank=1, batch_size=8, seed=3)
    assert len(list(saved)) == saved.position == len(saved) == 10  # 2 global batches of 8 and 4 left over
    for rank in range(3):
        resumed = DistributedSampler(20, num_replicas=3, rank=rank, batch_size=8, seed=3)
        resumed.load_state_dict(saved.state_dict())
        assert list(resumed) == []
    saved.position = 4  # one global batch done: carried over as one global batch
    resumed = DistributedSampler(20, num_replicas=3, rank=0, batch_size=8, seed=3)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.position == 3


# --------------------------------------------- the loader takes a batch's indices from the sampler at once
class _OneByOne:
    """A DistributedSampler seen only through ``iter``/``len``: the loader pulls its indices one by one."""

    def __init__(self, sampler: DistributedSampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("resume_at", [None, 0, 3])
def test_batches_at_once_equal_index_by_index_with_the_same_positions(drop_last, resume_at):
    """``DistributedSampler.batches`` (slices) gives the loader the same batches as pulling the indices one
    by one, and leaves the same ``position`` inside the loop body and after it: with a partial last batch
    (23 samples, local batch 4), with the loader's ``drop_last``, and resumed from a saved position."""
    runs = []
    for wrap in (lambda s: s, _OneByOne):
        sampler = DistributedSampler(23, num_replicas=2, rank=1, batch_size=8, seed=5)
        if resume_at is not None:
            sampler.load_state_dict({**sampler.state_dict(), "position": resume_at})
        loader = DataLoader((np.arange(23),), batch_size=4, sampler=wrap(sampler), drop_last=drop_last)
        runs.append(([(b.tolist(), sampler.position) for (b,) in loader], sampler.position))
    assert runs[0] == runs[1]
    assert runs[0][1] == 11  # the epoch is done: 2 x 4 of the full global batches + 3 of the tail


class _Evens(DistributedSampler):
    """A subclass that filters its parent's order: only ``__iter__`` and ``__len__`` are its own."""

    def __iter__(self):
        return (i for i in super().__iter__() if i % 2 == 0)

    def __len__(self):
        return (super().__len__() + 1) // 2


def test_a_sampler_subclass_that_overrides_only_iter_is_iterated_not_sliced():
    """``batches()`` would bypass the subclass's filter: the loader must follow ``iter(sampler)`` (as
    torch's DataLoader does) whenever ``__iter__`` and ``batches`` do not come from the same class."""
    loader = DataLoader(
        (np.arange(10),), batch_size=3, sampler=_Evens(10, num_replicas=1, rank=0, shuffle=False)
    )
    assert [b.tolist() for (b,) in loader] == [[0, 2, 4], [6, 8]]
    assert len(loader) == 2
