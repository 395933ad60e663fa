"""FullyShardedDataParallel (ZeRO-3 / FSDP; Rajbhandari et al. 2020 §5.3, Zhao et al. 2023).

On real MPI ranks (``tests/workers/fsdp/``: one launch per world size trains every configuration of
``fsdp_train.CONFIGS``; one launch checks the errors):

1. Equivalence to one device (docs/design.md, property 3): the MLP (per-Linear units, one unit), three Linear
   layers two of which share a weight (the shared weight goes to the root), a Linear unit applied twice
   in one forward, and the tiny GPT (per-Block units, tied embeddings in the root, clipping, AdamW
   with train_gpt's decay groups, and micro-batches under ``no_sync``) trained on 2 and 4 ranks equal
   one process training the plain model (3 ranks:
   ``test_train_gpt_example.py::test_fsdp_trains_the_model_of_one_process``).
2. Prefetch changes when an all-gather starts, nothing else: bit-identical parameters on or off.
3. Memory, in bytes (not timing): between steps the original parameters hold nothing and a rank's
   shards are exactly its ``numpy.array_split`` chunk of every unit; the peak of the
   "gathered_parameters" counter is the root plus the two largest neighbouring units with prefetch
   (the one computing and the one arriving), the root plus the largest unit without.
4. ``state_dict()`` holds the full parameters by the model's names; loaded into another FSDP model it
   gives them back bit for bit. bfloat16 communication is used (not ignored) and stays close.
5. Bad input raises on every rank, with a message naming the problem.

The pure planning (which parameter goes to which unit) is tested here without MPI.
"""

from __future__ import annotations

import functools
import json
import sys

import numpy as np
import pytest
from mpi_utils import WORKERS

sys.path.insert(0, str(WORKERS / "fsdp"))
import fsdp_common as fc  # noqa: E402
from mpi_utils import run_mpi  # noqa: E402

from minidist import nn  # noqa: E402
from minidist.nn.utils import clip_grad_norm_  # noqa: E402

# float64: N ranks and one process differ only in the order in which gradients are summed (per rank,
# then in the reduce-scatter): a few ulps (~1e-16 relative) per step. AdamW divides by sqrt(v), which
# amplifies the relative error of tiny gradients, so after 4 steps the largest difference measured is
# 7.6e-15 (GPT; 1.7e-14 on 3 ranks); 1e-11 absolute is a wide margin that still catches any real error
# (a missing 1/N, a wrong shard, a stale or lost gradient moves parameters by >= 1e-4 here) by many
# orders of magnitude.
TOLERANCE = dict(rtol=1e-9, atol=1e-11)
# The same rounding argument for the clipping norms (Python floats from the shards' partial norms).
NORM_TOLERANCE = dict(rtol=1e-9, atol=0)
# Which worker configuration each reference trains: (model, optimizer, clip).
REFERENCES = {
    "mlp_sgd_per_linear": ("mlp", "sgd", False),
    "mlp_adamw_one_unit": ("mlp", "adamw", False),
    "tied_sgd_per_linear": ("tied", "sgd", False),
    "twice_sgd_per_linear": ("twice", "sgd", False),
    "gpt_adamw_blocks": ("gpt", "adamw", True),
    "gpt_adamw_blocks_no_prefetch": ("gpt", "adamw", True),
    "gpt_adamw_blocks_no_sync": ("gpt", "adamw", True),
}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"N={n}")  # N=3: test_train_gpt_example
def fsdp_run(request, tmp_path_factory):
    """Run the training worker once per world size; return ``(n, params(config, rank), report(rank))``."""
    n = request.param
    out = tmp_path_factory.mktemp(f"fsdp_n{n}")
    run_mpi(n, "fsdp/fsdp_train.py", out, timeout=180)

    def params(config: str, rank: int) -> dict[str, np.ndarray]:
        with np.load(out / f"{config}_rank{rank}.npz") as archive:
            return dict(archive)

    def report(rank: int) -> dict:
        return json.loads((out / f"rank{rank}.json").read_text())

    return n, params, report


