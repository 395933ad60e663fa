"""Reference answers (and wrong answers the checks must reject) for lesson 03. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution sendchunk]
def send_chunk(rank, step, n):
    return (rank - step - 1) % n  # as minidist/distributed/algorithms/ring.py


# %% [wrong sendchunk]
def send_chunk(rank, step, n):
    return (rank - step) % n  # one chunk off: then rank r would end with chunk r + 1, not r


# %% [solution ringtime]
def ring_time(nbytes, n, alpha, beta):
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta


# %% [wrong ringtime]
def ring_time(nbytes, n, alpha, beta):
    return 2 * (n - 1) * (alpha + nbytes * beta)  # sends the whole vector at every step


# %% [wrong ringtime]
def ring_time(nbytes, n, alpha, beta):
    return (n - 1) * alpha + (n - 1) / n * nbytes * beta  # only the reduce-scatter half
