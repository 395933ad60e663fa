"""DDP communication hooks: each hook on 2 and 4 real ranks against a one-process reference.

The reference (:func:`reference`) trains ``ddp_common``'s MLP in this process. It computes every
rank's local gradient itself (the same shares of the same global batch as the worker) and averages
them per DDP bucket: plainly for ``none``/``allreduce``/``fp16``/``bf16``, and for PowerSGD with an
independent NumPy simulation of the N workers (:class:`PowerSGDReference`: sums over the workers,
``numpy.linalg.qr`` instead of our Gram-Schmidt, the same random ``Q``\\ s by the documented seeding).
Every configuration of a world size runs in one launch (the module fixture ``launches``), as in
``test_ddp.py``; ``test_comm_hooks_errors.py`` holds the mistakes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ddp_common  # noqa: E402
import numpy as np
import pytest
import strategies as S
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.parallel.data_parallel.buckets import plan_buckets  # noqa: E402

SEED, BATCH, LR, MOMENTUM = 0, 16, 0.1, 0.9  # the worker's problem; ddp_common.make_optimizer("sgd")
STEPS_16BIT = 5
# (name, hook, dtype, steps, worker flags): the runs of one launch per world size.
RUNS = [
    ("none", "none", "float32", STEPS_16BIT, []),
    ("allreduce", "allreduce", "float32", STEPS_16BIT, []),
    ("fp16", "fp16", "float32", STEPS_16BIT, []),
    ("bf16", "bf16", "float32", STEPS_16BIT, []),
    # 3 plain steps, then compression: the switch at start_powerSGD_iter; one bucket, lean path.
    ("psgd_switch", "powersgd", "float64", 6, ["--rank", "1", "--start", "3"]),
    # one bucket per parameter, on the communication thread, rank 2 (the 4 x 8 weight is then not worth
    # compressing: (4 + 8) 2 * 2 >= 32), a fresh random Q every step.
    ("psgd_buckets", "powersgd", "float64", 4,
     ["--rank", "2", "--bucket-cap-mb", "1e-6", "--small-bucket-bytes", "0", "--no-warm-start"]),
    ("psgd_no_ef", "powersgd", "float64", 5,
     ["--rank", "1", "--start", "2", "--bucket-cap-mb", "1e-6", "--no-error-feedback"]),
]  # fmt: skip


class PowerSGDReference:
    """PowerSGD (Vogels et al. 2019, Algorithms 1 and 2) for ``n`` simulated workers, one bucket at a time."""

    def __init__(self, rank: int, start: int, warm_start: bool, error_feedback: bool) -> None:
        self.rank, self.start, self.warm, self.ef = rank, start, warm_start, error_feedback
        self.rng, self.iter = np.random.RandomState(0), 0  # PowerSGDState's default random_seed
        self.errors: dict[tuple[int, int], np.ndarray] = {}
        self.qs: dict[int, list[np.ndarray]] = {}

    def average(self, b: int, vectors: list[np.ndarray], shapes: list[tuple], is_last: bool) -> np.ndarray:
        n = len(vectors)
        if self.iter < self.start:
            out = sum(vectors) / n
        else:
            if self.ef:
                vectors = [v + self.errors.get((b, w), 0) for w, v in enumerate(vectors)]
            out = np.empty_like(vectors[0])
            compress = []
            offset = 0
            for shape in shapes:
                size = math.prod(shape)
                rows, cols = (shape[0], size // shape[0]) if len(shape) >= 2 else (1, size)
                r = min(rows, cols, self.rank)
                if len(shape) >= 2 and (rows + cols) * r * 2 < rows * cols:
                    compress.append((offset, rows, cols, r))
                else:
                    out[offset : offset + size] = sum(v[offset : offset + size] for v in vectors) / n
                offset += size
            if compress:
                if self.warm and b in self.qs:
                    qs = self.qs[b]
                else:
                    draw = np.random.default_rng(self.rng.randint(1_000_000_000))
                    flat = draw.standard_normal(sum(c * r for _, _, c, r in compress))
                    bounds = np.cumsum([0] + [c * r for _, _, c, r in compress])
                    qs = [flat[a:z].reshape(c, r) for a, z, (_, _, c, r) in zip(bounds, bounds[1:], compress)]
                new_qs = []
                for (o, rows, cols, _), q in zip(compress, qs):
                    ms = [v[o : o + rows * cols].reshape(rows, cols) for v in vectors]
                    p = np.linalg.qr(sum(m @ q for m in ms))[0]  # orthonormal basis of the summed P
                    q = sum(m.T @ p for m in ms)
                    out[o : o + rows * cols] = (p @ q.T / n).ravel()
                    new_qs.append(q)
                self.qs[b] = new_qs
            if self.ef:
                for w, v in enumerate(vectors):
                    self.errors[(b, w)] = v - out
        if is_last:
            self.iter += 1
        return out


def option(flags: list[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def reference(world_size: int, hook: str, dtype: str, steps: int, flags: list[str]):
    """(parameters after ``steps``, largest |local gradient| of any rank and step) for one run."""
    x, y = ddp_common.make_data(SEED, 64)
    model = ddp_common.make_model(SEED, np.dtype(dtype))
    opt = ddp_common.make_optimizer("sgd", model.parameters())
    params = [p for p in model.parameters() if p.requires_grad]
    cap = float(option(flags, "--bucket-cap-mb", "25")) * 2**20
    plan = plan_buckets([p.data.nbytes for p in params], [p.dtype for p in params], cap)
    psgd = None
    if hook == "powersgd":
        rank, start = int(option(flags, "--rank", "1")), int(option(flags, "--start", "0"))
        warm, feedback = "--no-warm-start" not in flags, "--no-error-feedback" not in flags
        psgd = PowerSGDReference(rank, start, warm, feedback)
    g_max = 0.0
    for step in range(steps):
        xb, yb = ddp_common.global_batch(x, y, step, BATCH)
        local = []
        for rank in range(world_size):
            mine = ddp_common.share(BATCH, world_size, rank)
            logits = model(md.tensor(xb[mine], dtype=dtype))
            loss = nn.functional.cross_entropy(logits, yb[mine], reduction="sum") * (world_size / BATCH)
            opt.zero_grad()
            loss.backward()
            local.append([p.grad.copy() for p in params])
        g_max = max(g_max, max(float(np.abs(g).max()) for grads in local for g in grads))
        for b, idx in enumerate(plan):  # small buckets: DDP communicates them in index order
            vectors = [np.concatenate([grads[i].ravel() for i in idx]) for grads in local]
            shapes = [params[i].shape for i in idx]
            avg = psgd.average(b, vectors, shapes, b == len(plan) - 1) if psgd else sum(vectors) / world_size
            offset = 0
            for i in idx:
                params[i].grad = avg[offset : offset + params[i].size].reshape(params[i].shape)
                offset += params[i].size
        opt.step()
    return model.state_dict(), g_max


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """world size -> the folder with every run's results (one launch per world size, on first use)."""
    folders = {}

    def results(world_size: int) -> Path:
        if world_size not in folders:
            out = tmp_path_factory.mktemp(f"hooks{world_size}")
            args = ["--collectives", str(out)]
            for name, hook, dtype, steps, flags in RUNS:
                args += ["--then", str(out), name, hook, dtype, str(steps), *flags]
            run_mpi(world_size, "comm_hooks/hooks_training.py", *args, timeout=180)
            folders[world_size] = out
        return folders[world_size]

    return results


