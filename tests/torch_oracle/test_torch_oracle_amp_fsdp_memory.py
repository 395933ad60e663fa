"""PyTorch as the oracle of the memory-saving features: autocast, GradScaler, FSDP and the memory tracker.

Skipped without torch (an optional oracle, never a dependency). What is compared, and what differs on
purpose (each difference is also in the docstring of the minidist object):

1. ``minidist.autocast`` vs ``torch.autocast("cpu")``: the low-precision ops (linear, matmul, gelu,
   relu, add) give the same dtype and the same bits; the ops of minidist's float32 list (softmax,
   layer_norm, log_softmax, sum, mean, exp) follow torch's *CUDA* list: float32 out where torch's CPU
   autocast returns the low dtype; rounded to it, the values are torch's bits (except log_softmax,
   which torch's CPU kernel computes in steps of the low dtype). scaled_dot_product_attention: torch's
   CPU kernel rounds the softmax's exponentials to the low dtype before P V, minidist keeps them in
   float32: <= 1 unit in the last place apart. The gradients of a small MLP equal torch's.
2. ``minidist.amp.GradScaler`` vs ``torch.amp.GradScaler("cpu")``: same scales and skipped steps,
   same parameters (SGD, AdamW, with clipping) over a run with an inf and a NaN step, same error texts.
3. ``FullyShardedDataParallel`` on 2 ranks vs the same GPT trained by PyTorch on one process
   (``benchmarks/torch_gpt.py``), AdamW with decay groups and clipping.
4. ``MemoryTracker``'s parameter, gradient and optimizer-state bytes vs PyTorch's tensors' bytes.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpi_utils import BENCHMARKS

import minidist as md
import minidist.nn.utils as md_utils
from minidist import memory
from minidist.amp import GradScaler
from minidist.nn import functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

sys.path.insert(0, str(BENCHMARKS))
import fsdp_common as fc  # noqa: E402
from mpi_utils import run_mpi  # noqa: E402
from torch_gpt import TorchGPT, load_minidist, torch_name  # noqa: E402

LOW = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _np(t) -> np.ndarray:
    """A torch tensor's values as float32 NumPy (bfloat16 has no NumPy dtype of torch's)."""
    return t.detach().float().numpy()


def _low(a: np.ndarray, name: str) -> np.ndarray:
    """``a`` rounded to the low dtype ``name`` and back to float32 (overflowing to inf, as torch's
    float16 exp does where minidist's float32 exp stays finite)."""
    with np.errstate(over="ignore"):
        return a.astype(md.autograd.autocast.low_precision_dtype(name)).astype(np.float32)


def _ulps(a: np.ndarray, b: np.ndarray, name: str) -> float:
    """The largest |a - b| in units in the last place of the low dtype ``name`` at b (8 significant
    bits for bfloat16, 11 for float16; float16's subnormal spacing 2^-24 at the bottom)."""
    bits = 8 if name == "bfloat16" else 11
    exponent = np.floor(np.log2(np.maximum(np.abs(b), 2.0**-14)))
    return float(np.max(np.abs(a - b) / 2.0 ** (exponent - bits + 1)))


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((4, 8, 16)).astype(np.float32),
        "w": rng.standard_normal((12, 16)).astype(np.float32),
        "b": rng.standard_normal(12).astype(np.float32),
        "m": rng.standard_normal((16, 16)).astype(np.float32),
        "ln_w": rng.standard_normal(16).astype(np.float32),
        "ln_b": rng.standard_normal(16).astype(np.float32),
    }


# op: (minidist, torch), each a function of the library's module (F / TF) and the inputs; "h" is the
# product x @ m made inside autocast (a low-precision input for the next op).
def _ops():
    return {
        "linear": lambda f, t, lib: f.linear(t["x"], t["w"], t["b"]),
        "matmul": lambda f, t, lib: t["h"],
        "gelu": lambda f, t, lib: f.gelu(t["h"]),
        "relu": lambda f, t, lib: f.relu(t["h"]),
        "add_low_low": lambda f, t, lib: t["h"] + t["h"],
        "add_low_float32": lambda f, t, lib: t["h"] + t["x"],
        "softmax": lambda f, t, lib: f.softmax(t["h"], dim=-1),
        "log_softmax": lambda f, t, lib: f.log_softmax(t["h"], dim=-1),
        "layer_norm": lambda f, t, lib: f.layer_norm(t["h"], (16,), t["ln_w"], t["ln_b"]),
        "exp": lambda f, t, lib: t["h"].exp(),
        "sum": lambda f, t, lib: t["h"].sum(),
        "mean": lambda f, t, lib: t["h"].mean(),
    }


