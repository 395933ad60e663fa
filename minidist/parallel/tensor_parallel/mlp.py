"""``ParallelMLP``: Megatron-LM's tensor-parallel MLP block (Shoeybi et al. 2019, §3, eq. 3-4, Fig. 3a).

``y = act(x A^T + a) B^T + b`` with A (hidden, in) split by columns and B (out, hidden) by rows::

    x (replicated) --f--> [x A_r^T + a_r] --act--> [dropout] --> [h_r B_r^T] --g--> + b --> y (replicated)
                          column parallel          sharded       row parallel

Because the activation is applied elementwise, ``act`` of the column layer's slice is the slice of
``act`` of the whole: no communication is needed between the two layers. The block costs one
all-reduce forward (g) and one backward (f), of activations of size batch x out / in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minidist.autograd import DEFAULT_DTYPE, Tensor
from minidist.distributed.comm import Communicator
from minidist.nn import functional as F
from minidist.nn.module import Module
from minidist.parallel.agreed import agreed_arguments
from minidist.parallel.tensor_parallel import checks
from minidist.parallel.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from minidist.parallel.tensor_parallel.random import get_rng_tracker

# "gelu" is exact (erf), as torch.nn.GELU(); "gelu_tanh" is GELU(approximate="tanh").
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "tanh": F.tanh,
}


class ParallelMLP(Module):
    """Column-parallel ``in_features -> hidden_features``, activation, row-parallel ``-> out_features``.

    Input (..., in_features) and output (..., out_features), both the same on every rank of ``group``;
    the hidden activations (..., hidden_features / n) stay sharded. Parameters are named ``fc1.*`` and
    ``fc2.*`` and start equal to a dense ``Linear(in, hidden)``, ``Linear(hidden, out)`` pair built
    from the same seed. ``dropout`` > 0 zeroes hidden activations in training with a different mask
    per tp rank (the RNG tracker's generator; seed it with ``model_parallel_manual_seed``).

    Collective: every rank of ``group`` must build it with the same arguments, compared at construction
    in one small all-gather (``checks/``); then the ranks adopt the first rank's generator state, so a
    per-rank seed still builds one block (``layers.py``). Raises, on every rank of ``group``:
    ``TypeError`` for a size that is not an int (NumPy integers are fine), a ``bias`` that is not a bool
    or a ``group`` that is not a Communicator; ``ValueError`` for a size < 1,
    ``hidden_features`` not divisible by the group size, an unknown ``activation`` (one of
    ``"relu"``, ``"gelu"`` (exact), ``"gelu_tanh"``, ``"tanh"``), a dropout outside [0, 1], or ranks
    that passed different arguments.
    """

    @agreed_arguments(checks.mlp(ACTIVATIONS))
    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: int | None = None,
        bias: bool = True,
        activation: str = "relu",
        dropout: float = 0.0,
        group: Communicator | None = None,
        dtype: Any = DEFAULT_DTYPE,
    ) -> None:
        super().__init__()
        self.activation, self.dropout = activation, dropout  # agreed with the sizes (checks.mlp)
        with checks.already_agreed():  # one collective for the block, not one more per layer
            self.fc1 = ColumnParallelLinear(
                in_features, hidden_features, bias, group, gather_output=False, dtype=dtype
            )
            self.fc2 = RowParallelLinear(
                hidden_features, out_features, bias, group, input_is_parallel=True, dtype=dtype
            )

    def forward(self, x: Tensor) -> Tensor:
        h = ACTIVATIONS[self.activation](self.fc1(x))  # (..., hidden / n), sharded
        if self.training and self.dropout > 0.0:
            with get_rng_tracker().fork():  # sharded activations: an independent mask per tp rank
                h = F.dropout(h, self.dropout, True)
        return self.fc2(h)

    def extra_repr(self) -> str:
        return f"activation={self.activation}, dropout={self.dropout}"
