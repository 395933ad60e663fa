"""Reference answers (and wrong answers the checks must reject) for lesson 02. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution ring]
def ring_neighbors(rank, size):
    return (rank - 1) % size, (rank + 1) % size


# %% [wrong ring]
def ring_neighbors(rank, size):
    return (rank + 1) % size, (rank - 1) % size  # left and right swapped


# %% [wrong ring]
def ring_neighbors(rank, size):
    return rank - 1, rank + 1  # forgets to wrap around
