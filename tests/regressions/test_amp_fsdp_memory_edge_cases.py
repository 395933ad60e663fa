"""Edge cases of FSDP, autocast, GradScaler and MemoryTracker that once went wrong.

Each test is the smallest use that went wrong before its fix; the docstring says what broke. All run
in one process (no MPI): the bugs were in single-rank logic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist as md
from minidist import memory, nn, optim
from minidist.amp import GradScaler
from minidist.parallel import FullyShardedDataParallel


def test_gradscaler_scales_a_float16_loss_without_overflowing():
    """A float16 loss times the scale was computed in float16: 100 * 2^10 is inf there (float16 stops
    at 65504), so every step was skipped and the scale backed off step after step. PyTorch's float32
    scale promotes the loss to float32; minidist does the same now."""
    w = md.tensor(np.array([60.0, 40.0], dtype=np.float32), requires_grad=True)  # a float32 master weight
    loss = w.to(np.float16).sum()  # a float16 loss of 100 (a cast the user wrote, outside autocast)
    assert loss.dtype == np.float16
    scaler = GradScaler(init_scale=2.0**10)
    scaled = scaler.scale(loss)
    assert scaled.dtype == np.float32 and float(scaled.item()) == 100.0 * 2.0**10  # exact: integers
    scaled.backward()
    assert w.grad.dtype == np.float32  # the cast sends the gradient back in the parameter's dtype
    np.testing.assert_array_equal(w.grad, [2.0**10, 2.0**10])  # d(sum)/dw * S, exact
    opt = optim.SGD([w], lr=2.0**-4)
    scaler.step(opt)
    scaler.update()
    assert scaler.skipped_steps == 0  # before the fix: skipped (the scaled loss was inf)
    np.testing.assert_array_equal(w.data, [60.0 - 2.0**-4, 40.0 - 2.0**-4])  # one SGD step, exact


def test_gradscaler_refuses_to_unscale_float16_gradients():
    """float16 parameters (a model cast to half, no master weights) were unscaled in float16, where
    the small gradients the scale had rescued underflow again, silently. PyTorch refuses: so does
    minidist, before changing any gradient."""
    w = md.tensor(np.array([1.0, 2.0], dtype=np.float16), requires_grad=True)
    scaler = GradScaler(init_scale=2.0**4)
    scaler.scale(w.sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.step(optim.SGD([w], lr=0.1))
    np.testing.assert_array_equal(w.grad, [16.0, 16.0])  # untouched


def test_gradscaler_refuses_an_infinite_init_scale():
    """init_scale=inf was accepted: every loss became inf, every step was skipped, and backing off
    inf * 0.5 stays inf, so training silently never stepped."""
    with pytest.raises(ValueError, match="init_scale must be positive and finite"):
        GradScaler(init_scale=math.inf)


def test_gradscaler_update_without_a_step_raises():
    """update() with no step()/unscale_() since the last update counted a good step that never
    happened and grew the scale (three updates: x8). PyTorch raises here; so does minidist now."""
    scaler = GradScaler(growth_interval=1)
    with pytest.raises(RuntimeError, match="No inf checks were recorded prior to update"):
        scaler.update()
    assert scaler.get_scale() == 2.0**16
    scaler.update(new_scale=4.0)  # setting the scale explicitly needs no step (as PyTorch)
    assert scaler.get_scale() == 4.0


def test_one_autocast_object_entered_inside_itself_restores_float32():
    """The same autocast object entered twice (nested) kept one saved state: the inner entry overwrote
    the outer's "off", so after both blocks autocast stayed on for the rest of the program."""
    ac = md.autocast("bfloat16")
    with ac:
        with ac:
            assert md.is_autocast_enabled()
        assert md.is_autocast_enabled()
    assert not md.is_autocast_enabled()
    off = md.autocast("float16", enabled=False)
    with md.autocast("bfloat16"), off, off:
        assert not md.is_autocast_enabled()
    assert not md.is_autocast_enabled()


