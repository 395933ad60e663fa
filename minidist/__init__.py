"""minidist: an educational, from-scratch distributed deep-learning framework.

Reading order: backend -> autograd (+ ops) -> nn -> optim -> data -> distributed -> parallel -> examples.
``minidist.distributed`` (MPI) is imported only when you use it: ``import minidist.distributed as dist``.
"""

from minidist import nn, optim  # nn and optim import minidist.autograd themselves
from minidist.autograd import Function, Tensor, is_grad_enabled, no_grad, tensor
from minidist.random import manual_seed

__version__ = "0.1.0"

__all__ = [
    "Function",
    "Tensor",
    "tensor",
    "no_grad",
    "is_grad_enabled",
    "manual_seed",
    "nn",
    "optim",
    "__version__",
]
