"""minidist: an educational, from-scratch distributed deep-learning framework.

Reading order: backend -> autograd (+ ops) -> nn -> optim -> data -> distributed -> parallel -> examples.
``minidist.distributed`` (MPI) is imported only when you use it: ``import minidist.distributed as dist``.
"""

from typing import Any

from minidist import host_memory, nn, optim  # nn and optim import minidist.autograd themselves
from minidist.autograd import Function, Tensor, is_grad_enabled, no_grad, tensor
from minidist.autograd.autocast import autocast, get_autocast_dtype, is_autocast_enabled
from minidist.random import manual_seed

# Keep the memory a step frees for the next step instead of page-faulting it in again (0.5-1 ms per
# step of the small MLP; minidist/host_memory.py says why and how to switch it off).
host_memory.keep_freed_memory()

__all__ = [
    "Function",
    "Tensor",
    "tensor",
    "no_grad",
    "is_grad_enabled",
    "manual_seed",
    "autocast",
    "is_autocast_enabled",
    "get_autocast_dtype",
    "nn",
    "optim",
    "compile",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """``__version__``, on first use: a checkout's own pyproject.toml (an editable install's metadata lags it
    until reinstalled), else the installed distribution's (``importlib.metadata`` takes ~60 ms to import).

    ``compile`` (``md.compile.Replay``), on first use too: ``minidist.compile`` sits above ``nn`` and
    ``optim`` in the layers (pyproject.toml), so the package's top, which lower layers import, must not
    import it."""
    import importlib

    if name == "compile":
        return importlib.import_module("minidist.compile")
    if name != "__version__":
        raise AttributeError(f"module 'minidist' has no attribute {name!r}")
    import pathlib
    import re

    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    text = pyproject.read_text() if pyproject.exists() else ""
    stated = re.search(r'^name = "minidist"\nversion = "(.+)"$', text, re.M)
    version = stated[1] if stated else importlib.import_module("importlib.metadata").version("minidist")
    globals()["__version__"] = version
    return version
