"""``minidist.autocast``: which ops run in low precision, the rounding they do, their gradients.

Low-precision ops (linear, matmul, attention) must round exactly as the dtype's round-to-nearest-even
(NumPy's float16, ml_dtypes' bfloat16 ``astype``) at the same places as a tensor core: inputs, then the
float32 product, then the result. Their gradients are checked against finite differences of the float64
op, within a bound derived from the rounding; with autocast disabled every op is unchanged (bit for bit).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import strategies as S
from gradcheck import gradcheck, numerical_gradient
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist as md
from minidist import optim
from minidist.autograd.autocast import round_bfloat16
from minidist.models import GPT, GPTConfig
from minidist.nn import functional as F

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
# unit roundoff u = 2^-(mantissa bits + 1): 2^-8 for bfloat16 (7 stored bits), 2^-11 for float16 (10)
UNIT = {BF16: 2.0**-8, F16: 2.0**-11}


def rounded(a: np.ndarray, low: np.dtype) -> np.ndarray:
    """``a`` rounded to ``low`` (the dtype's own round-to-nearest-even), back in float32."""
    return np.asarray(a, dtype=F32).astype(low).astype(F32)


@settings(max_examples=30)
@given(bits=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_round_bfloat16_is_ml_dtypes_round_to_nearest_even(bits):
    # every float32 bit pattern, ties (low half exactly 0x8000), inf and NaN included: CuPy's emulation
    a = np.array(bits + [0x3F808000, 0x3F818000, 0x7F800000, 0xFF800000, 0x7FC00000], np.uint32).view(F32)
    np.testing.assert_array_equal(round_bfloat16(a), rounded(a, BF16))


def test_autocast_rejects_other_dtypes_and_restores_the_outer_setting():
    with pytest.raises(ValueError, match="'bfloat16' or 'float16'"):
        md.autocast(dtype="float64")
    with md.autocast(dtype="float16"):
        with md.autocast(dtype="bfloat16"):
            assert md.get_autocast_dtype() == BF16
        with md.autocast(enabled=False):
            assert not md.is_autocast_enabled()
        assert md.get_autocast_dtype() == F16
    assert md.get_autocast_dtype() is None

    @md.autocast(dtype="bfloat16")  # as a decorator, as torch.autocast
    def inside() -> np.dtype | None:
        return md.get_autocast_dtype()

    assert inside() == BF16 and md.get_autocast_dtype() is None


def test_autocast_is_where_torch_users_look_for_it_too():
    # torch.autocast and torch.amp.autocast are one context manager; so are md.autocast and md.amp's.
    from minidist import amp

    assert amp.autocast is md.autocast
    with amp.autocast(dtype="bfloat16"):
        assert amp.is_autocast_enabled() and amp.get_autocast_dtype() == BF16
    assert not amp.is_autocast_enabled() and amp.get_autocast_dtype() is None


def test_cast_rounds_and_sends_the_gradient_back_in_the_input_dtype():
    x = md.tensor(np.random.default_rng(0).standard_normal((3, 5)).astype(F32), requires_grad=True)
    for low in (BF16, F16):
        y = x.to(low)
        assert y.dtype == low and np.array_equal(y.data, x.data.astype(low))
        seed = np.random.default_rng(1).standard_normal((3, 5)).astype(low)
        y.backward(seed)
        assert x.grad.dtype == F32 and np.array_equal(x.grad, seed.astype(F32))  # d(round)/dx taken as 1
        x.grad = None


def _ops(low: np.dtype, rng: np.random.Generator) -> dict:
    """(function, input arrays) of each low-precision op; float64 inputs, as the finite differences."""
    return {
        "linear": (F.linear, [rng.standard_normal(s) for s in [(2, 3, 4), (5, 4), (5,)]]),
        "matmul": (lambda a, b: a @ b, [rng.standard_normal(s) for s in [(2, 3, 4), (4, 6)]]),
        "attention": (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            [rng.standard_normal((2, 3, 4)) for _ in range(3)],
        ),
    }  # fmt: skip


@settings(max_examples=5, deadline=None)
@given(shape=S.matmul_shapes())
def test_disabled_autocast_changes_nothing_and_gradients_match_finite_differences(shape):
    a_shape, b_shape = shape
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    w = rng.standard_normal((b_shape[-1], a_shape[-1]))  # a Linear weight (out, in) for input a
    with md.autocast(dtype="float16", enabled=False):
        gradcheck(lambda x, y: x @ y, a, b)
        gradcheck(lambda x, weight: F.linear(x, weight), a, w)
        inside = (md.tensor(a) @ md.tensor(b)).data
    assert np.array_equal(inside, (md.tensor(a) @ md.tensor(b)).data) and inside.dtype == np.float64


@pytest.mark.parametrize("low", [BF16, F16], ids=["bfloat16", "float16"])
def test_low_precision_ops_round_exactly_as_the_dtype(low):
    """Forward: round(round(x) @ round(w)^T + round(b)) with float32 accumulation. Backward: each product
    of rounded float32 copies, rounded to the low dtype once (then cast to float32 for a float32 leaf)."""
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(F32) for s in [(6, 4), (3, 4), (3,)])
    g = rng.standard_normal((6, 3)).astype(F32)
    xt, wt, bt = (md.tensor(a, requires_grad=True) for a in (x, w, b))
    with md.autocast(dtype=low.name):
        y = F.linear(xt, wt, bt)
    assert y.dtype == low
    expected = (rounded(x, low) @ rounded(w, low).T + rounded(b, low)).astype(low)
    np.testing.assert_array_equal(y.data, expected)
    y.backward(g.astype(low))
    g_low = rounded(g, low)
    np.testing.assert_array_equal(xt.grad, rounded(g_low @ rounded(w, low), low))
    np.testing.assert_array_equal(wt.grad, rounded(g_low.T @ rounded(x, low), low))
    np.testing.assert_array_equal(bt.grad, rounded(g_low.sum(axis=0), low))
    assert {xt.grad.dtype, wt.grad.dtype, bt.grad.dtype} == {F32}  # master gradients stay float32
    with md.autocast(dtype=low.name):
        z = xt @ wt.T
    np.testing.assert_array_equal(z.data, (rounded(x, low) @ rounded(w, low).T).astype(low))


@pytest.mark.parametrize("low", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("op", ["linear", "matmul", "attention"])
def test_autocast_gradients_match_finite_differences_within_the_rounding(low, op):
    """The analytic gradients of the autocast op against central differences of the float64 op.

    Tolerance: every input, the incoming gradient R and each result are rounded once to the low dtype
    (relative error <= u each); a product of rounded factors is off by <= ~3u of its magnitude, a chain
    of two (attention: scores, softmax, weights, values) by a few times that. 16 u of the largest gradient
    bounds it with room, yet a wrong formula (a missing term or transpose) is off by O(1) of it.
    """
    fn, inputs = _ops(low, np.random.default_rng(2))[op]
    tensors = [md.tensor(a.astype(F32), requires_grad=True) for a in inputs]
    with md.autocast(dtype=low.name):
        out = fn(*tensors)
    seed = rounded(np.random.default_rng(3).standard_normal(out.shape), low)
    out.backward(seed.astype(low))
    for i, (t, x) in enumerate(zip(tensors, inputs)):

        def loss(value, i=i):
            args = [md.tensor(a) for a in inputs]
            args[i] = md.tensor(value)
            return float((fn(*args).data * seed).sum())

        expected = numerical_gradient(loss, x.copy())
        assert t.grad.dtype == F32
        np.testing.assert_allclose(t.grad, expected, rtol=0, atol=16 * UNIT[low] * np.abs(expected).max())


@pytest.mark.parametrize("low", [BF16, F16], ids=["bfloat16", "float16"])
def test_output_dtypes_op_by_op(low):
    rng = np.random.default_rng(0)
    x = md.tensor(rng.standard_normal((4, 8)).astype(F32), requires_grad=True)
    w = md.tensor(rng.standard_normal((8, 8)).astype(F32), requires_grad=True)
    gain, shift = md.tensor(np.ones(8, F32)), md.tensor(np.zeros(8, F32))
    with md.autocast(dtype=low.name):
        h = F.linear(x, w)
        q = h.reshape(1, 4, 8)
        results = {
            "linear": h, "matmul": h @ w, "attention": F.scaled_dot_product_attention(q, q, q),
            "gelu": F.gelu(h), "h * 2": h * 2.0, "reshape": q, "h + x (promotes)": h + x,
            "softmax": F.softmax(h), "log_softmax": F.log_softmax(h),
            "cross_entropy": F.cross_entropy(h, np.arange(4)), "layer_norm": F.layer_norm(h, 8, gain, shift),
            "sum": h.sum(), "mean": h.mean(axis=0), "exp": h.exp(), "log": (h * h).log(),
            "x (float32 input)": x, "relu of x": F.relu(x),
        }  # fmt: skip
        dtypes = {name: t.dtype for name, t in results.items()}
        saved = h._ctx.x  # what the linear op keeps for backward: the low array itself (half the bytes)
    low_ops = {"linear", "matmul", "attention", "gelu", "h * 2", "reshape"}
    assert dtypes == {k: (low if k in low_ops else F32) for k in dtypes}
    assert saved.dtype == low and saved.nbytes == x.data.nbytes // 2
    F.cross_entropy(F.gelu(F.linear(x, w)), np.arange(4)).backward()  # (outside: plain float32, for contrast)
    assert x.grad.dtype == w.grad.dtype == F32


def _train_gpt(dtype: str | None, steps: int = 4) -> tuple[list[float], dict[str, np.ndarray]]:
    md.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=16))
    opt = optim.AdamW(gpt.parameters(), lr=1e-2)
    data, losses = np.random.default_rng(0), []
    x, y = data.integers(0, 17, (4, 8)), data.integers(0, 17, (4, 8))  # one batch, learnt: the loss falls
    for _ in range(steps):
        with md.autocast(dtype=dtype or "bfloat16", enabled=dtype is not None):
            loss = F.cross_entropy(gpt(x).reshape(-1, 17), y.reshape(-1))
        loss.backward()
        assert all(p.grad.dtype == F32 for p in gpt.parameters())  # float32 master gradients
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(p.dtype == F32 for p in gpt.parameters())  # float32 master weights
    return losses, {n: p.numpy() for n, p in gpt.named_parameters()}


