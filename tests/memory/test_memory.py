"""Memory accounting: ``minidist.memory.MemoryTracker``, the budget, the formulas, the demo.

The tracker *measures*: parameters, gradients and optimizer state by walking the model and optimizer,
activations as the autograd engine records and releases them. So every figure here is compared exactly
(bytes are deterministic) with a formula of ``minidist_tools.perfmodel.memory`` derived independently from the
ops, or with what NumPy itself reported to ``tracemalloc``. The MPI part (one 4-rank run, module-scoped)
checks DDP, ZeRO-1/2, FSDP and tensor + sequence parallelism, and the demonstration: a GPT that goes out
of memory on one rank under ``memory_common.BUDGET`` trains under the same budget on 4 ranks with FSDP.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tracemalloc

import memory_common as common  # noqa: E402
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_utils import REPO, mpi_env, mpiexec_path, run_mpi  # noqa: E402

import minidist as md  # noqa: E402
from minidist import memory, nn, optim  # noqa: E402
from minidist.memory import activations  # noqa: E402
from minidist.models.gpt.model import GPT, GPTConfig  # noqa: E402
from minidist_tools.perfmodel.memory import (  # noqa: E402
    gpt_activation_bytes,
    gpt_layer_activation_bytes,
    model_state_bytes,
    shard_elements,
)

CE = nn.functional.cross_entropy


# -- sizes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [("0", 0), ("1048576", 2**20), ("64MiB", 64 * 2**20), ("64 mib", 64 * 2**20), ("1.5GiB", 3 * 2**29),
     ("500MB", 500 * 10**6), ("2kB", 2000), ("512k", 512 * 1024), ("3G", 3 * 2**30), ("7B", 7), (12, 12)],
)  # fmt: skip
def test_parse_size_reads_bytes_and_units(text, expected):
    assert memory.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "MiB", "-1MiB", "64 MiBs", "1e3", "six"])
def test_parse_size_rejects_what_it_cannot_read_and_says_how_to_write_it(bad):
    with pytest.raises(ValueError, match="e.g. '1048576', '64MiB'"):
        memory.parse_size(bad)


@given(st.integers(0, 2**50))
def test_format_bytes_round_trips_through_parse_size_within_its_precision(n):
    shown = memory.format_bytes(n)
    # One decimal of KiB/MiB (two of GiB): the shown value is within half a unit of the last digit.
    assert abs(memory.parse_size(shown.replace(" ", "")) - n) <= max(
        0.05 * 1024 ** (len(shown) > 6), 0.005 * n
    )


# -- the formulas' own rules ----------------------------------------------------------------------------
@given(st.integers(0, 10_000), st.integers(1, 9))
def test_shards_are_array_splits_chunks_and_cover_every_element(numel, world):
    sizes = [shard_elements(numel, world, r) for r in range(world)]
    assert sizes == [len(c) for c in np.array_split(np.arange(numel), world)]
    states = [model_state_bytes(numel, "fsdp", world, r)["total"] for r in range(world)]
    assert sum(states) == model_state_bytes(numel, "ddp")["total"]  # (b + b + K) P, split without loss


def test_the_formulas_refuse_what_they_do_not_model():
    with pytest.raises(ValueError, match="unknown layout 'zero3'"):
        model_state_bytes(10, "zero3")
    with pytest.raises(ValueError, match="rank 4 is outside a world of 4 ranks"):
        shard_elements(10, 4, 4)
    with pytest.raises(ValueError, match="tp=4 must divide heads=6"):
        gpt_layer_activation_bytes(2, 8, 24, 6, tp=4)


# -- the tracker on one process -------------------------------------------------------------------------
def _tiny_gpt(dtype=np.float32) -> GPT:
    md.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, dtype=dtype))


def test_parameters_gradients_and_optimizer_state_are_measured_exactly():
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nbytes = sum(p.data.nbytes for p in model.parameters())  # 4 bytes x (8*16 + 16 + 16*4 + 4)
    assert nbytes == 4 * 212
    x, y = np.ones((5, 8), np.float32), np.arange(5) % 4
    with memory.MemoryTracker(model, opt) as tracker:
        CE(model(md.tensor(x)), y).backward()
        after_backward = tracker.report()
        opt.step()
        after_step = tracker.report()
        opt.zero_grad()
    assert after_backward["parameters"]["current"] == nbytes
    assert after_backward["gradients"]["current"] == nbytes
    assert after_backward["optimizer_state"]["current"] == 0  # momentum buffers appear in the first step
    assert after_step["optimizer_state"]["current"] == nbytes  # one momentum buffer per parameter
    final = tracker.report()
    assert final["gradients"] == {"current": 0, "peak": nbytes}  # zero_grad() set them to None
    assert final["activations"]["current"] == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpt_activations_equal_the_formula_peak_at_the_end_of_forward_and_are_freed(dtype):
    model = _tiny_gpt(dtype)
    idx = np.arange(16).reshape(2, 8) % 11
    targets = (idx + 1) % 11  # a distinct array, as the formula assumes
    with memory.MemoryTracker(model) as tracker:
        loss = CE(model(idx).reshape(-1, 11), targets.reshape(-1))
        at_end_of_forward = tracker.report()["activations"]["current"]
        loss.backward()
    expected = gpt_activation_bytes(2, 8, 16, 2, layers=2, vocab=11, itemsize=np.dtype(dtype).itemsize)
    assert at_end_of_forward == expected
    report = tracker.report()
    assert report["activations"] == {"current": 0, "peak": expected}  # backward released every op
    assert activations.held() == 0
    # The step's peak is the end of forward: parameters + all activations (no gradient exists yet).
    assert report["peak_breakdown"]["activations"] == expected
    assert report["total"]["peak"] == expected + report["parameters"]["current"]


def test_one_layer_of_activations_is_the_formula_of_a_block():
    held = []
    for layers in (1, 2):
        md.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=layers, n_head=4, n_embd=32))
        with memory.MemoryTracker(model) as tracker:
            out = model(np.zeros((3, 8), dtype=np.int64))
            held.append(tracker.report()["activations"]["current"])
        del out
    assert held[1] - held[0] == gpt_layer_activation_bytes(3, 8, 32, 4)


def test_activations_match_what_numpy_reported_to_tracemalloc():
    # The cross-check: NumPy reports every buffer it allocates to tracemalloc (its own domain), so the
    # growth of NumPy's traced memory during forward is what the graph really holds.
    model = _tiny_gpt()
    idx = np.arange(16).reshape(2, 8) % 11
    targets = (idx + 1) % 11
    tracemalloc.start()
    try:
        with memory.MemoryTracker(model) as tracker:
            before = memory.traced_numpy_bytes()
            loss = CE(model(idx).reshape(-1, 11), targets.reshape(-1))
            traced = memory.traced_numpy_bytes() - before
            counted = tracker.report()["activations"]["current"]
            loss.backward()
    finally:
        tracemalloc.stop()
    preexisting = idx.nbytes + targets.nbytes  # held by the graph (counted) but allocated before `before`
    # Left: the 0-d loss value and NumPy's small scalars, which no op keeps: under 1 KiB of ~60 KiB.
    assert abs((counted - preexisting) - traced) < 1024, (counted, preexisting, traced)


def test_a_graph_dropped_without_backward_is_released():
    model = _tiny_gpt()
    with memory.MemoryTracker(model) as tracker:
        logits = model(np.zeros((2, 8), dtype=np.int64))
        assert tracker.report()["activations"]["current"] > 0
        del logits
        gc.collect()  # (reference counting frees it already; collect makes it certain)
        assert tracker.report()["activations"]["current"] == 0


def test_without_a_tracker_nothing_is_recorded():
    model = _tiny_gpt()
    logits = model(np.zeros((2, 8), dtype=np.int64))
    assert not memory.tracking()
    assert logits._ctx._mem_saved is None  # the op never went through activations.record
    assert activations.held() == 0


def test_a_second_tracker_cannot_start_while_one_runs():
    with memory.MemoryTracker():
        with pytest.raises(RuntimeError, match="already running"):
            memory.MemoryTracker().start()
    assert not memory.tracking()


# -- the budget -----------------------------------------------------------------------------------------
def test_one_rank_goes_out_of_memory_with_a_message_that_says_what_and_what_to_do(monkeypatch):
    model = common.make_gpt()
    opt = common.adamw(model.parameters())
    with pytest.raises(memory.OutOfMemoryError) as caught:
        with memory.MemoryTracker(model, opt, budget=common.BUDGET):
            common.train(model, opt)
    error = caught.value
    assert isinstance(error, MemoryError)
    text = str(error)
    assert error.budget == 4 * 2**20 and error.total > error.budget
    assert "exceeds the budget 4.0 MiB (4194304 bytes)" in text
    # (It happens in the first forward, before AdamW's state exists.)
    expected = ("activations", "parameters", "largest: ", " in h.", "h.0.mlp.c_fc.weight",
                "FullyShardedDataParallel", "recomputation", "smaller batch", memory.BUDGET_ENV)  # fmt: skip
    for words in expected:
        assert words in text, f"{words!r} missing from:\n{text}"
    assert not memory.tracking()  # the with-block stopped the tracker on the way out
    # A budget the parameters alone exceed raises in start(), and leaves no tracker running.
    with pytest.raises(memory.OutOfMemoryError, match="parameters 1.3 MiB"):
        memory.MemoryTracker(model, opt, budget="1MiB").start()
    assert not memory.tracking()
    # The environment variable sets the same budget when none is passed.
    monkeypatch.setenv(memory.BUDGET_ENV, "4 MiB")
    assert memory.MemoryTracker().budget == 4 * 2**20
    monkeypatch.setenv(memory.BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match="cannot read the memory size 'lots'"):
        memory.MemoryTracker()


# -- several ranks: formulas, the demonstration, the error on every rank -----------------------------------
@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory_mesh")
    run_mpi(4, "memory/memory_mesh.py", str(out), timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)], np.load(
        out / "fsdp_state.npz"
    )


@pytest.mark.mpi
def test_ddp_and_zero_states_equal_the_formulas(mesh_run):
    ranks, _ = mesh_run
    for rank, result in enumerate(ranks):
        P = result["ddp"]["num_params"]
        tensors = len(list(common.make_gpt().parameters()))
        for layout in ("ddp", "zero1", "zero2"):
            expected = model_state_bytes(
                P, layout, 4, rank, ddp_bookkeeping_elements=tensors + 1 if layout == "ddp" else 0
            )
            measured = result[layout]["after_step"]
            for category in ("parameters", "gradients", "optimizer_state"):
                assert measured[category]["current"] == expected[category], (layout, rank, category)


@pytest.mark.mpi
def test_fsdp_state_and_gathered_units_equal_the_formulas(mesh_run):
    ranks, _ = mesh_run
    for rank, result in enumerate(ranks):
        fsdp = result["fsdp"]
        sizes, report = fsdp["unit_sizes"], fsdp["report"]
        assert fsdp["unit_names"][0] == ""  # the root unit: embeddings, tied head, ln_f
        expected = model_state_bytes(sum(sizes), "fsdp", 4, rank, unit_sizes=sizes)
        assert report["parameters"]["current"] == expected["parameters"]
        assert report["optimizer_state"]["current"] == expected["optimizer_state"]
        assert report["gradients"]["peak"] == expected["gradients"]  # the shards' .grad after each step
        # At most the root and two blocks at once: the one computing and the one prefetched (§3.3.2).
        assert report["gathered_parameters"]["peak"] == 4 * (sizes[0] + 2 * sizes[1])
        assert report["gathered_parameters"]["current"] == 0 and report["activations"]["current"] == 0


@pytest.mark.mpi
def test_tensor_and_sequence_parallel_activations_per_layer_equal_the_formula(mesh_run):
    ranks, _ = mesh_run
    for result in ranks:
        tp = result["tp"]
        B, T, C, H = tp["shape"]
        for sp in (0, 1):
            one, two = tp[f"sp{sp}_L1"], tp[f"sp{sp}_L2"]
            layer = gpt_layer_activation_bytes(B, T, C, H, tp=4, sequence_parallel=bool(sp))
            assert two["held"] - one["held"] == layer, sp
            assert one["after_backward"] == two["after_backward"] == 0
    # Sequence parallelism divides all but the row-parallel layers' partial sums by t.
    assert gpt_layer_activation_bytes(B, T, C, H, 4, True) < gpt_layer_activation_bytes(B, T, C, H, 4)


@pytest.mark.mpi
def test_the_gpt_one_rank_cannot_train_trains_on_four_with_fsdp_under_the_same_budget(mesh_run):
    ranks, state = mesh_run
    model = common.make_gpt()
    opt = common.adamw(model.parameters())
    with memory.MemoryTracker(model, opt) as tracker:
        losses = common.train(model, opt)
    budget = memory.parse_size(common.BUDGET)
    assert tracker.report()["total"]["peak"] > budget  # one rank: over (the test above sees the error)
    for result in ranks:
        assert result["fsdp"]["report"]["total"]["peak"] <= budget
        assert result["fsdp"]["report"]["budget"] == budget
    # The same training, in float32 (the demo is about float32 bytes; FSDP's own tests compare in float64):
    # the gradient is averaged from 4 partial means instead of one mean, so sums round differently
    # (relative 1e-7). AdamW divides each update by the gradient's RMS, so for the few elements whose
    # gradient is a nearly cancelling sum that rounding becomes a visible part of a step of lr = 1e-2
    # (lesson 10 measures ~1e-4 after 20 float32 steps; here up to 3e-5 after 3, varying run to run with
    # the reduction order: 7.8e-4 in one CI run; 99.5 % of the elements within 1e-6). Such an element can
    # at most step the other way, 2 lr per step, and how many do varies from run to run (99.5 % and 98.0 %
    # of the elements within 1e-6 in two CI runs). So: every element within 2 lr STEPS, 95 % within 1e-6,
    # and in EVERY tensor the median element within 1e-6, which a real difference in the computation (a
    # missed or misplaced gradient moves most elements of a tensor by ~1e-2) breaks at once; the losses
    # above too. (FSDP's own tests compare in float64, to 1e-11.)
    mean_loss = np.mean([r["fsdp"]["losses"] for r in ranks], axis=0)
    np.testing.assert_allclose(mean_loss, losses, rtol=1e-5)
    diffs = np.concatenate([np.abs(state[n] - p.data).ravel() for n, p in model.named_parameters()])
    assert diffs.max() < 2 * common.LR * common.STEPS, diffs.max()
    assert np.mean(diffs < 1e-6) > 0.95, np.mean(diffs < 1e-6)
    medians = {n: float(np.median(np.abs(state[n] - p.data))) for n, p in model.named_parameters()}
    assert max(medians.values()) < 1e-6, medians


def _example(n: int, script: str, *args: str, env: dict | None = None, budget_rank0: str | None = None):
    """``mpiexec -n n python examples/<script> args``, stdout and stderr as one terminal shows them;
    ``budget_rank0``: MINIDIST_MEMORY_BUDGET on rank 0 only (MPICH's per-section ``-env``)."""
    python, path = sys.executable, str(REPO / "examples" / script)
    if budget_rank0 is None:
        cmd = [mpiexec_path(), "-n", str(n), python, path, *args]
    else:
        cmd = [mpiexec_path(), "-n", "1", "-env", memory.BUDGET_ENV, budget_rank0, python, path, *args,
               ":", "-n", str(n - 1), python, path, *args]  # fmt: skip
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180,
                          env=mpi_env(env))  # fmt: skip


