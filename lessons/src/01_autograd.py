"""Lesson 01 source (percent format); `python lessons/build.py` turns it into 01_autograd.ipynb."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 01 — Autograd from scratch
#
# **Learning goals.** After this lesson you can
# 1. build the computation graph of an expression and say what each node stores;
# 2. run backward by hand: visit nodes in reverse topological order and apply the chain rule;
# 3. check any gradient against central finite differences, and pick the step size.
#
# Everything in minidist's training loop rests on `loss.backward()`. We rebuild its core in 40 lines
# (a scalar version of `minidist/autograd/`, in the spirit of micrograd), then check minidist itself.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np

import minidist as md
from minidist_course.notebook import checks

# %% [markdown]
# ## 1. The graph
#
# A `Value` holds a number, its gradient, and *how it was made*: its parents and a function that,
# given the output's gradient, adds the local derivative times that gradient into the parents'
# (the vector-Jacobian product). For `tanh` we use a numerical slope for now; section 3 asks you for
# the formula.


# %%
class Value:
    def __init__(self, data, parents=(), op="", label=""):
        self.data, self.grad = float(data), 0.0
        self.parents, self.op, self.label = parents, op, label  # label: a name for the drawing only
        self._backward = lambda: None

    def __add__(self, other):
        out = Value(self.data + other.data, (self, other), "+")

        def backward():  # d(a+b)/da = d(a+b)/db = 1
            self.grad += out.grad
            other.grad += out.grad

        out._backward = backward
        return out

    def __mul__(self, other):
        out = Value(self.data * other.data, (self, other), "*")

        def backward():  # d(ab)/da = b, d(ab)/db = a
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad

        out._backward = backward
        return out

    def tanh(self):
        out = Value(math.tanh(self.data), (self,), "tanh")

        def backward():
            self.grad += numeric_tanh_backward(out.data, out.grad)

        out._backward = backward
        return out

    def backward(self):
        # Reverse topological order: a node runs its backward only after every node that used it.
        order, seen = [], set()

        def visit(v):
            if id(v) not in seen:
                seen.add(id(v))
                for p in v.parents:
                    visit(p)
                order.append(v)

        visit(self)
        self.grad = 1.0
        for v in reversed(order):
            v._backward()


# A stand-in for the formula you write in section 3: the slope of tanh at x = atanh(out), measured
# numerically. It comes from minidist, so that this notebook holds no answer to an exercise.
numeric_tanh_backward = checks.stand_in("tanh_backward")


# %% [markdown]
# One neuron: `y = tanh(w1*x1 + w2*x2 + b)`. Let us draw its graph: every box is a `Value` (blue: a
# leaf, named; yellow: the result of an op), arrows point from inputs to the op that used them.

# %%
x1, x2 = Value(0.5, label="x1"), Value(-1.0, label="x2")
w1, w2, b = Value(2.0, label="w1"), Value(0.3, label="w2"), Value(0.1, label="b")
y = (w1 * x1 + w2 * x2 + b).tanh()
y.backward()


def draw(root):
    """Draw the graph with matplotlib, the output on the right. A node's column is its longest distance
    from the output, so every arrow points right; leaves take one row each, in the order a depth-first
    walk meets them, and an op sits at the mean height of its inputs: no two boxes overlap, and inputs
    sit next to the op that uses them."""
    column, row, nodes = {}, {}, []

    def place_columns(v, distance):  # distance from the output: the longest path, so arrows point right
        if column.get(id(v), -1) < distance:
            column[id(v)] = distance
            for p in v.parents:
                place_columns(p, distance + 1)

    def place_rows(v):  # leaves one row each, in depth-first order; an op at the mean row of its inputs
        if id(v) in row:
            return
        for p in v.parents:
            place_rows(p)
        if v.parents:
            row[id(v)] = sum(row[id(p)] for p in v.parents) / len(v.parents)
        else:
            row[id(v)] = sum(1 for n in nodes if not n.parents)  # the next free leaf row
        nodes.append(v)

    place_columns(root, 0)
    place_rows(root)
    width, height = max(column.values()), max(row.values())
    pos = {id(v): (width - column[id(v)], height - row[id(v)]) for v in nodes}  # first leaf on top
    fig, ax = plt.subplots(figsize=(1.9 * (width + 1), 0.8 * (height + 1) + 0.6))
    for v in nodes:
        for p in v.parents:
            ax.annotate(
                "",
                pos[id(v)],
                pos[id(p)],
                arrowprops={"arrowstyle": "->", "color": "gray", "shrinkA": 24, "shrinkB": 24},
            )
    for v in nodes:
        name = v.label if not v.parents else v.op
        ax.text(
            *pos[id(v)],
            f"{name}\ndata {v.data:.3f}\ngrad {v.grad:.3f}",
            ha="center",
            va="center",
            fontsize=8,
            bbox={"boxstyle": "round", "fc": "lightyellow" if v.parents else "lightblue"},
        )
    ax.set_xlim(-0.5, width + 0.5)
    ax.set_ylim(-0.6, height + 0.6)
    ax.axis("off")
    ax.set_title("computation graph of y = tanh(w1*x1 + w2*x2 + b), after y.backward()")
    plt.show()


draw(y)

# %% [markdown]
# ## 2. The same thing in minidist
#
# `minidist.Tensor` does the same with arrays: each op is a `Function` (`minidist/ops/`) with `forward`
# and `backward` side by side, and `Tensor.backward()` walks the graph in a topological order found
# without recursion (so a chain of 50,000 ops works). Same neuron, same numbers:

# %%
t = {
    k: md.tensor(np.array(v.data), dtype=np.float64, requires_grad=True)
    for k, v in dict(x1=x1, x2=x2, w1=w1, w2=w2, b=b).items()
}
ty = (t["w1"] * t["x1"] + t["w2"] * t["x2"] + t["b"]).tanh()
ty.backward()
for k, v in dict(x1=x1, x2=x2, w1=w1, w2=w2, b=b).items():
    print(f"d y / d {k}:  ours {v.grad:+.6f}   minidist {float(t[k].grad):+.6f}")
    assert abs(v.grad - float(t[k].grad)) < 1e-8  # 1e-8: the stand-in tanh_backward is numerical

# %% [markdown]
# ## 3. Your turn: the derivative of tanh
#
# Replace the numerical stand-in by the formula. `tanh_backward(out, out_grad)` receives the op's
# *output* `out = tanh(x)` and the gradient flowing into it, and returns the gradient for `x`.
# Hint: d tanh(x)/dx can be written with `out` alone, which is why autograd engines save the
# output rather than the input for this op.


# %% [exercise tanh]
def tanh_backward(out, out_grad):
    raise NotImplementedError  # your code here


# %% [check tanh]
checks.tanh_backward(tanh_backward)

# %% [markdown]
# ## 4. Finite differences: trust, but verify
#
# A gradient formula can be wrong in a way no type checker sees. The cure is to compare it with the
# slope measured numerically: `(f(x + eps) - f(x - eps)) / (2 eps)`, one coordinate at a time. This
# *central* difference has an error of order eps² (the one-sided `(f(x + eps) - f(x)) / eps` only
# eps), so it agrees with a correct gradient to many digits — in float64.
#
# **Your turn:** write `numerical_grad(f, x, eps)`: `f` maps a float64 vector to a float, return the
# vector of partial derivatives at `x` (and leave `x` as you found it).


# %% [exercise numgrad]
def numerical_grad(f, x, eps=1e-6):
    raise NotImplementedError  # your code here


# %% [check numgrad]
checks.numerical_grad(numerical_grad)


# %% [markdown]
# Now use it on a real minidist model. We flatten one weight matrix of a small MLP into a vector,
# so `f` changes only that matrix and returns the loss. (If your `numerical_grad` is not done yet this
# cell uses minidist's stand-in, `checks.stand_in("numerical_grad")`, so the notebook still runs.)

# %%
try:
    numerical_grad(lambda v: 0.0, np.zeros(1), 1e-6)
    ngrad = numerical_grad
except NotImplementedError:
    ngrad = checks.stand_in("numerical_grad")

md.manual_seed(0)
rng = np.random.default_rng(0)
model = md.nn.Sequential(md.nn.Linear(4, 8), md.nn.Tanh(), md.nn.Linear(8, 3))
for p in model.parameters():
    p.data = p.data.astype(np.float64)  # float32 would drown the comparison in rounding noise
xs = md.tensor(rng.standard_normal((16, 4)), dtype=np.float64)
ys = rng.integers(0, 3, 16)
W = model[0].weight


def loss_of(w_flat):
    W.data = w_flat.reshape(W.shape)
    with md.no_grad():
        return float(md.nn.functional.cross_entropy(model(xs), ys).data)


w0 = W.data.copy()
md.nn.functional.cross_entropy(model(xs), ys).backward()
analytic = W.grad.ravel().copy()
numeric = ngrad(loss_of, w0.ravel().copy(), 1e-6)
W.data = w0
print("max |analytic - numeric| =", np.max(np.abs(analytic - numeric)))

# %% [markdown]
# ### How small should eps be?
#
# Too large: the eps² truncation error dominates. Too small: `f(x + eps) - f(x - eps)` cancels almost
# all digits and the rounding error (about 1e-16 · |f| / eps) dominates. The sweet spot for float64 is
# near eps ≈ 1e-5 .. 1e-6 — which is why gradient checks run in float64, never float32.

# %%
central = checks.stand_in("numerical_grad")  # minidist's, so a slip in yours cannot bend the curve
eps_values = np.logspace(-12, -1, 23)
errors = [np.max(np.abs(central(loss_of, w0.ravel().copy(), e) - analytic)) for e in eps_values]
W.data = w0
plt.figure(figsize=(6, 3.5))
plt.loglog(eps_values, errors, "o-")
plt.xlabel("eps")
plt.ylabel("max |numeric - analytic|")
plt.title("central differences: rounding error (left) vs truncation error (right)")
plt.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# ## Summary
# - An autograd engine is a graph of ops, each knowing its local derivative, visited in reverse
#   topological order; gradients of a tensor used twice are *summed*.
# - Always check new ops against central differences in float64 — minidist's
#   `tests/ops/test_gradcheck.py` does it for every op, on shapes chosen by hypothesis.
#
# Next: [lesson 02](02_mpi.ipynb) starts several processes and makes them talk.
