"""The GPT model: shapes, parameter count, initialisation, weight tying, generate(),
its errors, gradients by finite differences, and PyTorch as an optional oracle (same weights, same
logits and gradients in float64)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpi_utils import BENCHMARKS

import minidist as md
from minidist.models import GPT, GPTConfig
from minidist.models.gpt.transformer import Block, CausalSelfAttention
from minidist.nn import functional as F

TINY = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)


def _gpt(seed: int = 0, **overrides) -> GPT:
    md.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, "dtype": np.float64, **overrides}))


def _ids(shape: tuple[int, int], vocab: int = TINY["vocab_size"], seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=shape)


def _loss(model: GPT, idx: np.ndarray, targets: np.ndarray) -> md.Tensor:
    logits = model(idx)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def test_forward_shape_and_parameter_count_formula():
    for bias, tie in [(True, True), (False, True), (True, False)]:
        model = _gpt(bias=bias, tie_weights=tie)
        assert model(_ids((3, 5))).shape == (3, 5, TINY["vocab_size"])
        V, T, L, C = TINY["vocab_size"], TINY["block_size"], TINY["n_layer"], TINY["n_embd"]
        # per block: qkv 3C^2, proj C^2, MLP 8C^2 = 12 C^2 weights; biases 3C + C + 4C + C and two
        # LayerNorms (2 x 2C) = 13 C; the final LayerNorm 2C; embeddings VC + TC; an untied head VC.
        expected = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
        if not bias:
            expected -= L * 13 * C - 2 * L * C + C  # no biases: only the LayerNorm gains remain
        if not tie:
            expected += V * C
        assert model.num_parameters() == expected


def test_gpt2_initialisation_statistics():
    md.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=64, n_layer=4, n_head=4, n_embd=128))
    params = dict(model.named_parameters())
    assert np.std(params["h.0.attn.c_attn.weight"].numpy()) == pytest.approx(0.02, rel=0.05)
    assert np.std(params["h.3.mlp.c_proj.weight"].numpy()) == pytest.approx(0.02 / np.sqrt(8), rel=0.05)
    assert np.std(params["wte.weight"].numpy()) == pytest.approx(0.02, rel=0.1)
    assert not params["h.0.mlp.c_fc.bias"].numpy().any()
    assert (params["ln_f.weight"].numpy() == 1).all() and not params["ln_f.bias"].numpy().any()
    assert "lm_head.weight" not in params  # tied: the head is wte.weight


def test_same_seed_same_model_and_state_dict_names():
    a, b = _gpt(seed=3), _gpt(seed=3)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())
    assert "h.1.attn.c_proj.weight" in a.state_dict()


def test_tied_weight_gets_the_gradient_of_both_uses():
    """With tying, wte.weight's gradient is the embedding's part plus the head's part: compare with an
    untied copy whose head holds the same values."""
    tied = _gpt(seed=5)
    untied = _gpt(seed=5, tie_weights=False)
    untied.load_state_dict({**tied.state_dict(), "lm_head.weight": tied.wte.weight.numpy()})
    idx, targets = _ids((2, 6)), _ids((2, 6), seed=2)
    _loss(tied, idx, targets).backward()
    _loss(untied, idx, targets).backward()
    both = untied.wte.weight.grad + untied.lm_head.weight.grad
    np.testing.assert_allclose(tied.wte.weight.grad, both, rtol=0, atol=1e-14)


def test_gradients_match_central_finite_differences_in_float64():
    model = _gpt(seed=7)
    idx, targets = _ids((2, 5)), _ids((2, 5), seed=3)
    _loss(model, idx, targets).backward()
    rng = np.random.default_rng(0)
    for name, p in model.named_parameters():
        for flat in rng.choice(p.data.size, size=2, replace=False):
            i = np.unravel_index(flat, p.shape)
            saved, h = p.data[i], 1e-6
            p.data[i] = saved + h
            up = _loss(model, idx, targets).item()
            p.data[i] = saved - h
            down = _loss(model, idx, targets).item()
            p.data[i] = saved
            assert p.grad[i] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-9), name


def test_causal_attention_never_looks_ahead():
    """Changing token t changes no logit before position t."""
    model = _gpt(seed=1)
    idx = _ids((1, 8))
    changed = idx.copy()
    changed[0, 5] = (idx[0, 5] + 1) % TINY["vocab_size"]
    a, b = model(idx).numpy(), model(changed).numpy()
    np.testing.assert_array_equal(a[:, :5], b[:, :5])
    assert not np.allclose(a[:, 5:], b[:, 5:])


def test_generate_shapes_crop_and_determinism():
    model = _gpt(seed=2)
    prompt = _ids((2, 3))
    out = model.generate(prompt, 12, generator=np.random.default_rng(4))  # 15 > block_size: cropped input
    assert out.shape == (2, 15) and out.dtype == np.int64
    np.testing.assert_array_equal(out[:, :3], prompt)
    assert ((out >= 0) & (out < TINY["vocab_size"])).all()
    again = model.generate(prompt, 12, generator=np.random.default_rng(4))
    np.testing.assert_array_equal(out, again)
    assert model.training  # mode restored


def test_top_k_1_is_greedy_decoding():
    model = _gpt(seed=2)
    prompt = _ids((1, 4))
    out = model.generate(prompt, 1, top_k=1, generator=np.random.default_rng(0))
    with md.no_grad():
        expected = model(prompt).numpy()[0, -1].argmax()
    assert out[0, -1] == expected


def test_low_temperature_concentrates_on_the_argmax():
    model = _gpt(seed=2)
    prompt = _ids((1, 4))
    with md.no_grad():
        expected = model(prompt).numpy()[0, -1].argmax()
    draws = [
        model.generate(prompt, 1, temperature=1e-3, generator=np.random.default_rng(s)) for s in range(5)
    ]
    draws = [d[0, -1] for d in draws]
    assert all(d == expected for d in draws)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_embd": 10, "n_head": 4}, ValueError, "divisible by n_head"),
        ({"n_layer": 0}, ValueError, "n_layer must be a positive"),
        ({"dropout": 1.0}, ValueError, "dropout"),
        ({"vocab_size": 5.5}, TypeError, "vocab_size must be an int, got 5.5"),
        ({"n_embd": "8"}, TypeError, "n_embd must be an int"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        GPTConfig(**{**TINY, **kwargs})


def test_bad_inputs_are_clear_errors():
    model = _gpt()
    with pytest.raises(ValueError, match="longer than block_size=8"):
        model(_ids((1, 9)))
    with pytest.raises(IndexError):
        model(np.array([[0, TINY["vocab_size"]]]))
    with pytest.raises(ValueError, match="temperature"):
        model.generate(_ids((1, 2)), 1, temperature=0)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(_ids((1, 2)), 1, top_k=0)
    with pytest.raises(ValueError, match="temperature"):  # NaN passed the "<= 0" check, then sampled id 0
        model.generate(_ids((1, 2)), 1, temperature=float("nan"))
    with pytest.raises(ValueError, match="prompt is empty"):
        model.generate(np.zeros((1, 0), dtype=np.int64), 1)
    with pytest.raises(ValueError, match=r"\(batch, length\), got shape \(3,\)"):
        model(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="multiple of n_head"):
        CausalSelfAttention(10, 4)


def test_block_is_residual_and_keeps_the_shape():
    md.manual_seed(0)
    block = Block(8, 2, dtype=np.float64)
    x = md.tensor(np.random.default_rng(0).normal(size=(2, 5, 8)))
    assert block(x).shape == (2, 5, 8)


def test_flops_per_token_counts_the_matmuls():
    c = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
    model = GPT(c)
    forward = 4 * (24 * 128**2 + 4 * 64 * 128) + 2 * 128 * 65
    assert model.flops_per_token() == 3 * forward


# ------------------------------------------------------------------------------ PyTorch as the oracle
def test_logits_and_gradients_equal_a_pytorch_gpt_with_the_same_weights():
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(BENCHMARKS))
    from torch_gpt import TorchGPT, load_minidist, torch_name  # noqa: PLC0415

    model = _gpt(seed=11)
    reference = TorchGPT(**{k: TINY[k] for k in TINY}).double()
    load_minidist(reference, {n: p.numpy() for n, p in model.named_parameters()})
    idx, targets = _ids((3, 7)), _ids((3, 7), seed=9)
    loss = _loss(model, idx, targets)
    loss.backward()
    logits = reference(torch.as_tensor(idx))
    flat_targets = torch.as_tensor(targets).reshape(-1)
    t_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat_targets)
    t_loss.backward()
    np.testing.assert_allclose(model(idx).numpy(), logits.detach().numpy(), rtol=0, atol=1e-13)
    assert loss.item() == pytest.approx(t_loss.item(), abs=1e-13)
    t_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        expected = t_params[torch_name(name)].grad.numpy()
        np.testing.assert_allclose(p.grad, expected, rtol=0, atol=1e-12, err_msg=name)
