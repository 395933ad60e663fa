"""Reference answers (and wrong answers the checks must reject) for lesson 10. See lessons/README.md."""
# ruff: noqa: E402, F811

# %% [solution layernorm]
import numpy as np


def layer_norm_backward(x, gamma, dy, eps=1e-5):
    centred = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + eps)
    xhat = centred * rstd
    g = dy * gamma  # dL/dxhat
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), np.sum(dy, axis=0)


# %% [wrong layernorm]
import numpy as np


def layer_norm_backward(x, gamma, dy, eps=1e-5):  # forgets that sigma depends on x
    centred = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + eps)
    xhat = centred * rstd
    g = dy * gamma
    dx = rstd * (g - g.mean(axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), np.sum(dy, axis=0)


# %% [wrong layernorm]
import numpy as np


def layer_norm_backward(x, gamma, dy, eps=1e-5):  # treats mu and sigma as constants
    centred = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + eps)
    return dy * gamma * rstd, np.sum(dy * centred * rstd, axis=0), np.sum(dy, axis=0)


# %% [wrong layernorm]
import numpy as np


def layer_norm_backward(x, gamma, dy, eps=1e-5):  # the sum over the row where the mean belongs
    centred = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + eps)
    xhat = centred * rstd
    g = dy * gamma
    dx = rstd * (g - g.sum(axis=-1, keepdims=True) - xhat * np.sum(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), np.sum(dy, axis=0)


# %% [solution params]
def count_parameters(config):
    V, T, L, C = config.vocab_size, config.block_size, config.n_layer, config.n_embd
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return V * C + T * C + L * per_block + 2 * C


# %% [wrong params]
def count_parameters(config):  # counts the head's weight although it is the token embedding's
    V, T, L, C = config.vocab_size, config.block_size, config.n_layer, config.n_embd
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return 2 * V * C + T * C + L * per_block + 2 * C


# %% [wrong params]
def count_parameters(config):  # forgets the biases and the LayerNorms
    V, T, L, C = config.vocab_size, config.block_size, config.n_layer, config.n_embd
    return V * C + T * C + L * 12 * C * C


# %% [solution flops]
def count_flops(config):
    V, T, L, C = config.vocab_size, config.block_size, config.n_layer, config.n_embd
    per_block = 2 * (3 * C * C) + 2 * (C * C) + 2 * (4 * C * C) * 2 + 2 * (T * C) * 2
    forward = L * per_block + 2 * C * V
    return 3 * forward


# %% [wrong flops]
def count_flops(config):  # the forward pass only
    V, T, L, C = config.vocab_size, config.block_size, config.n_layer, config.n_embd
    return L * (24 * C * C + 4 * T * C) + 2 * C * V


# %% [wrong flops]
def count_flops(config):  # forgets attention's two products against the T keys
    V, L, C = config.vocab_size, config.n_layer, config.n_embd
    return 3 * (L * 24 * C * C + 2 * C * V)


# %% [wrong flops]
def count_flops(config):  # one FLOP per multiply-add
    V, T, L, C = config.vocab_size, config.block_size, config.n_layer, config.n_embd
    return 3 * (L * (12 * C * C + 2 * T * C) + C * V)