def test_a_tracker_stopped_after_fsdp_wrapped_the_model_keeps_fsdps_unit_forwards():
    """MemoryTracker(model) started, then the model wrapped by FSDP inside the tracked span (to measure
    the wrapping too): stop() put the units' original forwards back over FSDP's, so the next forward ran
    a unit on its empty (0, 0) shard placeholders: "input of shape (5, 3) and weight of shape (0, 0)"."""
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    reference = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    reference.load_state_dict(model.state_dict())
    x = md.tensor(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    with memory.MemoryTracker(model) as tracker:
        fsdp = FullyShardedDataParallel(model, wrap=nn.Linear)  # one process: the world of one
        fsdp(x).sum().backward()
    assert tracker.report()["gathered_parameters"]["peak"] > 0
    out = fsdp(x)  # after stop(): still FSDP's gathering forward
    np.testing.assert_array_equal(out.data, reference(x).data)  # one rank: the same arithmetic, bit for bit


def test_autocast_leaves_float64_ops_in_float64():
    """A float64 model under autocast had its matrix products rounded to bfloat16 (8 significant bits
    instead of 53). PyTorch's autocast casts only float32 tensors ("eligible": floating point, not
    double); so does minidist now: the result and the gradients equal the float64 ones bit for bit."""
    md.manual_seed(0)
    layer = nn.Linear(3, 2, dtype="float64")
    x = md.tensor(np.random.default_rng(0).standard_normal((4, 3)), requires_grad=True)
    plain = layer(x) @ layer.weight
    plain.sum().backward()
    expected = [x.grad.copy(), layer.weight.grad.copy()]
    x.grad = layer.weight.grad = layer.bias.grad = None
    with md.autocast("bfloat16"):
        y = layer(x) @ layer.weight
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y.data, plain.data)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, expected[0])
    np.testing.assert_array_equal(layer.weight.grad, expected[1])


def test_out_of_memory_in_an_fsdp_gather_leaves_nothing_counted_and_training_can_go_on():
    """A budget overflowed by an FSDP all-gather (the prefetch of the next unit): the refused gather
    stayed counted forever, and the frees in FSDP's clean-up raised OutOfMemoryError again (every
    change was checked, decreases too) and stopped half-way, a unit left "gathered" on empty arrays.
    Now a free never raises and a refused gather is not counted: with a larger budget it trains on, as
    one plain process."""
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 3))
    reference = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 3))
    reference.load_state_dict(model.state_dict())
    x = md.tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    fsdp = FullyShardedDataParallel(model, wrap=nn.Linear)
    shards = sum(u.flat_shard.nbytes for u in fsdp.units)  # one process: the shards are the model
    # Room for the shards, the small first unit (160 B) and a few activations, not for the second unit
    # (2304 B) and the third (780 B, prefetched while the second computes) gathered together.
    tracker = memory.MemoryTracker(fsdp, budget=shards + 2304 + 200).start()
    try:
        with pytest.raises(memory.OutOfMemoryError, match="exceeds the budget"):
            fsdp(x)
        assert not any(u.gathered for u in fsdp.units)
        assert tracker.report()["gathered_parameters"]["current"] == 0
        assert tracker.report()["communication"]["current"] == 0
        tracker.budget = 10 * shards + 10**5  # enough now: the same model trains on, as one process
        out = fsdp(x)
        out.sum().backward()
    finally:
        tracker.stop()
    np.testing.assert_array_equal(out.data, reference(x).data)  # one process: the same arithmetic
    reference(x).sum().backward()
    got = dict(zip([n for n, _ in model.named_parameters()], [None] * 6))
    for u in fsdp.units:
        for seg, shard in zip(u.layout.segments, u.shards):
            got[u.names[seg.param_index]] = shard.grad
    for name, p in reference.named_parameters():
        np.testing.assert_array_equal(got[name], p.grad.reshape(-1))


