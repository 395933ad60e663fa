"""Reference answers (and wrong answers the checks must reject) for lesson 01. See lessons/README.md."""
# ruff: noqa: E402, F811


# %% [solution tanh]
def tanh_backward(out, out_grad):
    return (1 - out**2) * out_grad


# %% [wrong tanh]
def tanh_backward(out, out_grad):
    return 1 - out**2  # forgets the chain rule's out_grad


# %% [wrong tanh]
def tanh_backward(out, out_grad):
    return (1 - out) * out_grad


# %% [solution numgrad]
import numpy as np


def numerical_grad(f, x, eps=1e-6):
    g = np.zeros_like(x, dtype=float)
    for i in range(x.size):
        old = x[i]
        x[i] = old + eps
        up = f(x)
        x[i] = old - eps
        down = f(x)
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


# %% [wrong numgrad]
import numpy as np


def numerical_grad(f, x, eps=1e-6):  # one-sided: error O(eps)
    g = np.zeros_like(x, dtype=float)
    fx = f(x)
    for i in range(x.size):
        old = x[i]
        x[i] = old + eps
        g[i] = (f(x) - fx) / eps
        x[i] = old
    return g


# %% [wrong numgrad]
import numpy as np


def numerical_grad(f, x, eps=1e-6):  # forgets to restore x
    g = np.zeros_like(x, dtype=float)
    for i in range(x.size):
        x[i] += eps
        up = f(x)
        x[i] -= 2 * eps
        g[i] = (up - f(x)) / (2 * eps)
    return g
