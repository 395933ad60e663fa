"""The GPT on the GPU code path, without a GPU: a training step on the CuPy stand-in
(tests/helpers/cupy_stand_in.py) equals the CPU's to the last bit. Every op must take its array module from
its input (every op must work on CuPy arrays too); the stand-in refuses what CuPy refuses (a host
array in device arithmetic, implicit conversion to NumPy) and any ``np.`` function on device data, so an op
that breaks the rule fails
here. With a real GPU, tests/backend/test_gpu.py compares the devices themselves."""

from __future__ import annotations

import numpy as np
import pytest
from cupy_stand_in import DeviceArray, install

import minidist as md
from minidist import optim
from minidist.models import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.parallel import clip_grad_norm_


def train_two_steps(vocab_size: int) -> tuple[list[float], dict[str, np.ndarray], np.ndarray, type]:
    """Two AdamW steps with clipping and dropout (embedding, attention, residual), then a sample."""
    md.manual_seed(0)
    config = GPTConfig(
        vocab_size=vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.1, dtype=np.float64
    )
    gpt = GPT(config)
    opt = optim.AdamW(gpt.parameters(), lr=1e-2)
    data = np.random.default_rng(0)
    losses = []
    for _ in range(2):
        x, y = data.integers(0, vocab_size, (3, 8)), data.integers(0, vocab_size, (3, 8))  # host ids, as
        loss = F.cross_entropy(gpt(x).reshape(-1, vocab_size), y.reshape(-1))  # RandomWindows gives them
        loss.backward()
        clip_grad_norm_(gpt.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    sample = gpt.generate(np.zeros((1, 1), dtype=np.int64), 4, top_k=3, generator=np.random.default_rng(1))
    return losses, {n: p.numpy() for n, p in gpt.named_parameters()}, sample, type(gpt.wte.weight.data)


# 11: the embedding's backward as a one-hot matmul; 300: as a scatter-add (cupyx.scatter_add on the GPU).
@pytest.mark.parametrize("vocab_size", [11, 300])
def test_gpt_training_step_on_the_cupy_stand_in_equals_the_cpu(monkeypatch, vocab_size):
    cpu = train_two_steps(vocab_size)
    install(monkeypatch)
    device = train_two_steps(vocab_size)
    assert cpu[3] is np.ndarray and device[3] is DeviceArray  # the weights really lived on the "device"
    assert device[0] == cpu[0]  # the same NumPy operations underneath: bit for bit
    for name, value in cpu[1].items():
        np.testing.assert_array_equal(device[1][name], value, err_msg=name)
    np.testing.assert_array_equal(device[2], cpu[2])


def test_the_stand_in_refuses_what_cupy_refuses(monkeypatch):
    cupy = install(monkeypatch)
    device, host = cupy.ones(3), np.ones(3)
    for mistake in (
        lambda: device * host,  # host data in device arithmetic
        lambda: cupy.exp(host),
        lambda: np.exp(device),  # np. on device data (the array module's rule)
        lambda: np.asarray(device),  # implicit device -> host copy
    ):
        with pytest.raises(TypeError):
            mistake()
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray"):
        device[...] = host
    device[np.array([0, 2])] = host[:2]  # an array index copies host values in, as CuPy does
    np.testing.assert_array_equal(device.get(), [1.0, 1.0, 1.0])