LOW_PRECISION_OPS = ("linear", "matmul", "gelu", "relu", "add_low_low")  # low in torch CPU and here
FLOAT32_LIST = ("softmax", "log_softmax", "layer_norm", "exp", "sum", "mean")  # torch CUDA's fp32 list


def _run_ops(name: str) -> dict[str, tuple]:
    data = _data()
    mt = {k: md.tensor(v) for k, v in data.items()}
    tt = {k: torch.tensor(v) for k, v in data.items()}
    out = {}
    with md.autocast(name):
        mt["h"] = mt["x"] @ mt["m"]
        mine = {op: fn(F, mt, md) for op, fn in _ops().items()}
    with torch.autocast("cpu", dtype=LOW[name]):
        tt["h"] = tt["x"] @ tt["m"]
        theirs = {op: fn(TF, tt, torch) for op, fn in _ops().items()}
    for op in mine:
        out[op] = (mine[op], theirs[op])
    return out


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_autocast_dtypes_and_values_per_op_against_torch_cpu(name):
    results = _run_ops(name)
    low = md.autograd.autocast.low_precision_dtype(name)
    for op in LOW_PRECISION_OPS:
        mine, theirs = results[op]
        assert mine.dtype == low and theirs.dtype == LOW[name], op
        if op == "gelu":
            # Both compute x/2 (1 + erf(x/sqrt 2)) in float32 and round once, with different erf codes;
            # in the negative tail 1 + erf cancels (float32 absolute error ~|x| 2^-24 < 1e-6), so a few
            # values land on the other side of a rounding boundary: 1 ulp of the low dtype (2^-7
            # relative for bfloat16, 2^-10 for float16) or 1e-6 absolute apart, torch no closer to
            # the float64 value than minidist (measured: 75% vs 77% of the rounded float64 values).
            rtol = 2.0**-7 if name == "bfloat16" else 2.0**-10
            np.testing.assert_allclose(mine.data.astype(np.float32), _np(theirs), rtol=rtol, atol=1e-6)
            continue
        # Both multiply the rounded inputs with float32 accumulation and round the result once: the
        # products here are short enough (16 terms) that the accumulation order changes no bit.
        np.testing.assert_array_equal(mine.data.astype(np.float32), _np(theirs), err_msg=op)
    mine, theirs = results["add_low_float32"]  # low + float32 promotes to float32 in both
    assert mine.dtype == np.float32 and theirs.dtype == torch.float32
    np.testing.assert_array_equal(mine.data, _np(theirs))
    for op in FLOAT32_LIST:
        mine, theirs = results[op]
        # Deliberate difference (autograd/autocast.py): minidist follows torch's CUDA float32 list, so
        # these return float32; torch's CPU autocast returns the low dtype (computed in float32 inside).
        assert mine.dtype == np.float32 and theirs.dtype == LOW[name], op
        rounded = _low(np.asarray(mine.data), name)
        if op == "log_softmax":
            # torch's CPU kernel rounds its intermediates (log(sum) among them) to the low dtype, so
            # it is the less accurate one: the outputs are <= 2 ulps apart where |y| >= 1, and near 0
            # (the row's maximum, y = -log(sum)) apart by up to one ulp of log(sum) < log(16) < 4
            # (2^-6 bfloat16, 2^-9 float16), e.g. torch's 0 for minidist's (and float64's) -0.0025.
            b = _np(theirs)
            big = np.abs(b) >= 1
            assert _ulps(rounded[big], b[big], name) <= 2, op
            np.testing.assert_allclose(
                rounded[~big], b[~big], rtol=0, atol=2.0 ** (-6 if name == "bfloat16" else -9)
            )
        else:  # float32 computation rounded once: torch's bits exactly
            np.testing.assert_array_equal(rounded, _np(theirs), err_msg=op)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_autocast_attention_differs_from_torch_cpu_by_at_most_one_ulp(name):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 2, 8, 16)).astype(np.float32) for _ in range(3))
    with md.autocast(name):
        mine = F.scaled_dot_product_attention(md.tensor(q), md.tensor(k), md.tensor(v), is_causal=True)
    with torch.autocast("cpu", dtype=LOW[name]):
        theirs = TF.scaled_dot_product_attention(
            torch.tensor(q), torch.tensor(k), torch.tensor(v), is_causal=True
        )
    assert mine.dtype == md.autograd.autocast.low_precision_dtype(name) and theirs.dtype == LOW[name]
    a, b = mine.data.astype(np.float32), _np(theirs)
    # torch's CPU kernel rounds the softmax's exponentials to the low dtype before P V; minidist keeps P
    # in float32 (ops/attention.py). Rounding each weight (relative error <= 2^-bits, bits = 8 or 11)
    # moves an output, a convex combination of values, by <= 2^-bits max|V|: that bounds |a - b|.
    bits = 8 if name == "bfloat16" else 11
    vmax = np.abs(v.astype(mine.dtype).astype(np.float32)).max()
    np.testing.assert_allclose(a, b, rtol=0, atol=2.0**-bits * vmax)
    assert np.mean(a == b) > 0.5  # and most outputs are the same bits (75% measured)
    # minidist is no farther from the exact attention of the rounded inputs (float64) than torch.
    qq, kk, vv = (t.astype(mine.dtype).astype(np.float64) for t in (q, k, v))
    scores = qq @ kk.swapaxes(-1, -2) / 4 + np.triu(np.full((8, 8), -np.inf), 1)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    exact = (weights / weights.sum(-1, keepdims=True)) @ vv
    assert np.abs(a - exact).max() <= np.abs(b - exact).max()


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_autocast_master_gradients_equal_torch_cpu(name):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 8, 16)).astype(np.float32)
    arrays = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((32, 16), (32,), (10, 32))]
    targets = rng.integers(0, 10, 32)
    mp = [md.tensor(a, requires_grad=True) for a in arrays]
    tp = [torch.tensor(a, requires_grad=True) for a in arrays]
    with md.autocast(name):
        logits = F.linear(F.gelu(F.linear(md.tensor(x), mp[0], mp[1])), mp[2]).reshape(32, 10)
        loss_m = F.cross_entropy(logits, md.tensor(targets))
    loss_m.backward()
    with torch.autocast("cpu", dtype=LOW[name]):
        logits = TF.linear(TF.gelu(TF.linear(torch.tensor(x), tp[0], tp[1])), tp[2]).reshape(32, 10)
        loss_t = TF.cross_entropy(logits, torch.tensor(targets))
    loss_t.backward()
    assert loss_m.dtype == np.float32 and loss_t.dtype == torch.float32  # cross_entropy: float32 in both
    # The loss: float32 log-sum-exp in both, summed in another order: a few float32 ulps.
    np.testing.assert_allclose(loss_m.data, loss_t.item(), rtol=1e-6)
    for a, b in zip(mp, tp):
        assert a.grad.dtype == np.float32 and b.grad.dtype == torch.float32  # float32 master gradients
        # bfloat16: equal to the bit. float16: gelu's 1-ulp differences (above) move one product's
        # rounding, 1 ulp of float16 (2^-11 relative) in a handful of gradient entries.
        np.testing.assert_allclose(
            a.grad, b.grad.numpy(), rtol=0, atol=2.0**-11 * np.abs(b.grad.numpy()).max()
        )


