"""Pipeline parallelism for the GPT: ``GPT.pipeline_layers()`` equals the GPT,
stages carry GPT's parameter names, and the tied token table stays one weight across two stages.

``ParallelGPT.pipeline_layers()`` (tp 2 x pp 2) ties each tp rank's vocabulary shard the same way.

On one process: the Sequential's logits and gradients are the GPT's, bit for bit, and any cut of it
names its parameters as the GPT does. On 2 and 4 MPI ranks (float64): 3 AdamW steps (gradients
clipped by ``clip_grad_norm_`` over the pp group, which counts the tied copy once) under 1F1B,
GPipe, interleaved, with and without weight tying, with an explicit cut, dp 2 x pp 2 and pp 4, give
the single-process GPT's losses, parameters and logits; the two copies of ``wte.weight`` are bit-equal;
copies that differ at construction (another seed) are an error on every rank.
"""

from __future__ import annotations

import json

import numpy as np
import pp_gpt_common as common  # noqa: E402
import pytest
from cupy_stand_in import DeviceArray, install  # noqa: E402
from hypothesis import given
from hypothesis import strategies as st
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.models import GPT, GPTConfig  # noqa: E402
from minidist.nn.module import Parameter  # noqa: E402
from minidist.parallel import clip_grad_norm_  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel  # noqa: E402
from minidist.parallel.pipeline.partition import build_stage, partition  # noqa: E402
from minidist.parallel.pipeline.tied import find_tied  # noqa: E402
from minidist.parallel.tensor_parallel.split import shard_index  # noqa: E402

# float64: the pipeline changes only the order of floating-point sums (per microbatch, then over
# microbatches, dp replicas and the two tied copies), a few ulps per step. AdamW divides by sqrt(v),
# which can scale a relative error up by the step size over tiny gradients, so 1e-10 relative after 3
# steps: wide for rounding, many orders of magnitude below a real error (a missing tied sum, 1/m).
TOL = dict(rtol=1e-10, atol=1e-12)


# -- one process ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tie", [True, False])
def test_pipeline_layers_compute_the_gpts_logits_and_gradients(tie):
    gpt = common.build(0, n_layer=3, tie=tie)
    layers = gpt.pipeline_layers()
    assert len(layers) == 3 + 2
    ids, targets = common.data(0, n=4)
    expected = common.loss_fn(gpt(ids), targets)
    expected.backward()
    grads = {name: p.grad.copy() for name, p in gpt.named_parameters()}
    gpt.zero_grad()
    logits = layers(ids)
    np.testing.assert_array_equal(logits.numpy(), gpt(ids).numpy())  # the same ops in the same order
    common.loss_fn(logits, targets).backward()
    for name, p in gpt.named_parameters():  # the layers share the GPT's parameters: its .grad is set
        np.testing.assert_array_equal(p.grad, grads[name], err_msg=name)


@given(st.data())
def test_every_cut_of_the_gpt_names_parameters_as_the_gpt(data):
    tie = data.draw(st.booleans(), label="tie")
    n_layer = data.draw(st.integers(1, 4), label="n_layer")
    gpt = common.build(0, n_layer=n_layer, tie=tie)
    layers = gpt.pipeline_layers()
    stages = data.draw(st.integers(1, n_layer + 2), label="stages")
    cuts = sorted(data.draw(st.sets(st.integers(1, n_layer + 1), min_size=stages - 1, max_size=stages - 1)))
    full = dict(gpt.named_parameters())
    seen = set()
    for bounds in partition(layers, stages, cuts):
        for name, p in build_stage(layers, bounds).named_parameters():
            assert full[name] is p, name  # GPT's name for this very parameter
            seen.add(name)
    assert seen == set(full)  # together the stages hold the whole GPT (the tied table on both ends)


def test_balanced_cuts_count_the_tied_table_on_both_ends():
    gpt = common.build(0, n_layer=2, tie=True)
    layers = gpt.pipeline_layers()
    sizes = [sum(p.size for p in layer.parameters()) for layer in layers]
    C, V = 16, common.V
    assert sizes[0] == V * C + common.T * C and sizes[-1] == V * C + 2 * C  # wte (+ wpe | + ln_f)
    assert partition(layers, 2) == [(0, 2), (2, 4)]


