"""Optimizers (``SGD``, ``AdamW``, with parameter groups and ``state_dict()``) and ``lr_scheduler``."""

from minidist.optim import lr_scheduler
from minidist.optim.adamw import AdamW
from minidist.optim.optimizer import Optimizer
from minidist.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "AdamW", "lr_scheduler"]