def load(folder: Path, name: str, world_size: int) -> dict[str, np.ndarray]:
    """Rank 0's parameters of run ``name``, after checking every rank holds exactly the same."""
    ranks = [dict(np.load(folder / f"{name}_rank{r}.npz")) for r in range(world_size)]
    for r, params in enumerate(ranks[1:], 1):
        for key, value in params.items():
            np.testing.assert_array_equal(value, ranks[0][key], err_msg=f"{name}: rank {r} differs, {key}")
    return ranks[0]


def stats(folder: Path, name: str) -> dict[str, int]:
    return json.loads((folder / f"{name}_stats_rank0.json").read_text())


def run_of(name: str):
    return next(r for r in RUNS if r[0] == name)


@pytest.mark.mpi
@pytest.mark.parametrize("world_size", [2, 4])
def test_allreduce_hook_equals_plain_ddp_and_one_process(launches, world_size):
    folder = launches(world_size)
    plain, hooked = load(folder, "none", world_size), load(folder, "allreduce", world_size)
    # Bit for bit: both all-reduce the same gradients with the same algorithm (recursive doubling at
    # these sizes, which combines every element in the same pairs whatever the array's length; the
    # hook's array lacks DDP's bookkeeping flags, which then travel in their own all-reduce).
    for key in plain:
        np.testing.assert_array_equal(hooked[key], plain[key], err_msg=key)
    ref, _ = reference(world_size, "none", "float32", STEPS_16BIT, [])
    for key in ref:  # float32, as test_ddp.py: summation order only
        np.testing.assert_allclose(plain[key], ref[key], rtol=1e-4, atol=1e-5, err_msg=key)
    assert stats(folder, "allreduce")["payload_bytes"] == stats(folder, "none")["payload_bytes"]