def test_bfloat16_and_float16_train_the_gpt_close_to_float32():
    """Four AdamW steps (lr 1e-2): the loss of each step within a bf16 / fp16 tolerance of float32's.

    The logits carry a relative rounding error of a few u (inputs, weights and the result of each of
    the ~5 products on the way rounded once); a cross-entropy of ~2.8 moves by about that times the
    logits' size (~1): 8 u (0.03 for bfloat16, 0.004 for float16) bounds it. AdamW normalises each
    update, so the parameters after 4 steps differ by at most ~4 lr: checked against 4e-2 plus slack.
    """
    reference, weights = _train_gpt(None)
    for low in (BF16, F16):
        losses, trained = _train_gpt(low.name)
        np.testing.assert_allclose(losses, reference, rtol=0, atol=8 * UNIT[low] * 3)
        assert losses[-1] < losses[0]  # it trains
        for name, value in weights.items():
            np.testing.assert_allclose(trained[name], value, rtol=0, atol=5e-2, err_msg=name)


# --- examples/train_gpt.py in mixed precision on 2 ranks matches one process ---
TINY = ["--max-iters", "3", "--eval-interval", "1", "--eval-iters", "1", "--batch-size", "4",
        "--block-size", "16", "--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--sample-tokens", "0",
        "--lr", "2e-3"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from gpt_example import launch  # noqa: PLC0415  (the example's launcher, shared with its own tests)

    runs = {}

    def run(n: int, *flags: str) -> dict[str, np.ndarray]:
        """The example's --out of n ranks (its checkpoints, one per step, in saved["ckpt"])."""
        if (n, flags) not in runs:
            folder = tmp_path_factory.mktemp(f"amp{n}")
            out, ckpt = folder / "out.npz", folder / "ckpt"
            launch(n, *TINY, *flags, "--checkpoint-dir", str(ckpt), "--out", str(out), timeout=120)
            with np.load(out) as saved:
                runs[n, flags] = {**saved, "ckpt": ckpt}
        return runs[n, flags]

    return run


def assert_trains_like_one_process(one: dict, two: dict) -> None:
    """The bounds the next test's docstring derives, for the --out files of one process and of two ranks."""
    one.pop("ckpt"), two.pop("ckpt")
    assert one.keys() == two.keys()
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=0, atol=1e-3)
    assert two["losses"][0] == pytest.approx(one["losses"][0], abs=1e-6)
    assert int(one["skipped_steps"]) == int(two["skipped_steps"])
    diffs = []
    for name in one:
        if name not in ("losses", "val_loss", "train_loss", "skipped_steps"):
            np.testing.assert_allclose(two[name], one[name], rtol=0, atol=2 * 2e-3 * 3, err_msg=name)
            diffs.append(np.abs(two[name] - one[name]).ravel())
    assert np.quantile(np.concatenate(diffs), 0.99) < 2e-4  # the bulk agrees ~10x closer than one update


