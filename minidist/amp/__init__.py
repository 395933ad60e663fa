"""Automatic mixed precision (as ``torch.amp``): ``autocast`` and ``GradScaler``.

``autocast`` lives in ``minidist/autograd/autocast.py`` (the ops consult it, so it sits at their
layer); ``GradScaler`` here, one layer above ``distributed``, which it uses when given a ``group``.
docs/mixed-precision.md explains both.
"""

from minidist.amp.grad_scaler import GradScaler
from minidist.autograd.autocast import autocast, get_autocast_dtype, is_autocast_enabled

__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_enabled"]