@pytest.mark.mpi
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(("hook", "unit_roundoff", "subnormal_spacing"), [
    ("fp16", 2.0**-11, 2.0**-24),  # float16: 11 significant bits; below 2**-14 spacing 2**-24
    ("bf16", 2.0**-8, 0.0),  # bfloat16: 8 significant bits, float32's exponent range
])  # fmt: skip
def test_16_bit_hooks_match_one_process_within_their_rounding(launches, world_size, hook, unit_roundoff,
                                                              subnormal_spacing):  # fmt: skip
    folder = launches(world_size)
    params = load(folder, hook, world_size)
    ref, g_max = reference(world_size, hook, "float32", STEPS_16BIT, [])
    # The hook rounds each g_r / n to 16 bits (relative error u) and adds n of them in 16 bits (each
    # addition rounds a partial sum of at most g_max: error u g_max), so an averaged gradient is off by
    # at most n u g_max, plus n half-spacings where float16 is subnormal. SGD with momentum 0.9 adds up
    # a gradient error at most 1 / (1 - 0.9) times over, lr each, for each of the steps; the factor 2
    # covers the gradients themselves moving with the perturbed parameters (a few steps of a smooth
    # model). float32's own rounding (~1e-7) is far below this.
    gradient_error = world_size * (unit_roundoff * g_max + subnormal_spacing)
    tolerance = 2 * LR * STEPS_16BIT / (1 - MOMENTUM) * gradient_error
    worst = max(float(np.abs(params[k] - ref[k]).max()) for k in ref)
    assert worst <= tolerance, f"{hook}: parameters off by {worst:.3g} > {tolerance:.3g}"
    assert worst > 1e-6, "no trace of 16-bit rounding: was the gradient really compressed?"
    s, plain = stats(folder, hook), stats(folder, "none")
    assert 2 * s["payload_bytes"] == s["uncompressed_bytes"] == plain["uncompressed_bytes"]
    # measured bytes that left the rank: half, plus the bookkeeping flags' own small all-reduce
    assert s["bytes_sent"] < 0.55 * plain["bytes_sent"]


@pytest.mark.mpi
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ["psgd_switch", "psgd_buckets", "psgd_no_ef"])
def test_powersgd_matches_a_numpy_simulation_of_the_workers(launches, world_size, name):
    folder = launches(world_size)
    _, hook, dtype, steps, flags = run_of(name)
    params = load(folder, name, world_size)
    ref, _ = reference(world_size, hook, dtype, steps, flags)
    # float64: the simulation sums the workers in rank order and orthogonalises with Householder QR,
    # the ranks sum by recursive doubling and use Gram-Schmidt: both differ from exact arithmetic by a
    # few ulps (1e-16 relative) per operation. P has 1 or 2 well-separated columns here, so rounding is
    # not amplified much; 1e-10 after 4-6 steps still catches any real difference (a wrong Q, a missing
    # error term, a wrong scale), which moves the parameters by 1e-3 or more.
    for key in ref:
        np.testing.assert_allclose(params[key], ref[key], rtol=1e-10, atol=1e-10, err_msg=f"{name} {key}")
    plain, _ = reference(world_size, "none", dtype, steps, [])
    assert max(float(np.abs(params[k] - plain[k]).max()) for k in ref) > 1e-4  # it did compress


@pytest.mark.mpi
def test_powersgd_payload_is_the_low_rank_factors(launches):
    folder = launches(2)
    s = stats(folder, "psgd_switch")  # rank 1, 3 plain steps of 6, one bucket
    dense = 8 * (16 * 6 + 16 + 8 * 16 + 8 + 4 * 8 + 4)  # float64 gradients of ddp_common's MLP
    factors = 8 * ((16 + 6) + (8 + 16) + (4 + 8) + 16 + 8 + 4)  # P and Q per weight, biases as they are
    assert s["uncompressed_bytes"] == 6 * dense
    assert s["payload_bytes"] == 3 * dense + 3 * factors
    assert s["steps"] == 6


@pytest.mark.mpi
@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_sums_float16_and_bfloat16_with_every_algorithm(launches, world_size):
    folder = launches(world_size)
    rank_sum = world_size * (world_size - 1) / 2
    expected = world_size * np.arange(37) / 8 + rank_sum  # every partial sum is exact in 8 bits
    errors = json.loads((folder / "collectives_rank0.json").read_text())
    results = np.load(folder / "collectives_rank0.npz")
    for dtype in ("float16", "bfloat16"):
        for algorithm in ("auto", "ring", "recursive_doubling", "rabenseifner", "mpi"):
            for op, want in (("sum", expected), ("avg", expected / world_size)):
                key = f"{dtype}_{algorithm}_{op}"
                if dtype == "bfloat16" and algorithm == "mpi":  # MPI has no bfloat16 datatype
                    assert "no datatype for bfloat16" in errors[key] and "algorithm='ring'" in errors[key]
                else:
                    np.testing.assert_array_equal(results[key], want, err_msg=key)


