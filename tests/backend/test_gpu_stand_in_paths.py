"""The CuPy paths that the GPT stand-in test does not reach, kept tested without a GPU.

With tests/helpers/cupy_stand_in.py as the array backend (device arrays that refuse ``np.`` functions and
implicit host copies, as CuPy does), each path must give the CPU's numbers bit for bit (the same NumPy
operations underneath): every ``nn.functional`` op and the Tensor methods through backward, SGD and AdamW with
the 1-, 2- and infinity-norm clipping and a schedule, recomputation, a checkpoint saved and loaded into device
arrays, and, on 2 MPI ranks, DDP with each communication hook, ZeRO stages 1 and 2, and a 2-stage
pipeline (1F1B and interleaved). Two faults these tests guard against: the infinity-norm clipping
applying ``np.maximum`` to a device array, and the stand-in itself lacking ``cupy.linalg`` (PowerSGD's
``xp.linalg.norm``) and ``ndarray.device`` (DDP's communication thread makes the array's GPU current with
it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cupy_stand_in import DeviceArray, install
from mpi_utils import run_mpi

import minidist as md
from minidist import backend, checkpoint, nn, optim
from minidist.nn import functional as F
from minidist.nn.recompute import recompute
from minidist.nn.utils import clip_grad_norm_
from minidist.optim.lr_scheduler import cosine_with_warmup


def host(value):
    return backend.to_numpy(value) if hasattr(value, "shape") else value


def ops_forward_backward() -> list:
    """Every functional op and the Tensor methods, summed into one loss; the loss and the gradients."""
    md.manual_seed(0)
    rng = np.random.default_rng(0)
    x, w = (md.tensor(rng.standard_normal(s), dtype=np.float64, requires_grad=True) for s in ((3, 4), (5, 4)))
    b = md.tensor(rng.standard_normal(5), dtype=np.float64, requires_grad=True)
    h = F.linear(x, w, b)  # (3, 5)
    y = (F.relu(h) + F.tanh(h) * F.sigmoid(h) + F.softmax(h, -1) - F.log_softmax(h, -1) + F.gelu(h)).sum()
    y = y + (h.exp().log() ** 2).mean() + h.max() + h.max(axis=-1).sum() + h[1:, ::2].sum()
    y = y + h.reshape(5, 3).transpose(0, 1).sum() + h.permute(1, 0).sum()
    y = y + (2.0 / (h * h + 1) - (1 - h)).mean()
    y = y + F.cross_entropy(h, np.array([0, 2, 4])) + F.dropout(h, 0.5, training=True).sum()
    norm, embed = nn.LayerNorm(5, dtype=np.float64), nn.Embedding(7, 5, dtype=np.float64)
    y = y + (norm(h) ** 2).sum() + (embed(np.array([[1, 2], [3, 1]])) ** 2).sum()
    q = h.reshape(1, 3, 5)
    y = y + F.scaled_dot_product_attention(q, q, q, is_causal=True).sum()
    y = y + F.scaled_dot_product_attention(q, q, q, attn_mask=np.tril(np.ones((3, 3), bool))).sum()
    y.backward()
    return [y.item(), x.grad, w.grad, b.grad, embed.weight.grad, norm.weight.grad, norm.bias.grad]


def optimizer_steps() -> list:
    """Three steps of each optimizer with each clipping norm and a warmup-cosine schedule."""
    out = []
    for make in (
        lambda p: optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
        lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1),
    ):
        for norm_type in (2.0, 1.0, float("inf")):
            md.manual_seed(0)
            layers = nn.Linear(4, 8, dtype=np.float64), nn.Tanh(), nn.Linear(8, 2, dtype=np.float64)
            model = nn.Sequential(*layers)
            opt = make(model.parameters())
            schedule = cosine_with_warmup(opt, 1, 3)
            for i in range(3):
                loss = (model(md.tensor(np.full((2, 4), i + 1.0), dtype=np.float64)) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                out.append(clip_grad_norm_(model.parameters(), 0.1, norm_type=norm_type))
                opt.step()
                schedule.step()
            out += [p.data for p in model.parameters()]
    return out


def recomputed() -> list:
    md.manual_seed(0)
    layer = nn.Linear(4, 4, dtype=np.float64)
    x = md.tensor(np.ones((2, 4)), dtype=np.float64, requires_grad=True)
    y = recompute(lambda t: F.dropout(F.gelu(layer(t)), 0.3, training=True), x).sum()  # same mask twice
    y.backward()
    return [y.item(), x.grad, layer.weight.grad]


def checkpoint_round_trip(folder) -> list:
    """Save after a step, load into a model of other weights, step again: the loaded model's weights."""

    def make(seed: int):
        md.manual_seed(seed)
        model = nn.Sequential(nn.Linear(4, 8, dtype=np.float64), nn.Linear(8, 2, dtype=np.float64))
        return model, optim.AdamW(model.parameters(), lr=0.01)

    def step(model, opt) -> None:
        (model(md.tensor(np.ones((2, 4)), dtype=np.float64)) ** 2).mean().backward()
        opt.step()

    model, opt = make(0)
    step(model, opt)
    checkpoint.save(folder, model, opt, step=1)
    loaded, loaded_opt = make(1)
    checkpoint.load(folder / "step_000000001", loaded, loaded_opt)
    step(loaded, loaded_opt)  # the AdamW moments came back too: the step equals one without the round trip
    assert all(type(p.data) is type(model[0].weight.data) for p in loaded.parameters())  # stayed on device
    return [p.data for p in loaded.parameters()]