def _scaler_steps(scaler, losses):
    """One parameter, one step per loss value: loss = w * value (NaN or inf poisons the gradient).
    float64, so that a huge scale times the loss stays finite (float32 would overflow first)."""
    w = md.tensor(np.array([1.0], dtype=np.float64), requires_grad=True)
    opt = optim.SGD([w], lr=1e-3)
    for value in losses:
        scaler.scale((w * value).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()


def test_gradscaler_never_grows_its_scale_to_inf():
    """Growth multiplied the scale past float's range to inf; from inf every loss is inf, every step
    skipped, and inf * backoff stays inf: training stopped for good. PyTorch keeps the old scale then."""
    scaler = GradScaler(growth_factor=2.0**600, growth_interval=1)
    _scaler_steps(scaler, [1.0, 1.0, 1.0])  # 2^16 -> 2^616 -> (2^1216 = inf: kept)
    assert scaler.get_scale() == 2.0**616 and scaler.skipped_steps == 0


def test_gradscaler_with_a_nan_loss_every_step_says_so_instead_of_dividing_by_zero():
    """A NaN loss every step backs the scale off each step until it underflows to 0.0; then unscale_
    died with "ZeroDivisionError: float division by zero". Now: a RuntimeError saying the loss is NaN."""
    scaler = GradScaler(init_scale=1.0, backoff_factor=1e-200)
    _scaler_steps(scaler, [float("nan"), float("nan")])  # 1 -> 1e-200 -> 0.0 (underflow)
    assert scaler.get_scale() == 0.0 and scaler.skipped_steps == 2
    with pytest.raises(RuntimeError, match="the loss itself is probably inf/NaN"):
        _scaler_steps(scaler, [float("nan")])


def test_parse_size_is_exact_and_never_overflows():
    """parse_size multiplied a float: "1.001MB" was 1000999 bytes (1.001 * 10^6 = 1000999.9999999999,
    rounded down), and a number of 400 digits was an OverflowError instead of a size (the budget check
    compares ints: any int is fine)."""
    assert memory.parse_size("1.001MB") == 1_001_000
    assert memory.parse_size("1.005 MB") == 1_005_000
    assert memory.parse_size("0.5KiB") == 512
    assert memory.parse_size("9" * 400) == int("9" * 400)


def test_a_tracker_nothing_refers_to_any_more_can_still_be_stopped():
    """A tracker started and then lost (a notebook cell run twice: ``t = MemoryTracker(m).start()``)
    kept every later tracker from starting ("already running; stop() it first") with no way to reach
    it. MemoryTracker.running is it."""
    model = nn.Linear(2, 2)
    memory.MemoryTracker(model).start()  # the reference is dropped at once
    try:
        with pytest.raises(RuntimeError, match=r"MemoryTracker.running.stop\(\)"):
            memory.MemoryTracker(model).start()
    finally:  # (a failure here must not leave a tracker running for the next tests)
        memory.MemoryTracker.running.stop()
    assert memory.MemoryTracker.running is None
    with memory.MemoryTracker(model) as tracker:
        assert memory.MemoryTracker.running is tracker
    assert memory.MemoryTracker.running is None
    assert tracker.report()["parameters"]["current"] == 6 * 4  # 2x2 weight + 2 bias, float32


def test_an_optimizer_over_an_fsdp_models_own_parameters_is_refused():
    """AdamW(model.parameters()) after FullyShardedDataParallel(model) trained nothing, silently (the
    loss stayed at 0.07742342 for 3 steps): FSDP leaves empty arrays in the original
    parameters and trains its shard tensors. The optimizer now refuses them and says what to pass."""
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    fsdp = FullyShardedDataParallel(model, wrap=nn.Linear)
    with pytest.raises(ValueError, match=r"sharded by FullyShardedDataParallel .*fsdp\.parameters\(\)"):
        optim.AdamW(model.parameters(), lr=1e-3)
    optim.AdamW(fsdp.parameters(), lr=1e-3)  # the shard tensors: accepted