@pytest.mark.parametrize(
    "flags", [("--dtype", "bfloat16"), ("--dtype", "float16", "--zero", "2")], ids=["bf16-ddp", "fp16-zero2"]
)
def test_train_gpt_mixed_precision_on_2_ranks_matches_one_process(trained, flags):
    """float32 master weights on every rank, the same global batch of 4 windows split 2 + 2.

    Why not bit for bit: a low-precision op rounds its *output*; a weight gradient g^T x is a sum over the
    batch's rows, rounded to bfloat16 (u = 2^-8) once per process: one process rounds the sum of 4 windows'
    terms, two ranks round their halves, and DDP averages those (in float32). The gradients so differ by
    ~u relatively. AdamW turns a gradient into an update of about lr * sign (m / sqrt(v) ~ +-1 in the
    first steps), so most parameters agree far closer than u (measured: 99 % within 2e-5), but one whose
    gradient is within rounding of 0 can step the other way: 2 lr per step at most, 2 * 2e-3 * 3 steps
    = 1.2e-2 after 3 steps (measured max: 2.6e-3). The losses: step 1 is computed before any update, on
    the same rows, so rounds identically; after it they differ by what the parameters do (measured 4e-5).
    """
    one, two = dict(trained(1, *flags)), dict(trained(2, *flags))
    assert_trains_like_one_process(one, two)


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_train_gpt_mixed_precision_under_fsdp_matches_one_process(trained, low):
    """FSDP and mixed precision together: --fsdp on 2 ranks (every Block
    a unit, run under recomputation, whose backward replays the forward's autocast) against ONE plain
    process in the same dtype (float32 master weights in both). The same bound as the DDP case above and
    for the same reason (per-rank rounding of the batch's gradient sums); float16 also agrees on the
    skipped steps, with the GradScaler's inf check agreed over the world (each rank sees only its shards)."""
    one, two = dict(trained(1, "--dtype", low)), dict(trained(2, "--dtype", low, "--fsdp"))
    assert_trains_like_one_process(one, two)