@functools.cache
def single_process(kind: str, opt: str, clip: bool) -> tuple[dict[str, np.ndarray], list[float]]:
    """The reference: the plain model and optimizer, one process, the whole global batch, float64."""
    model = fc.make(kind, fc.SEED)
    optimizer = fc.OPTIMIZERS[opt](fc.decay_groups(model.parameters()))
    clipper = functools.partial(clip_grad_norm_, list(model.parameters()), fc.CLIP) if clip else None
    norms = fc.train(model, optimizer, fc.batches(kind), clipper)
    return model.state_dict(), norms


# ---------------------------------------------------------------------------------------- equivalence
@pytest.mark.mpi
@pytest.mark.parametrize("config", list(REFERENCES))
def test_fsdp_equals_single_process(fsdp_run, config):
    n, params, report = fsdp_run
    expected, expected_norms = single_process(*REFERENCES[config])
    for rank in range(n):  # state_dict() is collective: every rank holds the same full parameters
        got = params(config, rank)
        assert got.keys() == expected.keys()  # the model's own names, the tied weight once
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, **TOLERANCE, err_msg=f"{config} {name} rank {rank}")
        np.testing.assert_allclose(report(rank)[config]["norms"], expected_norms, **NORM_TOLERANCE)
    if expected_norms:  # clipping acted at every step, so the test covers it
        assert min(expected_norms) > fc.CLIP


@pytest.mark.mpi
def test_prefetch_changes_nothing_but_timing(fsdp_run):
    n, params, _ = fsdp_run
    for rank in range(n):
        on, off = params("gpt_adamw_blocks", rank), params("gpt_adamw_blocks_no_prefetch", rank)
        for name in on:  # the same arithmetic in the same order: equal, not merely close
            np.testing.assert_array_equal(on[name], off[name], err_msg=name)


@pytest.mark.mpi
def test_bfloat16_communication_is_used_and_close(fsdp_run):
    """param_dtype = reduce_dtype = bfloat16: the weights the units compute with and the averaged
    gradients are rounded to 8 significant bits. AdamW moves each element by at most about lr = 0.01
    per step whatever the gradient's size, so after 4 steps two runs are at most 2 x 4 x 0.01 apart;
    a difference above 1e-6 shows that the rounding really happened (float64 runs differ by 1e-14)."""
    n, params, _ = fsdp_run
    expected, _ = single_process("gpt", "adamw", True)
    got = params("gpt_adamw_blocks_bfloat16", 0)
    worst = max(float(np.max(np.abs(got[k] - expected[k]))) for k in expected)
    assert 1e-6 < worst < 2 * fc.STEPS * 0.01


