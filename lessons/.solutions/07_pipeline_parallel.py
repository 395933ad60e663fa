"""Reference answers (and wrong answers the checks must reject) for lesson 07. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution bubble]
def bubble_fraction(p, m):
    return (p - 1) / (m + p - 1)


# %% [wrong bubble]
def bubble_fraction(p, m):
    return (p - 1) / m  # the bubble relative to the compute time, not to the step


# %% [wrong bubble]
def bubble_fraction(p, m):
    return p / (m + p)  # counts p fill-up slots instead of p - 1


# %% [solution peak]
def peak_activations_1f1b(p, m, s):
    return min(p - s, m)


# %% [wrong peak]
def peak_activations_1f1b(p, m, s):
    return p - s  # forgets that there may be fewer microbatches than stages


# %% [wrong peak]
def peak_activations_1f1b(p, m, s):
    return m  # GPipe's answer


# %% [wrong peak]
def peak_activations_1f1b(p, m, s):
    return min(p - s - 1, m)  # counts only the warm-up forwards