@pytest.mark.parametrize("path", ["ops", "optimizers", "recompute", "checkpoint"])
def test_the_path_on_the_cupy_stand_in_equals_the_cpu(path, monkeypatch, tmp_path):
    run = {
        "ops": ops_forward_backward,
        "optimizers": optimizer_steps,
        "recompute": recomputed,
        "checkpoint": lambda: checkpoint_round_trip(tmp_path / backend.xp().__name__),
    }[path]
    cpu = run()
    install(monkeypatch)
    device = run()
    assert any(isinstance(v, DeviceArray) for v in device if not isinstance(v, float))  # really on "device"
    assert len(device) == len(cpu)
    for i, (d, c) in enumerate(zip(device, cpu, strict=True)):
        np.testing.assert_array_equal(host(d), host(c), err_msg=f"{path} item {i}")


@pytest.mark.mpi
def test_data_parallelism_on_the_cupy_stand_in_equals_the_cpu(tmp_path):
    run_mpi(2, "training/stand_in_paths.py", tmp_path, timeout=120)
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for case, result in report.items():
            assert "error" not in result, f"rank {rank}, {case}: {result.get('error')}"
            # the same NumPy operations underneath, in the same order: bit for bit
            assert result == {"on_device": True, "losses_equal": True, "max_diff": 0.0}, (rank, case)
        assert len(report) == 9


def test_the_stand_in_has_what_minidist_uses_of_cupy(monkeypatch):
    cupy = install(monkeypatch)
    a = cupy.asarray(np.array([3.0, 4.0]))
    assert float(cupy.linalg.norm(a)) == 5.0  # submodules take device arrays, as CuPy's do
    with pytest.raises(TypeError):
        cupy.linalg.norm(np.array([3.0, 4.0]))  # and refuse host arrays
    with a.device:  # ndarray.device: the GPU holding it, a context that makes it current
        pass
    bits = a.view(np.uint64)  # bit operators, as the bfloat16 emulation on CuPy uses them
    assert ((bits >> 52) << 52).get().tolist() == [0x4000000000000000, 0x4010000000000000]  # 2.0, 4.0
    import ml_dtypes
    from cupyx.scipy.special import erf

    with pytest.raises(TypeError, match="bfloat16"):  # cupyx has no bfloat16 kernels (cupy/cupy#9630)
        erf(a.astype(ml_dtypes.bfloat16))
