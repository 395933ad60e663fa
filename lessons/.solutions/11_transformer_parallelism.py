"""Reference answers (and wrong answers the checks must reject) for lesson 11. See lessons/README.md."""
# ruff: noqa: E402, F811

# %% [solution vocabloss]
import numpy as np


def vocab_parallel_loss(shards, targets):
    # What the three all-reduces give every rank: the max, the sum of exponentials, the target logit.
    rows = np.arange(len(targets))
    top = np.max([s.max(axis=1) for s in shards], axis=0)  # all-reduce (max)
    total = sum(np.exp(s - top[:, None]).sum(axis=1) for s in shards)  # all-reduce (sum)
    picked, start = np.zeros(len(targets)), 0
    for s in shards:  # all-reduce (sum): only the owner of a target contributes its logit
        stop = start + s.shape[1]
        mine = (targets >= start) & (targets < stop)
        picked[mine] += s[rows[mine], targets[mine] - start]
        start = stop
    return np.log(total) + top - picked


# %% [wrong vocabloss]
import numpy as np


def vocab_parallel_loss(shards, targets):
    rows = np.arange(len(targets))
    total = sum(np.exp(s).sum(axis=1) for s in shards)  # no max all-reduce: exp overflows
    picked, start = np.zeros(len(targets)), 0
    for s in shards:
        stop = start + s.shape[1]
        mine = (targets >= start) & (targets < stop)
        picked[mine] += s[rows[mine], targets[mine] - start]
        start = stop
    return np.log(total) - picked


# %% [wrong vocabloss]
import numpy as np


def vocab_parallel_loss(shards, targets):
    rows = np.arange(len(targets))
    top = np.max([s.max(axis=1) for s in shards], axis=0)
    total = sum(np.exp(s - top[:, None]).sum(axis=1) for s in shards)
    picked = np.zeros(len(targets))
    for r, s in enumerate(shards):  # the owner's offset taken as rank x its own width: wrong when uneven
        start = r * s.shape[1]
        mine = (targets >= start) & (targets < start + s.shape[1])
        picked[mine] += s[rows[mine], targets[mine] - start]
    return np.log(total) + top - picked


# %% [solution online]
import numpy as np


def online_attention(q, k_blocks, v_blocks):
    scale = 1 / np.sqrt(q.shape[-1])
    running_max = np.full((q.shape[0], 1), -np.inf)
    running_sum = np.zeros((q.shape[0], 1))
    out = np.zeros((q.shape[0], v_blocks[0].shape[-1]))
    for k, v in zip(k_blocks, v_blocks):
        scores = q @ k.T * scale
        new_max = np.maximum(running_max, scores.max(axis=1, keepdims=True))
        correction = np.exp(running_max - new_max)  # what the old terms were measured against
        weights = np.exp(scores - new_max)
        running_sum = running_sum * correction + weights.sum(axis=1, keepdims=True)
        out = out * correction + weights @ v
        running_max = new_max
    return out / running_sum


# %% [wrong online]
import numpy as np


def online_attention(q, k_blocks, v_blocks):
    scale = 1 / np.sqrt(q.shape[-1])
    running_max = np.full((q.shape[0], 1), -np.inf)
    running_sum = np.zeros((q.shape[0], 1))
    out = np.zeros((q.shape[0], v_blocks[0].shape[-1]))
    for k, v in zip(k_blocks, v_blocks):
        scores = q @ k.T * scale
        new_max = np.maximum(running_max, scores.max(axis=1, keepdims=True))
        correction = np.exp(running_max - new_max)
        weights = np.exp(scores - new_max)
        running_sum = running_sum * correction + weights.sum(axis=1, keepdims=True)
        out = out + weights @ v  # the output is not rescaled when the max grows
        running_max = new_max
    return out / running_sum


# %% [wrong online]
import numpy as np


def online_attention(q, k_blocks, v_blocks):
    scale = 1 / np.sqrt(q.shape[-1])
    out, total = 0, 0
    for k, v in zip(k_blocks, v_blocks):
        weights = np.exp(q @ k.T * scale)  # no running max: exp overflows for large scores
        total = total + weights.sum(axis=1, keepdims=True)
        out = out + weights @ v
    return out / total


# %% [wrong online]
import numpy as np


def online_attention(q, k_blocks, v_blocks):
    scale = 1 / np.sqrt(q.shape[-1])
    out = 0
    for k, v in zip(k_blocks, v_blocks):  # a softmax per block, averaged: each block weighs the same
        scores = q @ k.T * scale
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        out = out + weights / weights.sum(axis=1, keepdims=True) @ v / len(k_blocks)
    return out


# %% [solution tpbytes]
def tp_bytes_per_layer(batch, seq, hidden, tp, bytes_per_value):
    buffer = batch * seq * hidden * bytes_per_value
    return 4 * 2 * (tp - 1) / tp * buffer


# %% [wrong tpbytes]
def tp_bytes_per_layer(batch, seq, hidden, tp, bytes_per_value):
    return 2 * 2 * (tp - 1) / tp * batch * seq * hidden * bytes_per_value  # forward only


# %% [wrong tpbytes]
def tp_bytes_per_layer(batch, seq, hidden, tp, bytes_per_value):
    return 4 * batch * seq * hidden * bytes_per_value  # the buffer, not what a ring sends


# %% [solution rank4]
def mesh_rank4(dp_rank, tp_rank, pp_rank, cp_rank, dp, tp, cp):
    return ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank


# %% [wrong rank4]
def mesh_rank4(dp_rank, tp_rank, pp_rank, cp_rank, dp, tp, cp):
    return ((pp_rank * cp + cp_rank) * dp + dp_rank) * tp + tp_rank  # dp faster than cp


# %% [wrong rank4]
def mesh_rank4(dp_rank, tp_rank, pp_rank, cp_rank, dp, tp, cp):
    return (pp_rank * dp + dp_rank) * tp + tp_rank  # forgets the cp coordinate