# ----------------------------------------------------------------------------------------- mistakes
@pytest.fixture(scope="module")
def errors(tmp_path_factory) -> list[dict]:
    """Each rank's recorded exception per case of ``comm_hooks/hooks_errors.py`` (one 2-rank launch)."""
    out = tmp_path_factory.mktemp("hook_errors")
    run_mpi(2, "comm_hooks/hooks_errors.py", out, timeout=90)
    return [json.loads((out / f"errors_rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.mpi
@pytest.mark.parametrize(("case", "kind", "words"), [
    ("twice", "RuntimeError", ["only be called once"]),
    ("after_backward", "RuntimeError", ["before the first backward"]),
    ("different_hooks", "ValueError",
     ["hook", "fp16_compress_hook on rank 0", "powerSGD_hook on rank 1", "same hook"]),
    ("different_rank", "ValueError", ["matrix_approximation_rank", "1 on rank 0", "2 on rank 1"]),
    ("not_callable", "TypeError", ["rank 1", "hook must be a function", "str"]),
    ("foreign_group", "ValueError", ["not DDP's group"]),
    ("wrong_result", "TypeError", ["wrong_shape_hook", "returned", "must return", "shape (284,)"]),
])  # fmt: skip
def test_hook_mistakes_raise_the_same_clear_error_on_every_rank(errors, case, kind, words):
    for rank, recorded in enumerate(errors):
        assert recorded[case] is not None, f"rank {rank} raised nothing for {case}"
        got_kind, message = recorded[case]
        assert got_kind == kind, f"rank {rank}: {got_kind}: {message}"
        for word in words:
            assert word in message, f"rank {rank}: {word!r} not in {message!r}"


@pytest.mark.mpi
def test_a_correct_registration_with_the_group_as_state_raises_nothing(errors):
    assert [e["fine"] for e in errors] == [None, None]


# ------------------------------------------------------------------------------ in this process
@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"matrix_approximation_rank": 0}, ValueError, "matrix_approximation_rank must be >= 1"),
    ({"matrix_approximation_rank": 1.5}, TypeError, "matrix_approximation_rank must be an int"),
    ({"start_powerSGD_iter": -1}, ValueError, "start_powerSGD_iter must be >= 0"),
    ({"min_compression_rate": 0}, ValueError, "min_compression_rate must be > 0"),
    ({"min_compression_rate": float("nan")}, TypeError, "finite number"),
    ({"orthogonalization_epsilon": -1e-8}, ValueError, "orthogonalization_epsilon must be >= 0"),
    ({"use_error_feedback": 1}, TypeError, "use_error_feedback must be True or False"),
    ({"random_seed": 2**32}, ValueError, "random_seed must be in 0..4294967295"),
    ({"process_group": "world"}, TypeError, "process_group must be None or a Communicator"),
])  # fmt: skip
def test_powersgd_state_rejects_bad_arguments(kwargs, error, words):
    from minidist.parallel.comm_hooks import PowerSGDState

    with pytest.raises(error, match=words):
        PowerSGDState(**kwargs)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 12), rank=st.integers(1, 4), seed=S.seeds)
def test_orthogonalize_gives_orthonormal_columns_spanning_the_same_space(rows, rank, seed):
    from minidist.parallel.comm_hooks import orthogonalize

    rank = min(rank, rows)
    p = np.random.default_rng(seed).standard_normal((rows, rank))
    q = p.copy()
    orthogonalize(q)
    np.testing.assert_allclose(q.T @ q, np.eye(rank), atol=1e-8)  # orthonormal (random p: well conditioned)
    # Gram-Schmidt is QR with R's diagonal positive: p = q r, r upper triangular
    r = q.T @ p
    np.testing.assert_allclose(q @ r, p, atol=1e-8)
    np.testing.assert_allclose(np.tril(r, -1), 0, atol=1e-8)
    assert (np.diag(r) > 0).all()


def test_orthogonalize_keeps_a_zero_column_zero_instead_of_nan():
    from minidist.parallel.comm_hooks import orthogonalize

    p = np.zeros((5, 2))
    p[:, 1] = 3.0
    orthogonalize(p)
    np.testing.assert_array_equal(p[:, 0], 0)
    np.testing.assert_allclose(p[:, 1], 1 / np.sqrt(5))


def test_register_by_name_rejects_an_unknown_name_listing_the_valid_ones():
    from minidist.parallel.comm_hooks import register_by_name

    with pytest.raises(ValueError, match="hook 'fp8'; valid choices are none, allreduce"):
        register_by_name(None, "fp8")