# --------------------------------------------------------------------------------------------- memory
@pytest.mark.mpi
@pytest.mark.parametrize("config", list(REFERENCES) + ["gpt_adamw_blocks_bfloat16"])
def test_a_rank_holds_its_shards_and_at_most_two_gathered_units(fsdp_run, config):
    n, _, report = fsdp_run
    for rank in range(n):
        r = report(rank)[config]
        root, units = r["root_bytes"], r["unit_bytes"]
        numels = [b // 8 for b in ([root] if root else []) + units]  # float64 parameters
        own = sum(len(np.array_split(np.arange(p), n)[rank]) for p in numels)
        assert r["original_bytes"] == 0 and r["ndims_kept"]  # nothing stale left in the parameters
        assert r["flat_shard_elements"] == own and r["shard_bytes"] == 8 * own  # P/N, shards are views
        assert r["gathered_now"] == 0 and r["communication_now"] == 0  # everything freed after the step
        assert r["communication_peak"] > 0  # the reduce-scatters' flat gradients were reported
        if "bfloat16" not in config:  # (float64 throughout: a flat gradient is its unit's full_nbytes)
            # At most two units' full gradients wait for their reduce-scatter (then the root's joins at
            # the end of backward): never the whole model's, as a new user measured before it was bounded.
            largest_two = sum(sorted(units)[-2:])
            assert r["communication_peak"] <= root + largest_two, r
        prefetch = "no_prefetch" not in config
        neighbours = [a + b for a, b in zip(units, units[1:])] if prefetch and len(units) > 1 else units
        assert r["peak_gathered"] == root + max(neighbours, default=0), r
        assert r["reload_bit_identical"]


# ------------------------------------------------------------------------------------- communication
@pytest.mark.mpi
def test_collectives_per_step_and_their_bytes(fsdp_run):
    """Counted from the trace of one step (load-proof): the root is all-gathered once, every Block twice
    (forward, and backward's recomputation), each unit reduce-scattered once. An all-gather sends this
    rank's shard; a reduce-scatter sends the unit's whole flat gradient. bfloat16 (2 bytes) instead of
    float64 (8) sends a quarter of both."""
    n, _, report = fsdp_run
    for rank in range(n):
        plain, low = report(rank)["gpt_adamw_blocks"], report(rank)["gpt_adamw_blocks_bfloat16"]
        root, units = plain["root_bytes"] // 8, [b // 8 for b in plain["unit_bytes"]]
        own = [len(np.array_split(np.arange(p), n)[rank]) for p in [root, *units]]
        gathered = own[0] + 2 * sum(own[1:])
        assert plain["traffic"]["all_gather"] == [1 + 2 * len(units), 8 * gathered]
        assert plain["traffic"]["reduce_scatter"] == [1 + len(units), 8 * (root + sum(units))]
        assert low["traffic"]["all_gather"] == [1 + 2 * len(units), 2 * gathered]
        assert low["traffic"]["reduce_scatter"] == [1 + len(units), 2 * (root + sum(units))]


# --------------------------------------------------------------------------------------------- errors
@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_errors")
    run_mpi(2, "fsdp/fsdp_errors.py", out, timeout=120)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("case", "kind", "message"),
    [
        ("shape_differs_on_one_rank", "ValueError", "parameter wte.weight (unit 'root', shape (11, 16)"),
        ("wrap_selects_nothing", "ValueError", "selects no submodule with parameters of its own"),
        ("nested_units", "ValueError", "wrap selects 'h.0.attn.c_attn' inside 'h.0'; units cannot be nested"),
        ("bad_wrap_type", "TypeError", "wrap must be None, a Module class, a tuple of Module classes"),
        (
            "param_dtype_on_one_rank",
            "ValueError",
            "rank 1 of the group: FullyShardedDataParallel: param_dtype",
        ),
        ("prefetch_differs", "ValueError", "prefetch (True on rank 0; False on rank 1)"),
        ("clip_max_norm_differs", "ValueError", "max_norm (1.0 on rank 0; 2.0 on rank 1)"),
        ("load_wrong_shape", "ValueError", "'wpe.weight' has shape (7, 16) in the state dict but (8, 16)"),
        ("load_missing_key", "KeyError", "missing keys ['h.0.attn.c_attn.bias'"),
        ("foreign_parameter_in_groups", "ValueError", "is not one of the wrapped model's"),
        ("backward_twice", "RuntimeError", "Trying to backward through the graph a second time"),
        ("tuple_output_with_grad", "TypeError", "returned a tuple; with gradients on it must return one"),
        ("wrapped_twice", "ValueError", "is already wrapped by a FullyShardedDataParallel"),
        ("summon_nested", "RuntimeError", "summon_full_params: enter it between steps (after backward"),
        ("forward_inside_summon", "RuntimeError", "do not call the FSDP model inside summon_full_params()"),
    ],
)
def test_bad_input_raises_on_every_rank(errors, case, kind, message):
    for rank, results in enumerate(errors):
        assert results[case] is not None, f"rank {rank} raised nothing for {case}"
        got_kind, got_message = results[case]
        assert got_kind == kind and message in got_message, (rank, got_kind, got_message)


