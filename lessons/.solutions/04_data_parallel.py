"""Reference answers (and wrong answers the checks must reject) for lesson 04. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution accum]
def microbatch_weight(sizes, i):
    return sizes[i] / sum(sizes)


# %% [wrong accum]
def microbatch_weight(sizes, i):
    return 1 / len(sizes)  # right only when every microbatch has the same size


# %% [wrong accum]
def microbatch_weight(sizes, i):
    return 1.0  # sums the means: k times too large
