"""Reference answers (and wrong answers the checks must reject) for lesson 05. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution zero]
def zero_bytes(psi, n, stage, b, k):
    params = b * psi / (n if stage >= 3 else 1)
    grads = b * psi / (n if stage >= 2 else 1)
    state = k * psi / (n if stage >= 1 else 1)
    return params + grads + state


# %% [wrong zero]
def zero_bytes(psi, n, stage, b, k):
    return (2 * b + k) * psi / (n if stage > 0 else 1)  # shards everything from stage 1 on


# %% [wrong zero]
def zero_bytes(psi, n, stage, b, k):
    params = b * psi / (n if stage >= 3 else 1)
    grads = b * psi / (n if stage >= 1 else 1)  # gradients sharded one stage too early
    state = k * psi / (n if stage >= 1 else 1)
    return params + grads + state
