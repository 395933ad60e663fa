"""Reference answers (and wrong answers the checks must reject) for lesson 09. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution speedup]
def dp_speedup(flops_per_step, gpus, grad_bytes, flops, alpha, beta):
    one = flops_per_step / flops
    comm = 2 * (gpus - 1) * alpha + 2 * (gpus - 1) / gpus * grad_bytes * beta
    return one / (one / gpus + comm)


# %% [wrong speedup]
def dp_speedup(flops_per_step, gpus, grad_bytes, flops, alpha, beta):
    one = flops_per_step / flops
    return one / (one / gpus + 2 * (gpus - 1) / gpus * grad_bytes * beta)  # forgets the latency term


# %% [wrong speedup]
def dp_speedup(flops_per_step, gpus, grad_bytes, flops, alpha, beta):
    return gpus  # the ideal, not the real speedup


# %% [solution rank]
def mesh_rank(dp_rank, tp_rank, pp_rank, dp, tp):
    return pp_rank * dp * tp + dp_rank * tp + tp_rank


# %% [wrong rank]
def mesh_rank(dp_rank, tp_rank, pp_rank, dp, tp):
    return pp_rank * dp * tp + tp_rank * dp + dp_rank  # dp fastest: tp groups would span nodes


# %% [wrong rank]
def mesh_rank(dp_rank, tp_rank, pp_rank, dp, tp):
    return dp_rank * tp + tp_rank  # forgets the pipeline stage