def test_one_rank_holds_every_chunk_and_no_tied_copy():
    # a pipeline group of one rank (this test process): embedding and head on the same rank, so the
    # table stays one Parameter; int64 ids go into the first chunk, activations are handed over in memory
    world = dist.init()
    if world.size != 1:
        pytest.skip("runs in a single process")
    ref_params, ref_losses, _, ref_logits = common.single_process(7)
    pipe = PipelineParallel(common.build(7).pipeline_layers(), world, 2, "interleaved", virtual_stages=2)
    assert pipe.tied == [] and not any(p.is_tied_copy for p in pipe.parameters())
    opt = common.make_optimizer(pipe.parameters())
    ids, targets = common.data(7)
    for step in range(common.STEPS):
        xb, yb = common.global_batch(ids, targets, step)
        opt.zero_grad()
        loss = pipe.train_step(xb, yb, common.loss_fn)
        clip_grad_norm_(pipe.parameters(), common.MAX_NORM)
        opt.step()
        assert loss == pytest.approx(ref_losses[step], rel=1e-10)
    for name, value in pipe.stage_module.state_dict().items():
        np.testing.assert_allclose(value, ref_params[name], **TOL, err_msg=name)
    np.testing.assert_allclose(pipe.predict(ids), ref_logits, **TOL)


def _train_on_one_rank(seed: int) -> tuple[list[float], dict[str, np.ndarray], type]:
    pipe = PipelineParallel(
        common.build(seed).pipeline_layers(), dist.init(), 2, "interleaved", virtual_stages=2
    )
    opt = common.make_optimizer(pipe.parameters())
    ids, targets = common.data(seed)
    losses = []
    for step in range(2):
        xb, yb = common.global_batch(ids, targets, step)
        opt.zero_grad()
        losses.append(pipe.train_step(xb, yb, common.loss_fn))  # host ids, as RandomWindows gives them
        clip_grad_norm_(pipe.parameters(), common.MAX_NORM)
        opt.step()
    params = {name: p.numpy() for name, p in pipe.named_parameters()}
    return losses, params, type(next(pipe.parameters()).data)


def test_the_gpt_pipeline_on_the_cupy_stand_in_equals_the_cpu(monkeypatch):
    # the GPU code path without a GPU (tests/backend/test_gpt_on_gpu_stand_in.py says how): int ids from the
    # host into the first chunk, device activations between chunks, the same numbers bit for bit
    if dist.init().size != 1:
        pytest.skip("runs in a single process")
    cpu = _train_on_one_rank(3)
    install(monkeypatch)
    device = _train_on_one_rank(3)
    assert cpu[2] is np.ndarray and device[2] is DeviceArray
    assert device[0] == cpu[0]
    for name, value in cpu[1].items():
        np.testing.assert_array_equal(device[1][name], value, err_msg=name)


def test_clashing_parameter_names_are_an_error():
    world = dist.init()
    if world.size != 1:
        pytest.skip("runs in a single process")
    first, second = nn.Linear(3, 3), nn.Linear(3, 3)
    first.pipeline_name = second.pipeline_name = "fc"  # both would save as fc.weight
    with pytest.raises(
        ValueError, match=r"both named 'fc.weight' \(in layers 0 and 1.*distinct pipeline_name"
    ):
        PipelineParallel(nn.Sequential(first, second), world)
    layers = common.build(0).pipeline_layers()
    head = layers[len(layers) - 1]
    head.wte.weight = Parameter(head.wte.weight.data.copy())  # what an earlier PipelineParallel leaves
    head.wte.weight.is_tied_copy = True
    with pytest.raises(ValueError, match=r"'wte.weight'.*build the layers anew"):
        find_tied(layers, [(0, 2), (2, 4)], 2)


# -- MPI ranks -----------------------------------------------------------------------------------
def run_configs(tmp_path, world_size, configs):
    run_mpi(world_size, "pipeline/pp_gpt.py", tmp_path, json.dumps(configs), timeout=120)
    for k, cfg in enumerate(configs):
        infos = [json.loads((tmp_path / f"{k}_rank{r}.json").read_text()) for r in range(world_size)]
        if cfg.get("bad_seed"):  # the last stage's copy differs: a ValueError on every rank
            for info in infos:
                assert "tied parameter 'wte.weight'" in info["error"] and "same seed" in info["error"]
            continue
        tie = cfg.get("tie", True)
        freeze, accumulate = cfg.get("freeze", ()), cfg.get("accumulate", 1)
        ref = common.single_process(cfg["seed"], cfg.get("n_layer", 2), tie, freeze, accumulate)
        ref_params, ref_losses, ref_norms, ref_logits = ref
        merged, copies = {}, {}
        for r, info in enumerate(infos):
            params = dict(np.load(tmp_path / f"{k}_rank{r}.npz"))
            assert list(params) == info["names"]
            for name, value in params.items():  # every stage, every dp replica
                np.testing.assert_allclose(value, ref_params[name], **TOL, err_msg=f"{cfg}: {name}, rank {r}")
            merged.update(params)
            np.testing.assert_allclose(info["losses"], ref_losses, **TOL, err_msg=f"{cfg}: losses, rank {r}")
            # clip_grad_norm_ over the pp group counts the tied copy once: the GPT's norm, > MAX_NORM
            np.testing.assert_allclose(info["norms"], ref_norms, **TOL, err_msg=f"{cfg}: norms, rank {r}")
            assert min(ref_norms) > common.MAX_NORM or freeze  # (frozen: a smaller norm)
            predicted = np.load(tmp_path / f"{k}_rank{r}_predict.npy")
            np.testing.assert_allclose(predicted, ref_logits, **TOL, err_msg=f"{cfg}: predict, rank {r}")
            last = info["stage"] == cfg["pp"] - 1
            assert info["tied_copies"] == (["wte.weight"] if tie and last and cfg["pp"] > 1 else [])
            if "wte.weight" in params:
                copies.setdefault(r % cfg["dp"], []).append(params["wte.weight"])
        assert sorted(merged) == sorted(ref_params), cfg
        for replica in copies.values():  # per dp replica: the first stage's table and the last's copy
            assert len(replica) == (2 if tie else 1)
            np.testing.assert_array_equal(replica[0], replica[-1])  # bit-equal, not just close
    return configs


