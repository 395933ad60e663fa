"""Optimizers: ``SGD`` and ``AdamW``, both with ``state_dict()`` / ``load_state_dict()``."""

from minidist.optim.adamw import AdamW
from minidist.optim.optimizer import Optimizer
from minidist.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "AdamW"]
