"""Reference answers (and wrong answers the checks must reject) for lesson 06. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution shard]
def shard_shape(out_features, in_features, tp, kind):
    return (out_features // tp, in_features) if kind == "column" else (out_features, in_features // tp)


# %% [wrong shard]
def shard_shape(out_features, in_features, tp, kind):
    # swapped: column split on the input axis, row on the output axis
    return (out_features, in_features // tp) if kind == "column" else (out_features // tp, in_features)


# %% [wrong shard]
def shard_shape(out_features, in_features, tp, kind):
    return (out_features // tp, in_features // tp)  # splits both axes


# %% [solution fg]
OPERATOR_BEFORE_COLUMN = "f"


def f_backward(grads):
    total = sum(grads)
    return [total.copy() for _ in grads]


# %% [wrong fg]
OPERATOR_BEFORE_COLUMN = "g"


def f_backward(grads):
    total = sum(grads)
    return [total.copy() for _ in grads]


# %% [wrong fg]
OPERATOR_BEFORE_COLUMN = "f"


def f_backward(grads):
    return grads  # identity: each rank keeps only its own contribution


# %% [wrong fg]
OPERATOR_BEFORE_COLUMN = "f"


def f_backward(grads):
    return [sum(grads) / len(grads) for _ in grads]  # averages instead of summing