@pytest.mark.mpi
def test_gpt_on_two_stages_equals_one_process(tmp_path):
    cfgs = [
        dict(pp=2, dp=1, m=2, schedule="1f1b", seed=0),
        dict(pp=2, dp=1, m=4, schedule="gpipe", seed=1, n_layer=3),
        dict(pp=2, dp=1, m=2, schedule="interleaved", v=2, seed=2),
        dict(pp=2, dp=1, m=2, schedule="1f1b", seed=3, tie=False),
        dict(pp=2, dp=1, m=1, schedule="1f1b", seed=4, cuts=[1]),  # the embedding alone on stage 0
        dict(pp=2, dp=1, m=2, schedule="1f1b", seed=5, bad_seed=True),
        dict(
            pp=2, dp=1, m=2, schedule="1f1b", seed=6, freeze=["wte.weight"]
        ),  # a frozen tied table stays put
        dict(pp=2, dp=1, m=2, schedule="1f1b", seed=7, accumulate=2),  # tied gradients summed once per step
    ]
    assert len(run_configs(tmp_path, 2, cfgs)) == len(cfgs)


@pytest.mark.mpi
def test_gpt_on_dp2_x_pp2_and_four_stages_equals_one_process(tmp_path):
    cfgs = [
        dict(pp=2, dp=2, m=2, schedule="1f1b", seed=0),
        dict(pp=2, dp=2, m=2, schedule="interleaved", v=2, seed=1),
        dict(pp=4, dp=1, m=4, schedule="1f1b", seed=2),  # middle stages take no part in the tied sum
        dict(pp=2, dp=2, m=2, schedule="1f1b", seed=3, freeze=["wte.weight", "wpe.weight"]),  # dp: no grad
    ]
    assert len(run_configs(tmp_path, 4, cfgs)) == len(cfgs)


@pytest.mark.mpi
def test_parallel_gpt_pipeline_ties_each_tp_ranks_vocabulary_shard(tmp_path):
    """tp 2 x pp 2: the last stage's tied copy is this tp rank's 32 or 31 rows of the 63-row table,
    flagged ``is_tied_copy``, bit-equal to stage 0's after 3 clipped AdamW steps, and the model equals
    one process (the one-process GPT's pipeline, cut by split.py's rule)."""
    run_mpi(4, "pipeline/pp_parallel_gpt.py", tmp_path, timeout=120)
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(4)]
    meta = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for r in range(4):  # rank = pp_rank * 2 + tp_rank
        pp_rank, tp_rank = divmod(r, 2)
        assert meta[r]["tied"] == [{"name": "wte.weight", "ranks": [0, 1], "copy": pp_rank == 1, "tp_dim": 0}]
        if pp_rank == 1:
            original = ranks[tp_rank]["param/wte.weight"]  # stage 0, same tp rank
            assert original.shape == ((32, 8) if tp_rank == 0 else (31, 8))
            np.testing.assert_array_equal(ranks[r]["tied_copy"], original)
    # against one process: the same GPT, the same 3 clipped AdamW steps on the whole batch
    md.manual_seed(3)
    config = GPTConfig(vocab_size=63, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype=np.float64)
    gpt = GPT(config)
    full = dict(gpt.named_parameters())
    opt = optim.AdamW(gpt.parameters(), lr=1e-2)
    ids = np.random.default_rng(4).integers(0, 63, (4, 9))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(gpt(ids[:, :-1]).reshape(-1, 63), ids[:, 1:].reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(gpt.parameters(), 0.05)
        opt.step()
        losses.append(loss.item())
    for r in range(4):
        np.testing.assert_allclose(ranks[r]["losses"], losses, **TOL)
        for name, (tp_dim, stride) in meta[r]["flags"].items():
            want = full[name].numpy()
            if tp_dim is not None:  # this tp rank's piece, by split.py's rule
                want = want[shard_index(want.shape, tp_dim, 2, r % 2, stride)]
            np.testing.assert_allclose(ranks[r][f"param/{name}"], want, **TOL, err_msg=f"{name} on rank {r}")
