"""Layers: ``Linear``, ``Embedding``, ``LayerNorm``, the activations, ``Dropout`` and ``Sequential``."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from minidist import backend, random
from minidist.autograd import DEFAULT_DTYPE, Tensor
from minidist.memory import activations
from minidist.nn import functional as F
from minidist.nn.module import Module, Parameter
from minidist.ops.linear_relu import linear_relu


def uniform(shape: tuple[int, ...], bound: float, dtype: Any = DEFAULT_DTYPE) -> Parameter:
    """A parameter drawn from U(-bound, bound) with minidist's seeded generator (drawn on the host)."""
    values = random.generator().uniform(-bound, bound, size=shape)
    return Parameter(values.astype(dtype))


class Linear(Module):
    """y = x W^T + b, for x of shape (..., in_features); y has shape (..., out_features).

    ``weight`` has shape (out_features, in_features) and ``bias`` (out_features,), as in PyTorch,
    and both start from PyTorch's default init U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform with
    a = sqrt(5); He et al. 2015). The weight is drawn before the bias.

    Raises ``ValueError`` for non-positive sizes.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: Any = DEFAULT_DTYPE):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"Linear needs positive sizes, got in={in_features}, out={out_features}")
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight = uniform((out_features, in_features), bound, dtype)
        self.bias = uniform((out_features,), bound, dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return F.linear(x, self.weight, self.bias)

    def forward_relu(self, x: Tensor) -> Tensor:
        """relu(self(x)) as one op, bit-identical (``ops/linear_relu.py``); ``run_in_order`` uses it."""
        self._check_input(x)
        return linear_relu(x, self.weight, self.bias)

    def _check_input(self, x: Tensor) -> None:
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Linear({self.in_features}, {self.out_features}) got input of shape {x.shape}: "
                f"its last dimension must be {self.in_features}"
            )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``, looked up by integer index.

    ``weight`` (num_embeddings, embedding_dim) starts from N(0, 1), as torch's; the row
    ``padding_idx`` (if given) starts at zero and gets no gradient. Input: integer indices of any
    shape (B, T) -> (B, T, embedding_dim). Raises ``ValueError`` for non-positive sizes; lookup errors:
    :func:`minidist.nn.functional.embedding`.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        dtype: Any = DEFAULT_DTYPE,
    ):
        super().__init__()
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise ValueError(f"Embedding needs positive sizes, got {num_embeddings} x {embedding_dim}")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx must be within num_embeddings, got {padding_idx}")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        values = random.generator().standard_normal((num_embeddings, embedding_dim)).astype(dtype)
        if padding_idx is not None:
            values[padding_idx] = 0
        self.weight = Parameter(values)

    def forward(self, input: Any) -> Tensor:
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        padding = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{padding}"


class LayerNorm(Module):
    """Layer normalization over the last axes (Ba et al. 2016), as ``torch.nn.LayerNorm``.

    Input (..., *normalized_shape) -> the same shape. With ``elementwise_affine`` a ``weight`` (ones)
    and, if ``bias``, a ``bias`` (zeros) of ``normalized_shape`` are learned. Errors:
    :func:`minidist.nn.functional.layer_norm`.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...] | list[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        dtype: Any = DEFAULT_DTYPE,
    ):
        super().__init__()
        single = isinstance(normalized_shape, (int, np.integer))
        shape = (int(normalized_shape),) if single else tuple(normalized_shape)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        xp = backend.xp()
        self.weight = Parameter(xp.ones(shape, dtype=dtype)) if elementwise_affine else None
        self.bias = Parameter(xp.zeros(shape, dtype=dtype)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class ReLU(Module):
    """max(x, 0) elementwise."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class GELU(Module):
    """GELU, x Phi(x) (Hendrycks & Gimpel 2016): exact (erf) by default, as ``torch.nn.GELU``;
    ``approximate="tanh"`` for the tanh approximation (GPT-2's). Raises ``ValueError`` otherwise."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' (exact, erf) or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    """tanh(x) elementwise."""

    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Dropout(Module):
    """Zero each element with probability ``p`` in training mode (scaled by 1/(1-p)); identity in eval.

    On a tensor-parallel shard (the output of ``ColumnParallelLinear(gather_output=False)`` and what is
    computed from it) the mask differs per tp rank, drawn from the RNG tracker: seed it with
    ``minidist.parallel.tensor_parallel.model_parallel_manual_seed`` (``ops/dropout.py``).
    """

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout probability must be between 0 and 1, got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Sequential(Module):
    """Apply modules in order; submodules are named ``"0"``, ``"1"``, ... as in PyTorch."""

    def __init__(self, *modules: Module):
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential argument {i} is a {type(m).__name__}, not a Module")
            setattr(self, str(i), m)

    def forward(self, x: Any) -> Any:
        return run_in_order(list(self._modules.values()), x)

    def __getitem__(self, i: int | slice) -> Module:
        """The i-th module, or a ``Sequential`` of a slice of them (sharing the same modules)."""
        modules = list(self._modules.values())
        return Sequential(*modules[i]) if isinstance(i, slice) else modules[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


def run_in_order(modules: list[Module], x: Any) -> Any:
    """``x`` through ``modules`` in order (``Sequential`` and a pipeline stage run their layers so).

    A plain ``Linear`` followed by a plain ``ReLU`` runs as one op, ``Linear.forward_relu``
    (``ops/linear_relu.py``: bit-identical, one graph node instead of two, no second array).
    Subclasses, a ``forward`` patched on the class (a spy, a leaky ReLU), and a ``forward`` replaced on
    the instance (FSDP's units gather their parameters so) run as themselves: fusing would skip them.
    Only ``MemoryTracker``'s wrappers, which name the ops and compute nothing, may be skipped
    (``memory.activations.scope_setters``).
    """
    fused = False  # the module before was a Linear that already applied this ReLU
    for m, following in zip(modules, modules[1:] + [None]):
        if fused:
            fused = False
        elif type(m) is Linear and type(following) is ReLU and _as_defined(m, following):
            x = m.forward_relu(x)
            fused = True
        else:
            x = m(x)
    return x


# As defined at import, to see a patch: of the classes' forward, or of the functions they call (the
# fused op does not call them either).
_LINEAR_FORWARD, _RELU_FORWARD, _F_LINEAR, _F_RELU = Linear.forward, ReLU.forward, F.linear, F.relu


def _as_defined(linear: Linear, relu: ReLU) -> bool:
    """Both modules' ``forward`` are this file's, unwrapped (or wrapped only to observe), calling
    ``nn.functional``'s own ``linear`` and ``relu`` (~0.3 us a pair; fusing saves ~3 us)."""
    return (
        Linear.forward is _LINEAR_FORWARD
        and ReLU.forward is _RELU_FORWARD
        and F.linear is _F_LINEAR
        and F.relu is _F_RELU
        and _unwrapped(linear)
        and _unwrapped(relu)
    )


def _unwrapped(m: Module) -> bool:
    replaced = m.__dict__.get("forward")
    return replaced is None or replaced in activations.scope_setters