def test_autocast_on_the_cupy_stand_in_emulates_bfloat16_and_runs_float16(monkeypatch):
    """CuPy has no bfloat16: there it is float32 arrays rounded to bfloat16's values (round_bfloat16, bit
    for bit ml_dtypes' rounding). A GPT step under autocast on the stand-in must run (every op on device
    arrays) and give the CPU's loss within bfloat16's rounding: the products round at the same places,
    the elementwise ops between them (gelu, the bias add) round on the CPU only: a few u of the loss."""
    from cupy_stand_in import DeviceArray, install  # noqa: PLC0415

    cpu = {d: _train_gpt(d, steps=1)[0][0] for d in ("bfloat16", "float16")}
    install(monkeypatch)
    for d, loss in cpu.items():
        md.manual_seed(0)
        gpt = GPT(GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=16))
        data = np.random.default_rng(0)
        x, y = data.integers(0, 17, (4, 8)), data.integers(0, 17, (4, 8))
        with md.autocast(dtype=d):
            logits = gpt(x)
            out = F.cross_entropy(logits.reshape(-1, 17), y.reshape(-1))
        assert isinstance(logits.data, DeviceArray)
        assert logits.dtype == (F32 if d == "bfloat16" else F16)  # emulated bfloat16 is float32 storage
        out.backward()
        assert all(isinstance(p.grad, DeviceArray) and p.grad.dtype == F32 for p in gpt.parameters())
        assert out.item() == pytest.approx(loss, abs=8 * UNIT[np.dtype(ml_dtypes.bfloat16)])


def test_train_gpt_float16_resumes_bit_for_bit_with_its_loss_scale(trained, tmp_path):
    """Resumed at step 2 from the 1-process float16 run's checkpoint (the scale and the scaler's counters
    in its extra), the last step is the uninterrupted run's, bit for bit (docs/design.md, property 4:
    resume)."""
    from gpt_example import checkpoint_at_step_2, launch  # noqa: PLC0415

    flags = ("--dtype", "float16", "--zero", "2")
    straight = trained(1, *flags)
    root = checkpoint_at_step_2(straight["ckpt"], tmp_path)
    out = tmp_path / "resumed.npz"
    result = launch(1, *TINY, *flags, "--checkpoint-dir", str(root), "--resume", "--out", str(out))
    assert "resumed from" in result.stdout
    with np.load(out) as resumed:
        for name in resumed.files:
            np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