# ---------------------------------------------------------------------------------------- GradScaler
def _scaler_run(opt_name: str):
    """The same 8 steps (step 2 has an inf gradient, step 5 a NaN) in both libraries; per step the
    scale, the parameters, and at the end the state_dicts."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(5).astype(np.float32)
    xs = [rng.standard_normal(5).astype(np.float32) for _ in range(8)]
    xs[2][1], xs[5][0] = np.inf, np.nan
    kwargs = {"momentum": 0.9} if opt_name == "SGD" else {"weight_decay": 0.1}
    wm, wt = md.tensor(w0.copy(), requires_grad=True), torch.tensor(w0.copy(), requires_grad=True)
    om = getattr(md.optim, opt_name)([wm], lr=0.1, **kwargs)
    ot = getattr(torch.optim, opt_name)([wt], lr=0.1, **kwargs)
    sm = GradScaler(init_scale=2.0**4, growth_interval=2)
    st = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=2)
    rows = []
    for x in xs:
        om.zero_grad()
        ot.zero_grad()
        sm.scale(((wm * md.tensor(x)) ** 2).sum()).backward()
        st.scale(((wt * torch.tensor(x)) ** 2).sum()).backward()
        sm.unscale_(om)
        st.unscale_(ot)
        md_utils.clip_grad_norm_([wm], 1.0)
        torch.nn.utils.clip_grad_norm_([wt], 1.0)
        sm.step(om)
        st.step(ot)
        sm.update()
        st.update()
        rows.append((sm.get_scale(), st.get_scale(), wm.data.copy(), wt.detach().numpy().copy()))
    return rows, sm, st


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
def test_grad_scaler_matches_torch_scales_skips_and_parameters(opt_name):
    rows, sm, st = _scaler_run(opt_name)
    assert [r[0] for r in rows] == [r[1] for r in rows] == [16, 32, 16, 16, 32, 16, 16, 32]
    assert sm.skipped_steps == 2  # minidist's count (torch counts none): steps 2 and 5
    for _, _, mine, theirs in rows:
        # The clipping norm and AdamW's update are float32 sums and square roots taken in another
        # order than torch's: ~1 float32 ulp per step (measured <= 4e-8 absolute on values ~1 after 8
        # steps); a wrong unscale (a factor 2) or a step taken on an inf would move them by >= 1e-2.
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
    theirs_state = st.state_dict()
    mine_state = sm.state_dict()
    assert set(mine_state) == set(theirs_state) | {"skipped_steps"}  # one extra key, documented
    assert {k: mine_state[k] for k in theirs_state} == theirs_state
    again = torch.amp.GradScaler("cpu")
    again.load_state_dict(mine_state)  # torch reads minidist's state (ignores the extra key)...
    assert again.get_scale() == sm.get_scale()
    back = GradScaler()
    back.load_state_dict(theirs_state)  # ...and minidist reads torch's
    assert back.get_scale() == st.get_scale() and back.skipped_steps == 0


def _misuse(scaler, optimizer, w):
    """The error text (or "ok") of each misuse, in order, on a scaler of either library."""

    def attempt(fn):
        try:
            fn()
            return "ok"
        except (RuntimeError, AssertionError) as e:
            return str(e)

    scaler.scale((w * w).sum()).backward()
    scaler.unscale_(optimizer)
    texts = [attempt(lambda: scaler.unscale_(optimizer))]
    scaler.step(optimizer)
    texts += [attempt(lambda: scaler.step(optimizer)), attempt(lambda: scaler.unscale_(optimizer))]
    scaler.update()
    texts += [attempt(scaler.update), attempt(lambda: scaler.load_state_dict({}))]
    return texts, scaler.get_scale()


def test_grad_scaler_misuse_raises_torchs_texts():
    w0 = np.ones(3, dtype=np.float32)
    wm, wt = md.tensor(w0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    mine, mine_scale = _misuse(GradScaler(), md.optim.SGD([wm], lr=0.1), wm)
    theirs, theirs_scale = _misuse(torch.amp.GradScaler("cpu"), torch.optim.SGD([wt], lr=0.1), wt)
    assert mine == theirs
    assert "prior to update" in mine[3]  # update() with no step since the last: an error, not a good step
    assert mine_scale == theirs_scale == 2.0**16  # and the scale did not grow


def test_grad_scaler_accepts_torchs_device_argument_and_getters():
    scaler = GradScaler("cpu", init_scale=8.0, growth_interval=3)  # torch.amp.GradScaler's signature
    reference = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    for getter in ("get_scale", "get_growth_factor", "get_backoff_factor", "get_growth_interval"):
        assert getattr(scaler, getter)() == getattr(reference, getter)(), getter
    for setter, value in (
        ("set_growth_factor", 4.0),
        ("set_backoff_factor", 0.25),
        ("set_growth_interval", 5),
    ):
        getattr(scaler, setter)(value)
        getattr(reference, setter)(value)
    assert scaler.state_dict().items() >= reference.state_dict().items()
    with pytest.raises(ValueError, match="device"):
        GradScaler("tpu")


# ---------------------------------------------------------------------------------------- FSDP
@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_torch")
    run_mpi(2, "fsdp/fsdp_torch_oracle.py", out, timeout=120)
    with np.load(out / "rank0.npz") as archive:
        return dict(archive)


def test_fsdp_on_two_ranks_equals_pytorch_on_one_process(fsdp_run):
    init = {k[5:]: v for k, v in fsdp_run.items() if k.startswith("init.")}
    final = {k[6:]: v for k, v in fsdp_run.items() if k.startswith("final.")}
    model = TorchGPT(**{k: v for k, v in fc.GPT_CONFIG.items()}).double()
    load_minidist(model, init)
    params = dict(model.named_parameters())
    decay = [p for p in params.values() if p.ndim >= 2]
    groups = [
        {"params": decay, "weight_decay": 0.1},
        {"params": [p for p in params.values() if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=0.01)  # fsdp_common.OPTIMIZERS["adamw"]
    norms = []
    for xb, yb in fc.gpt_batches():
        optimizer.zero_grad()
        logits = model(torch.tensor(xb))
        # fsdp_common.train: the summed loss over the global batch divided by its rows (not tokens)
        loss = TF.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), torch.tensor(yb).reshape(-1), reduction="sum"
        ) / len(xb)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), fc.CLIP)))
        optimizer.step()
    # float64 throughout: the two differ only in the order of sums (two ranks' partial gradients, the
    # shards' partial norms, torch's own kernels): ~1e-16 relative per op. AdamW divides by sqrt(v),
    # which amplifies the relative error of tiny gradients (test_fsdp.py measured 7.6e-15 between
    # minidist's 1 and N ranks after 4 steps); 1e-10 still catches any real error (a missing 1/N, an
    # unclipped step, weight decay on a bias move parameters by >= 1e-4) by six orders of magnitude.
    np.testing.assert_allclose(fsdp_run["norms"], norms, rtol=1e-10)
    assert set(final) == {n for n, _ in model.named_parameters()} or set(map(torch_name, final)) == set(
        params
    )
    for name, value in final.items():
        np.testing.assert_allclose(
            value, params[torch_name(name)].detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=name
        )


def test_fsdp_has_torchs_method_names():
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP

    from minidist.parallel import FullyShardedDataParallel

    for name in (
        "forward",
        "no_sync",
        "summon_full_params",
        "clip_grad_norm_",
        "state_dict",
        "load_state_dict",
        "named_parameters",
        "zero_grad",
    ):
        assert callable(getattr(FullyShardedDataParallel, name, None)), name
        assert callable(getattr(TorchFSDP, name, None)), name


# ---------------------------------------------------------------------------------------- memory
@pytest.mark.parametrize(("opt_name", "low"), [("AdamW", None), ("SGD", "bfloat16")])
def test_memory_tracker_bytes_equal_what_torch_holds(opt_name, low):
    """After a step (AdamW in float32; SGD with momentum under bfloat16 autocast, float32 master
    weights in both) and after zero_grad (gradients set to None in both)."""
    from minidist.models import GPT, GPTConfig

    config = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    md.manual_seed(0)
    gpt = GPT(GPTConfig(**config))
    kwargs = {"momentum": 0.9} if opt_name == "SGD" else {}
    opt = getattr(md.optim, opt_name)(gpt.parameters(), lr=1e-3, **kwargs)
    model = TorchGPT(**config)
    load_minidist(model, {n: p.data for n, p in gpt.named_parameters()})
    topt = getattr(torch.optim, opt_name)(model.parameters(), lr=1e-3, **kwargs)
    ids = np.random.default_rng(0).integers(0, 11, (2, 9))
    with memory.MemoryTracker(gpt, opt) as tracker:
        with md.autocast(low or "bfloat16", enabled=low is not None):
            loss = F.cross_entropy(gpt(ids[:, :-1]).reshape(-1, 11), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        report = tracker.report()
        opt.zero_grad()
        cleared = tracker.report()["gradients"]["current"]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low is not None):
        logits = model(torch.tensor(ids[:, :-1]))
        loss = TF.cross_entropy(logits.reshape(-1, 11), torch.tensor(ids[:, 1:]).reshape(-1))
    loss.backward()
    topt.step()

    def nbytes(tensors):
        return sum(
            t.untyped_storage().nbytes()
            for t in {t.untyped_storage().data_ptr(): t for t in tensors}.values()
        )

    tparams = list(model.parameters())  # the tied embedding once, in both
    assert report["parameters"]["current"] == nbytes(tparams)
    assert report["gradients"]["current"] == nbytes(p.grad for p in tparams)
    if opt_name == "SGD":
        assert report["optimizer_state"]["current"] == nbytes(
            s["momentum_buffer"] for s in topt.state.values()
        )
    else:
        moments = [s[k] for s in topt.state.values() for k in ("exp_avg", "exp_avg_sq")]
        # torch also keeps each parameter's step count as a float32 tensor (4 bytes); minidist a
        # Python int (not an array, not counted): the only difference.
        steps = [s["step"] for s in topt.state.values()]
        assert (
            report["optimizer_state"]["current"]
            == nbytes(moments)
            == nbytes(moments + steps) - 4 * len(steps)
        )
    topt.zero_grad()
    assert cleared == 0 and all(p.grad is None for p in tparams)


# ---------------------------------------------------------------------------------------- autocast API
def test_autocast_takes_torchs_arguments_and_leaves_float64_alone():
    # torch's dtype objects and device_type arguments, as a PyTorch user passes them
    assert md.autocast("cpu", dtype=torch.bfloat16).dtype == md.autograd.autocast.low_precision_dtype(
        "bfloat16"
    )
    assert md.autocast("cuda", dtype=torch.float16).dtype == np.float16
    with md.autocast("cpu", dtype=torch.float16):
        assert md.is_autocast_enabled("cpu") is True
        assert md.get_autocast_dtype("cpu") == np.float16
    assert md.is_autocast_enabled("cpu") is False and md.get_autocast_dtype("cpu") is None
    # float64 is not autocast-eligible in torch: a float64 product stays float64, bit for bit
    a, b = np.random.default_rng(4).standard_normal((2, 3, 3))
    with md.autocast("bfloat16"):
        mine = md.tensor(a) @ md.tensor(b)
        linear = F.linear(md.tensor(a), md.tensor(b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = torch.tensor(a) @ torch.tensor(b)
    assert mine.dtype == np.float64 and theirs.dtype == torch.float64 and linear.dtype == np.float64
    np.testing.assert_array_equal(mine.data, a @ b)  # NumPy's float64 product, unrounded
    # torch's float64 kernel sums the 3 terms with FMAs or in another order: a few ulps of float64
    np.testing.assert_allclose(mine.data, theirs.numpy(), rtol=1e-14, atol=1e-15)


def test_grad_scaler_refuses_float16_parameters_as_torch():
    w0 = np.ones(3, dtype=np.float16)
    wm, wt = md.tensor(w0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    texts = []
    for scaler, optimizer, w in (
        (GradScaler(init_scale=4.0), md.optim.SGD([wm], lr=0.1), wm),  # (2^16 overflows float16)
        (torch.amp.GradScaler("cpu", init_scale=4.0), torch.optim.SGD([wt], lr=0.1), wt),
    ):
        scaler.scale((w * w).sum()).backward()
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients.") as info:
            scaler.step(optimizer)
        texts.append(str(info.value))
    assert texts[0].startswith(texts[1])  # torch's text, then minidist's advice
    np.testing.assert_array_equal(wm.data, w0)  # no step taken
