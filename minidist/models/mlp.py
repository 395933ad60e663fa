"""``MLP``: the multilayer perceptron of ``examples/train_mlp.py``, dense or tensor-parallel.

**Layout under tensor parallelism** (tp > 1), following Megatron-LM (Shoeybi et al. 2019, §3): the
linear layers are taken in pairs, column-parallel then row-parallel, so that the activation between
them stays sharded and each pair costs one all-reduce forward and one backward. For 64-256-256-10::

    0: ColumnParallelLinear(64, 256)   1: ReLU   2: RowParallelLinear(256, 256)   3: ReLU   4: Linear(256, 10)
       out axis split (256/tp each)       sharded    in axis split, all-reduce        replicated  replicated

With an odd number of linear layers the last one has no partner and stays an ordinary, replicated
``Linear``: it is the small classifier head (its 10 outputs need not divide by tp), its input is the
replicated output of a row-parallel layer, so every tp rank computes it, and its gradient, alike.
Only the hidden sizes a column-parallel layer produces (the 1st, 3rd, ... hidden layer) must be
divisible by tp. With tp = 1 (or no mesh) every layer is a plain ``Linear``: the model is
identical, number for number, to the dense one.

The model is a flat ``nn.Sequential`` whose parameter names ("0.weight", "2.bias", ...) are the
same for every tp, which lets checkpoints map shards to global names, and lets a pipeline cut it
between any two layers.

**Activation recomputation** (``recompute=True``; Chen et al. 2016, §3): each hidden block (a linear
layer and its ReLU) runs through ``minidist.nn.recompute``, which keeps only the block's
input and recomputes its pre-activation in backward: one extra forward of the hidden layers for
less activation memory. Values and gradients are the same, bit for bit. The names and the layers are
unchanged (the option only changes ``forward``), so checkpoints load either way. ``PipelineParallel``
runs a stage's layers itself, not this ``forward``, so there the option would have no effect.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import DEFAULT_DTYPE
from minidist.nn.layers import Linear, ReLU, Sequential
from minidist.nn.module import Module
from minidist.nn.recompute import recompute as recompute_block


class MLP(Sequential):
    """Linear -> ReLU -> ... -> Linear with sizes ``[n_in, *hidden, n_out]``; see the module docstring.

    Args:
        n_in: input features.
        hidden: hidden widths, a sequence of ints (possibly empty).
        n_out: output classes.
        mesh: a ``minidist.parallel.ProcessMesh``; its ``tp_group`` shards the layers when ``mesh.tp > 1``.
        dtype: parameter dtype.
        recompute: recompute each hidden block's activations in backward instead of storing them.

    Input (batch, n_in), output (batch, n_out), both replicated across the tp group. Initialisation
    draws from minidist's generator in the same order for every tp, so the same seed gives the same
    model. Collective only in forward/backward, not in construction.

    Raises ``ValueError`` (identically on every rank) if a size is < 1 or a column-parallel hidden size
    is not divisible by ``mesh.tp``, naming the size and the layer.
    """

    def __init__(
        self,
        n_in: int,
        hidden: list[int],
        n_out: int,
        mesh: Any = None,
        dtype: Any = DEFAULT_DTYPE,
        recompute: bool = False,
    ):
        sizes = [n_in, *hidden, n_out]
        if min(sizes) < 1:
            raise ValueError(f"MLP sizes must be >= 1, got n_in={n_in}, hidden={list(hidden)}, n_out={n_out}")
        tp = 1 if mesh is None else mesh.tp
        for j in range(0, len(hidden), 2):  # the outputs of the column-parallel layers
            if hidden[j] % tp:
                raise ValueError(
                    f"MLP: hidden size {hidden[j]} (hidden layer {j + 1} of {list(hidden)}) is not divisible "
                    f"by tp={tp}; with tensor parallelism the 1st, 3rd, ... hidden layers are split into tp "
                    "equal slices, so choose sizes divisible by tp"
                )
        layers: list[Module] = []
        n_linear = len(sizes) - 1
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(_linear(i, n_linear, a, b, mesh, dtype))
            if i < n_linear - 1:
                layers.append(ReLU())
        super().__init__(*layers)
        self.recompute = bool(recompute)

    def forward(self, x: Any) -> Any:
        """(batch, n_in) -> (batch, n_out) logits; with ``recompute``, block by block (module docstring)."""
        if not self.recompute:
            return super().forward(x)
        layers = list(self)
        # Blocks (linear, ReLU) = layers (0, 1), (2, 3), ...; the head, layers[-1], produces the logits
        # that the loss keeps anyway, so recomputing it would only cost time.
        for linear, relu in zip(layers[:-1:2], layers[1::2]):
            x = recompute_block(_block, linear, relu, x)
        return layers[-1](x)


def _block(linear: Module, relu: Module, x: Any) -> Any:
    return relu(linear(x))


def _linear(i: int, n_linear: int, a: int, b: int, mesh: Any, dtype: Any) -> Module:
    """The i-th linear layer: column (even i with a partner), row (odd i), else a replicated Linear."""
    if mesh is None or mesh.tp == 1 or (i % 2 == 0 and i == n_linear - 1):
        return Linear(a, b, dtype=dtype)
    # Imported here so that a dense MLP needs neither MPI nor the parallel package.
    from minidist.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    if i % 2 == 0:
        return ColumnParallelLinear(a, b, group=mesh.tp_group, gather_output=False, dtype=dtype)
    return RowParallelLinear(a, b, group=mesh.tp_group, input_is_parallel=True, dtype=dtype)