@pytest.mark.mpi
def test_still_usable_after_the_errors(errors):
    for results in errors:
        assert results["usable_after_errors"] == [False] * 3  # trained a step, nothing left gathered
        assert results["summoned_module_equals_fsdp"]  # summon_full_params: the module has the true weights


@pytest.mark.mpi
@pytest.mark.parametrize(
    "case",
    [
        "evaluation_between_forward_and_backward",
        "two_forwards_one_backward",
        "forward_without_backward_then_step",
        "zero_grad_drops_no_sync_gradients",
        "failed_backward_leaks_nothing",
    ],
)
def test_usage_patterns_keep_the_root_and_the_gradients_right(errors, case):
    """The root stays gathered from a forward to its backward: a forward in between (an evaluation, a
    second micro-batch) must not change it under the first graph, and an optimizer step in between must
    not leave its old values in use (the root is re-gathered and compared, on every rank). zero_grad()
    also drops full gradients that no_sync() left on the parameters."""
    for results in errors:
        assert results[case] is None, results[case]
        assert results["nothing_gathered_at_the_end"]


# ------------------------------------------------------------------------------- planning, without MPI
def test_blocks_become_units_and_the_tied_embedding_stays_in_the_root():
    from minidist.models.gpt.transformer import Block
    from minidist.parallel.fsdp.units import plan_units

    gpt = fc.make_gpt(0)
    plans = plan_units(gpt, (Block,))
    assert [p.name for p in plans] == ["", "h.0", "h.1"]
    assert plans[0].names == ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
    assert plans[1].names[0] == "h.0.ln_1.weight" and all(n.startswith("h.1.") for n in plans[2].names)
    everything = [n for p in plans for n in p.names]
    assert sorted(everything) == sorted(n for n, _ in gpt.named_parameters())  # each exactly once


def test_a_weight_shared_by_two_units_goes_to_the_root():
    from minidist.parallel.fsdp.units import plan_units

    model = fc.make_tied(0)
    plans = plan_units(model, (nn.Linear,))
    assert [p.name for p in plans] == ["", "0", "2", "4"]
    assert plans[0].names == ["0.weight"]  # (named once, under its first module)
    assert plans[1].names == ["0.bias"] and plans[2].names == ["2.bias"]


def test_wrap_none_or_a_predicate():
    from minidist.parallel.fsdp.units import plan_units

    model = fc.make_mlp(0)
    assert [p.name for p in plan_units(model, None)] == [""]
    chosen = plan_units(model, lambda name, module: name == "2")
    assert [p.name for p in chosen] == ["", "2"] and chosen[1].names == ["2.weight", "2.bias"]


@pytest.mark.parametrize(
    ("wrap", "error", "message"),
    [
        ((nn.Tanh,), ValueError, "selects no submodule with parameters of its own (1 selected)"),
        ((nn.Sequential, nn.Linear), ValueError, None),  # the model itself is never a unit: no error
        ("Linear", TypeError, "wrap must be None, a Module class"),
    ],
)
def test_wrap_errors(wrap, error, message):
    from minidist.parallel.fsdp.units import plan_units

    model = fc.make_mlp(0)
    if message is None:
        assert [p.name for p in plan_units(model, wrap)] == ["0", "2", "4"]  # no root: all in units
        return
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_units(model, wrap)


def test_nested_units_and_mixed_dtypes_are_refused():
    from minidist.parallel.fsdp.units import local_problem, plan_units

    outer = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2))
    with pytest.raises(ValueError, match="wrap selects '0.0' inside '0'; units cannot be nested"):
        plan_units(outer, (nn.Sequential, nn.Linear))
    mixed = nn.Sequential(nn.Linear(2, 2, dtype=np.float32), nn.Linear(2, 2, dtype=np.float64))
    problem = local_problem(plan_units(mixed, None))
    assert isinstance(problem, ValueError) and "mixes dtypes ['float32', 'float64']" in str(problem)