MLP_ARGS = ("--epochs", "1", "--max-steps", "3", "--hidden", "32", "--batch-size", "64")


@pytest.mark.mpi
def test_train_gpt_prints_every_ranks_memory_table():
    result = _example(2, "train_gpt.py", "--max-iters", "2", "--eval-iters", "1", "--batch-size", "4",
                      "--block-size", "16", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
                      "--sample-tokens", "1", "--memory")  # fmt: skip
    assert result.returncode == 0, result.stdout
    for rank in (0, 1):
        assert f"memory of rank {rank} (peak " in result.stdout
    assert result.stdout.count("optimizer_state") == 2 and "val loss:" in result.stdout


@pytest.mark.mpi
def test_out_of_memory_on_every_rank_ends_the_job_with_one_message():
    result = _example(
        2, "train_mlp.py", *MLP_ARGS, "--memory-budget", "20KiB", env={"MINIDIST_ERROR_WAIT": "60"}
    )
    assert result.returncode == 2, result.stdout
    assert "error on ranks 0-1: out of memory: the tracked total" in result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.mpi
def test_out_of_memory_on_one_rank_ends_the_job_without_a_hang():
    # Only rank 0 has a budget: rank 1 waits in DDP's all-reduce for a rank that will never come, so
    # exit_with_error's meeting times out and the job ends through MPI_Abort, with rank 0's message.
    result = _example(2, "train_mlp.py", *MLP_ARGS, env={"MINIDIST_ERROR_WAIT": "1"}, budget_rank0="20KiB")
    assert result.returncode == 2, result.stdout
    assert "[rank 0] error: out of memory: the tracked total" in result.stdout
